"""Files from disk are data, never code: a crafted run directory cannot run anything through mmrl.eval or --resume,
an older mmrl's pickled checkpoint gets one line and a converter that reads it through torch's restricted loader,
and no ``torch.load`` in the repository unpickles freely."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mmrl.batch import Response
from mmrl.convert_checkpoint import convert_run
from mmrl.rewards.base import RewardResult
from mmrl.run.checkpoint import LEGACY_STATE, LegacyCheckpoint, load_latest
from mmrl.run.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


class RunsCode:
    """Unpickling this creates ``marker``: what a malicious ``state.pt`` would do with a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def legacy_run(run: Path, step: int, model: object) -> Path:
    """A run directory as an older mmrl left it: config.json and ``step_*/state.pt`` with its SHA-256 beside it."""
    cfg = TrainConfig()
    cfg.run.out_dir = str(run)
    folder = run / "checkpoints" / f"step_{step:07d}"
    folder.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    np.random.seed(7)
    state = {"model": model, "step": step, "optimizer": {}, "sampler": {"rng": random.Random(1).getstate(),
                                                                          "order": [2, 0, 1], "pos": 1},
             "history": {0: [Response([5, 6], "six", RewardResult(1.0, None, {"accuracy": np.float64(1.0)}))]},
             "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}}
    torch.save(state, folder / LEGACY_STATE)
    (folder / "state.sha256").write_text(hashlib.sha256((folder / LEGACY_STATE).read_bytes()).hexdigest() + "\n")
    return folder


def run_module(module: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", module, *argv], env=env, capture_output=True, text=True, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return errors[0]


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_crafted_state_pt_runs_nothing_and_gets_one_line(tmp_path, command):
    marker = tmp_path / "code-ran"
    run = tmp_path / "shared-run"
    legacy_run(run, 1, RunsCode(marker))
    if command == "eval":
        proc = run_module("mmrl.eval", "--model", str(run), "--max-problems", "1")
    else:
        proc = run_module("mmrl.train", "--out", str(run), "--resume", "--run.progress", "false")
    line = one_error_line(proc)
    assert not marker.exists()
    assert "older mmrl" in line and "python -m mmrl.convert_checkpoint" in line and str(run) in line
    assert (run / "checkpoints" / "step_0000001" / LEGACY_STATE).is_file()  # not set aside, renamed or removed


def test_an_older_checkpoint_is_converted_through_the_restricted_loader(tmp_path):
    run = tmp_path / "run"
    folder = legacy_run(run, 2, {"w": torch.arange(6.0)})
    with pytest.raises(LegacyCheckpoint):
        load_latest(run)
    assert convert_run(run) == [folder]
    path, state, skipped = load_latest(run)
    assert path == folder and not skipped and state["step"] == 2
    assert torch.equal(state["model"]["w"], torch.arange(6.0))
    assert state["history"][0][0]["reward"]["components"] == {"accuracy": 1.0}
    np.random.seed(7)
    assert state["rng"]["numpy"][1] == np.random.get_state()[1].tolist()
    assert (folder / LEGACY_STATE).is_file()  # the user's file stays
    assert convert_run(run) == []  # nothing left to convert


def test_the_converter_keeps_a_file_at_a_name_it_would_write(tmp_path):
    """An older mmrl wrote only state.pt and state.sha256: a SHA256SUMS beside them is the user's (an archive's
    checksum list), and that folder is not converted. What a conversion killed before its state.json left is the
    conversion's own, and a rerun finishes it."""
    run = tmp_path / "run"
    first = legacy_run(run, 1, {"w": torch.zeros(2)})
    second = legacy_run(run, 2, {"w": torch.ones(2)})
    (second / "SHA256SUMS").write_text("mine")
    with pytest.raises(ValueError, match=r"step_0000002/SHA256SUMS is not an older mmrl checkpoint's file .*"
                                         r"step_0000002 was not converted"):
        convert_run(run)
    assert (second / "SHA256SUMS").read_text() == "mine" and not (second / "state.json").exists()
    (first / "state.json").unlink()  # the first conversion, killed before its last file
    (second / "SHA256SUMS").unlink()
    assert convert_run(run) == [first, second]
    assert load_latest(run)[0] == second


def test_the_converter_refuses_a_crafted_state_pt_without_running_it(tmp_path):
    marker = tmp_path / "code-ran"
    run = tmp_path / "run"
    legacy_run(run, 1, RunsCode(marker))
    proc = run_module("mmrl.convert_checkpoint", str(run))
    line = one_error_line(proc)
    assert not marker.exists() and "not converted" in line and "nothing in it was run" in line
    assert not (run / "checkpoints" / "step_0000001" / "state.json").exists()


def torch_loads(path: Path) -> list[tuple[int, str]]:
    """(line, source) of each ``torch.load(...)`` call in a Python file."""
    tree = ast.parse(path.read_text(), str(path))
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"]


def test_every_torch_load_in_the_repository_is_weights_only():
    unsafe, found = [], 0
    for folder in ("mmrl", "benchmarks", "examples", "tests", "docs", "docker"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix == ".py":
                calls = torch_loads(path)
            elif path.suffix in (".md", ".sh", ".ipynb", ".txt"):
                text = path.read_text(errors="replace")
                calls = [(text.count("\n", 0, m.start()) + 1, m.group(0))
                         for m in re.finditer(r"torch\.load\([^)]*\)", text)]
            else:
                continue
            found += len(calls)
            unsafe += [f"{path.relative_to(ROOT)}:{line}: {call}" for line, call in calls
                       if not re.search(r"weights_only\s*=\s*True", call)]
    assert found, "the scan found no torch.load at all: it is not looking where the code is"
    assert not unsafe, unsafe


def test_a_deepspeed_checkpoint_is_read_weights_only_and_a_crafted_one_runs_nothing(tmp_path):
    """The openrlhf backend's ``--resume``: a real ZeRO-2 bf16 checkpoint, written and read back through mmrl's
    strategy (tests/deepspeed_checkpoint.py, in a process of its own), and copies with code put into one file each.
    DeepSpeed's own loader runs that code (so the crafted files are live); mmrl's load refuses them in one line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "deepspeed_checkpoint.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["restored"] == {"client_state": 1, "weights": True, "exp_avg": True}
    # the third save past ckpt.max_num 2 removed the first tag's states only: the user's folder and file stay
    states = ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "metric.json", "mp_rank_00_model_states.pt"]
    assert report["rotated"] == ["analysis/plot.txt", "global_step1/eval.json",
                                 *(f"global_step{step}/{name}" for step in (2, 3) for name in states), "latest",
                                 "zero_to_fp32.py"]
    assert report["fp16_scaler"]  # the loss scaler of an fp16 run reads back too
    for kind, name in (("model", "mp_rank_00_model_states.pt"),
                       ("optimizer", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")):
        outcome = report[kind]
        assert outcome["deepspeed_ran_code"], outcome  # after mmrl's refusal: torch.load is unrestricted again
        assert not outcome["mmrl_ran_code"], outcome
        line = outcome["mmrl"]
        assert "\n" not in line and "nothing in it was run" in line, line
        assert line.startswith(str(tmp_path / f"crafted_{kind}" / "global_step1" / name)), line


def test_a_user_error_inside_a_ray_actor_reaches_the_user_as_its_one_line():
    from openrlhf_stubs import openrlhf_importable
    from ray.exceptions import RayTaskError

    from mmrl.errors import UserError

    with openrlhf_importable():
        from mmrl.openrlhf.driver import actor_errors
    inner = RayTaskError("init_model_from_pretrained", "Traceback (most recent call last):\n  ...",
                         UserError("checkpoint x: refused")).as_instanceof_cause()
    outer = RayTaskError("fit", "Traceback (most recent call last):\n  ...", inner).as_instanceof_cause()
    for raised in (inner, outer):
        with pytest.raises(UserError) as caught, actor_errors():
            raise raised
        assert str(caught.value) == "checkpoint x: refused" and not isinstance(caught.value, RayTaskError)
    for bug in (RuntimeError("boom"), ValueError("a bug, not bad input")):  # anything else keeps Ray's report
        with pytest.raises(RayTaskError), actor_errors():
            raise RayTaskError("fit", "Traceback ...", bug).as_instanceof_cause()
