"""TensorBoard and W&B loggers of the local trainer, and the same choices as OpenRLHF 0.11.2's --logger.* flags."""

from __future__ import annotations

import os
import sys

import pytest

from mmrl.openrlhf.args import LaunchInputs, build_flags, to_argv
from mmrl.run.loggers import OPENRLHF_WANDB_KEY, scalars
from mmrl.run.metrics import read_metrics
from mmrl.train import parse_config
from mmrl.trainer.local import build_trainer


def read_event_scalars(run_dir) -> dict[str, dict[int, float]]:
    """Every scalar in the run directory's event files, read back by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_scalars_are_the_finite_numbers_of_a_record():
    record = {"step": 3, "reward": 0.5, "updates": 1, "top_zero_reason": "wrong", "kl_init": float("nan"),
              "moe/expert_load": [[0.5, 0.5]], "accuracy": None, "flag": True}
    assert scalars(record) == {"reward": 0.5, "updates": 1.0}


def test_tensorboard_event_files_hold_the_metrics_jsonl_scalars(tmp_path, embedded_model_dir, small_config):
    cfg = small_config(tmp_path, **{"run.tensorboard": True, "run.steps": 3, "run.eval_every": 2})
    trainer = build_trainer(cfg)
    trainer.run()
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    assert list(trainer.run_dir.glob("events.out.tfevents.*")), "event files go beside metrics.jsonl"
    logged = read_event_scalars(trainer.run_dir)
    expected: dict[str, dict[int, float]] = {}
    for record in records:
        for key, value in scalars(record).items():
            expected.setdefault(key, {})[record["step"]] = value
    assert "eval/pass@1" in expected and "reward" in expected and len(expected["reward"]) == 3
    assert set(logged) == set(expected)
    for key, by_step in expected.items():
        assert logged[key] == pytest.approx(by_step, rel=1e-6, abs=1e-6), key


def test_resume_continues_the_event_log_and_overwrite_replaces_it(tmp_path, embedded_model_dir, small_config):
    first = build_trainer(small_config(tmp_path, **{"run.tensorboard": True, "run.steps": 2,
                                                    "run.checkpoint_every": 1}))
    first.run()
    resumed = build_trainer(small_config(tmp_path, **{"run.tensorboard": True, "run.steps": 3, "run.resume": True}))
    resumed.run()
    assert sorted(read_event_scalars(first.run_dir)["reward"]) == [1, 2, 3]
    fresh = build_trainer(small_config(tmp_path, **{"run.tensorboard": True, "run.steps": 1, "run.overwrite": True}))
    fresh.run()
    assert sorted(read_event_scalars(fresh.run_dir)["reward"]) == [1]  # the replaced run's events are gone


def test_wandb_logs_offline_with_the_run_config(tmp_path, embedded_model_dir, small_config, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # never online from a test, logged in or not
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = small_config(tmp_path, **{"run.wandb": "mmrl-test", "run.steps": 1, "run.eval_every": 0,
                                    "cluster.extra": {"logger.wandb.key": "SEKRET-123"}})
    # W&B stores the command line with the run: as a user typed it, credentials included
    argv = ["mmrl/train.py", "--cluster.extra", '{"logger.wandb.key": "SEKRET-123"}', "--cluster.ray_address",
            "ray://alice:PW-999@head:10001"]
    monkeypatch.setattr(sys, "argv", list(argv))
    trainer = build_trainer(cfg)
    trainer.run()
    assert sys.argv == argv
    import wandb

    wandb.teardown()  # the run's records reach its file from W&B's service process, after finish() has returned
    run_id = (trainer.run_dir / "wandb_run_id").read_text().strip()
    runs = list((trainer.run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(runs) == 1
    # The offline run file is a log of protobuf records (wandb 0.31 ships no Python reader for it); config items and
    # history keys are stored as plain strings in it.
    data = runs[0].read_bytes()
    assert b"mmrl-test" in data
    for item in (b'"prompts_per_step":4', b'"name":"grpo"', b'"wandb":"mmrl-test"', b'"name":"arithmetic"',
                 b'"logger.wandb.key":"***"'):
        assert item in data, item  # the run's config sections are the W&B config, credentials masked
    assert b"SEKRET-123" not in data and b"PW-999" not in data
    assert b'{"logger.wandb.key": "***"}' in data and b"ray://alice:***@head:10001" in data  # the masked command line
    for key in scalars(read_metrics(trainer.run_dir / "metrics.jsonl")[0]):
        assert key.encode() in data, key
    # a fresh run over this one removes W&B's run folders and links, and keeps a user's file beside them
    (trainer.run_dir / "wandb" / "my-notes.txt").write_text("mine")
    build_trainer(small_config(tmp_path, **{"run.steps": 1, "run.eval_every": 0, "run.overwrite": True})).run()
    assert [p.name for p in (trainer.run_dir / "wandb").iterdir()] == ["my-notes.txt"]
    assert not (trainer.run_dir / "wandb_run_id").exists()


def test_openrlhf_gets_the_same_logger_choices():
    from mmrl.openrlhf.cli import parse_openrlhf_args

    inputs = LaunchInputs("m", "train.jsonl", "", "reward.py", "", train_rows=40)
    small = ["--backend", "openrlhf", "--cluster.nodes", "1", "--cluster.gpus_per_node", "2",
             "--cluster.vllm_engines", "2", "--rollout.prompts_per_step", "4", "--rollout.samples_per_prompt", "4"]
    quiet, _ = parse_openrlhf_args(to_argv(build_flags(parse_config(small), inputs, 0.0, "/runs/x")))
    assert quiet.logger.tensorboard_dir is None and not quiet.logger.wandb.key  # OpenRLHF's loggers stay off
    loud = parse_config([*small, "--run.tensorboard", "true", "--run.wandb", "proj"])
    args, _ = parse_openrlhf_args(to_argv(build_flags(loud, inputs, 0.0, "/runs/x")))
    assert args.logger.tensorboard_dir == "/runs/x/tensorboard"
    assert (args.logger.wandb.project, args.logger.wandb.run_name) == ("proj", "x")
    assert args.logger.wandb.key == OPENRLHF_WANDB_KEY  # a marker, never a real key (see openrlhf_flags)


def test_a_wandb_key_given_as_a_flag_never_reaches_the_openrlhf_run_config(tmp_path, monkeypatch):
    """OpenRLHF's W&B logger records every argument as the run's config; the key given in ``cluster.extra`` moves
    into WANDB_API_KEY of the trainer's process first, and the config holds ``***``."""
    pytest.importorskip("wandb")
    from openrlhf.utils.logging_utils import WandbLogger

    from mmrl.openrlhf.args import hide_wandb_key, merge_extra
    from mmrl.openrlhf.cli import parse_openrlhf_args

    for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_DIR", str(tmp_path))):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_API_KEY", "")  # recorded, so that the key hide_wandb_key sets is undone after the test
    monkeypatch.delenv("WANDB_API_KEY")
    inputs = LaunchInputs("m", "train.jsonl", "", "reward.py", "", train_rows=40)
    cfg = parse_config(["--backend", "openrlhf", "--cluster.gpus_per_node", "2", "--cluster.vllm_engines", "2",
                        "--rollout.prompts_per_step", "4", "--run.wandb", "proj"])
    flags = merge_extra(build_flags(cfg, inputs, 0.0, str(tmp_path / "run")), {"logger.wandb.key": "SEKRET-123"})
    args, _ = parse_openrlhf_args(to_argv(flags))
    assert args.logger.wandb.key == "SEKRET-123"
    hide_wandb_key(args)
    assert args.logger.wandb.key == "***" and os.environ["WANDB_API_KEY"] == "SEKRET-123"
    logger = WandbLogger(args)  # OpenRLHF's own, as its PPOTrainer builds it
    logger.handle.finish()
    import wandb

    wandb.teardown()
    data = b"".join(f.read_bytes() for f in tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert b"proj" in data and b"SEKRET-123" not in data
    hide_wandb_key(args)  # again (a restarted actor): nothing changes
    assert args.logger.wandb.key == "***" and os.environ["WANDB_API_KEY"] == "SEKRET-123"


def test_a_one_step_run_still_gets_its_curves(tmp_path):
    """A one-step run (here a grounding one, whose step-0 evaluation has no pass@1) has one point per metric: it is
    plotted, not skipped while the run says it wrote curves.png. A metric constant over several points is left out."""
    from mmrl.run.metrics import plot_curves

    records = [{"step": 0, "eval/miou": 0.3}, {"step": 1, "reward": 0.5, "accuracy": 0.25, "kl_old": 0.0}]
    assert plot_curves(records, tmp_path / "one.png") == tmp_path / "one.png"
    assert (tmp_path / "one.png").stat().st_size > 1000
    constant = [{"step": s, "kl_old": 0.0} for s in (1, 2, 3)]
    assert plot_curves(constant, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
