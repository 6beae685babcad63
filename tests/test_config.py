"""Config: defaults < YAML < flags; bad names and values fail at start with one line naming the field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mmrl.train import parse_config
from mmrl.trainer.config import TrainConfig, apply_overrides, validate


def test_precedence_defaults_yaml_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo: {name: gvpo, beta: 0.2}\nrollout: {temperature: 0.7, samples_per_prompt: 4}\n"
                    "task: {name: arithmetic, max_operand: 5}\n")
    cfg = parse_config(["--config", str(path), "--rollout.temperature", "0.9", "--algo.beta", "5e-2"])
    assert cfg.algo.name == "gvpo" and cfg.algo.params == {"beta": 0.05}
    assert cfg.rollout.temperature == 0.9 and cfg.rollout.samples_per_prompt == 4
    assert cfg.task.options == {"max_operand": 5}
    assert cfg.optim.lr == TrainConfig().optim.lr


def test_shortcuts():
    cfg = parse_config(["--algo", "gpg", "--task", "arithmetic", "--model", "some/dir", "--steps", "3", "--resume",
                        "--out", "x"])
    assert (cfg.algo.name, cfg.model.name, cfg.run.steps, cfg.run.resume, cfg.run.out_dir) == \
        ("gpg", "some/dir", 3, True, "x")


@pytest.mark.parametrize("overrides,message", [
    ({"rollout.temprature": 1}, "unknown field 'rollout.temprature' (did you mean 'temperature'?)"),
    ({"rolout.temperature": 1}, "unknown field 'rolout.temperature' (did you mean 'rollout'?)"),
    ({"optim.lr": "fast"}, "optim.lr must be a number, got 'fast'"),
    ({"run.steps": 2.5}, "run.steps must be an integer"),
    ({"run.plot": "maybe"}, "run.plot must be true or false"),
])
def test_bad_fields_name_themselves(overrides, message):
    with pytest.raises(ValueError) as err:
        apply_overrides(TrainConfig(), overrides, "test")
    assert message in str(err.value)


@pytest.mark.parametrize("field,value,message", [
    ("rollout.top_p", 0.0, "rollout.top_p must be in (0, 1]"),
    ("optim.minibatches", 99, "optim.minibatches must be between 1"),
    ("rollout.replay_historical", 2, "needs --algo gvpo"),
    ("model.dtype", "float8", "model.dtype must be"),
])
def test_validation(field, value, message):
    cfg = TrainConfig()
    apply_overrides(cfg, {field: value}, "test")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(cfg)


def test_cli_error_is_one_line_and_exit_code_2():
    proc = subprocess.run([sys.executable, "-m", "mmrl.train", "--algo", "ppo", "--steps", "1"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: unknown algorithm 'ppo'; choose one of: cw_grpo, dr_grpo, "
                                                "gmpo, gpg, grpo, gvpo"]


def test_help_lists_algorithms_and_tasks():
    proc = subprocess.run([sys.executable, "-m", "mmrl.train", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for name in ("grpo", "dr_grpo", "gpg", "gvpo", "gmpo", "cw_grpo", "arithmetic", "math", "--rollout.temperature"):
        assert name in proc.stdout


def test_resume_starts_from_the_runs_saved_config(tmp_path):
    import json

    from mmrl.trainer.config import apply_overrides

    run = tmp_path / "run"
    run.mkdir()
    saved = TrainConfig()
    apply_overrides(saved, {"algo.name": "gvpo", "algo.beta": 0.3, "task.max_operand": 5, "optim.lr": 5e-4,
                            "run.steps": 10}, "test")
    (run / "config.json").write_text(json.dumps(saved.to_dict(), default=str))
    cfg = parse_config(["--out", str(run), "--resume", "--steps", "20"])
    assert (cfg.algo.name, cfg.algo.params, cfg.task.options, cfg.optim.lr) == ("gvpo", {"beta": 0.3},
                                                                               {"max_operand": 5}, 5e-4)
    assert cfg.run.steps == 20 and cfg.run.resume
