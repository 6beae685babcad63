"""The local trainer's set-up phases (``build_trainer``): a start that fails after the env pool's workers are up stops
them, as a start refused after the run directory's claim releases the directory."""

from __future__ import annotations

import multiprocessing

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("mmrl.envs.alfworld")

from mmrl.run.run_dir import RunDir  # noqa: E402
from mmrl.trainer.local import build_trainer  # noqa: E402

AGENT = "embedded:tiny-qwen2-agent"


def env_workers() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("mmrl-env-worker")]


def test_a_start_that_fails_after_the_env_pool_stops_its_workers(tmp_path, small_config, monkeypatch):
    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunDir, "record_config", disk_full)  # the last write of the set-up: config.json
    cfg = small_config(tmp_path, **{"task.name": "alfworld", "model.name": AGENT, "rollout.env_workers": 1,
                                    "task.n_per_type": 1, "task.n_eval_per_type": 1, "task.max_steps": 3,
                                    "rollout.max_episode_tokens": 2048})
    before = set(env_workers())  # pools of other tests' trainers may still run in this process
    with pytest.raises(OSError, match="No space left"):
        build_trainer(cfg)
    left = [process for process in env_workers() if process not in before]
    for process in left:  # stopped here so that a failure of this test leaves nothing running either
        process.kill()
        process.join(timeout=5)
    assert not left
