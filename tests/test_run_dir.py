"""Run directories are owned by one run (issue #15 cases 1, 2, 6): a lock, no writing into a foreign folder, and a
resume that cannot change what is trained. These checks need no model: they run before one is loaded."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from mmrl.train import parse_config
from mmrl.trainer.config import TrainConfig
from mmrl.trainer.run_dir import LOCK_NAME, RESUMES_NAME, claim


def make_run(run_dir, **sections) -> TrainConfig:
    """A finished-looking run: an mmrl config.json and one checkpoint folder."""
    cfg = TrainConfig()
    cfg.run.out_dir = str(run_dir)
    for key, value in sections.items():
        section, _, field = key.partition("__")
        setattr(getattr(cfg, section), field, value)
    (run_dir / "checkpoints" / "step_0000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_0000002" / "state.json").write_bytes(b"")
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    return cfg


def test_a_second_run_into_the_same_out_is_refused(tmp_path):
    first = claim(parse_config(["--out", str(tmp_path / "run"), "--run.seed", "1"]))
    with pytest.raises(ValueError, match=rf"is in use by process {os.getpid()}"):
        claim(parse_config(["--out", str(tmp_path / "run"), "--run.seed", "2"]))
    first.lock.release()
    claim(parse_config(["--out", str(tmp_path / "run")])).lock.release()  # free again once the first run ends


def test_a_lock_held_by_another_process_names_its_pid(tmp_path):
    run = tmp_path / "run"
    code = ("import sys, time; from mmrl.trainer.run_dir import RunLock; from pathlib import Path; "
            "lock = RunLock(Path(sys.argv[1])); lock.acquire(); print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=rf"in use by process {holder.pid}"):
            claim(parse_config(["--out", str(run)]))
    finally:
        holder.kill()
        holder.wait()
    claim(parse_config(["--out", str(run)])).lock.release()  # the kernel dropped the dead holder's lock


def test_a_stale_lock_file_is_taken_over_with_a_note(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text("999999999\n")  # left by a run killed with SIGKILL
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        owner = claim(parse_config(["--out", str(run)]))
    assert "taking over the lock of process 999999999" in caplog.text
    assert (run / LOCK_NAME).read_text().strip() == str(os.getpid())
    owner.lock.release()
    assert not (run / LOCK_NAME).exists()


def test_a_folder_that_is_not_an_mmrl_run_is_not_overwritten(tmp_path):
    run = tmp_path / "mine"
    run.mkdir()
    (run / "config.json").write_text('{"learning_rate": 3}')
    (run / "metrics.jsonl").write_text('{"my": "data"}\n')
    with pytest.raises(ValueError, match="is not empty and is not an mmrl run"):
        claim(parse_config(["--out", str(run)]))
    (run / "config.json").unlink()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"not an mmrl run \(it holds notes.txt\)"):
        claim(parse_config(["--out", str(run)]))
    assert (run / "metrics.jsonl").read_text() == '{"my": "data"}\n'
    claim(parse_config(["--out", str(run), "--run.overwrite", "true"])).lock.release()


def test_files_that_only_share_a_runs_names_are_not_a_run(tmp_path):
    """A user's own metrics.jsonl / samples.jsonl / checkpoints/.tmp-x are neither overwritten nor removed, by a fresh
    run or by a resume: a run's directory holds mmrl's config.json (or the lock of a run killed before writing it)."""
    run = tmp_path / "mine"
    (run / "checkpoints" / ".tmp-mine").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"my": "data"}\n')
    (run / "samples.jsonl").write_text("mine\n")
    for flags in ([], ["--resume"]):
        with pytest.raises(ValueError, match="is not empty and is not an mmrl run"):
            claim(parse_config(["--out", str(run), *flags]))
    assert (run / "metrics.jsonl").read_text() == '{"my": "data"}\n' and (run / "checkpoints" / ".tmp-mine").is_dir()


def test_a_task_option_saved_as_a_number_resumes_with_the_same_flag(tmp_path):
    """Runs saved before task options kept their text hold ``max_operand: 5``; repeating ``--task.max_operand 5`` on
    a resume is no change, while another value still is."""
    run = tmp_path / "run"
    make_run(run, task__name="arithmetic", task__options={"max_operand": 5})
    same = ["--out", str(run), "--resume", "--task", "arithmetic", "--task.max_operand", "5"]
    claim(parse_config(same)).lock.release()
    with pytest.raises(ValueError, match="--resume cannot change task.max_operand"):
        claim(parse_config(["--out", str(run), "--resume", "--task", "arithmetic", "--task.max_operand", "6"]))


def test_resume_refuses_a_change_of_what_is_trained(tmp_path):
    run = tmp_path / "run"
    make_run(run, algo__name="grpo")
    saved = (run / "config.json").read_text()
    for flags, field in ((["--algo", "gvpo"], "algo.name"), (["--task", "countdown"], "task.name"),
                         (["--optim.lr", "0.5"], "optim.lr"), (["--algo.clip_low", "0.3"], "algo.clip_low"),
                         (["--run.seed", "3"], "run.seed")):
        with pytest.raises(ValueError, match=rf"--resume cannot change {field} "):
            claim(parse_config(["--out", str(run), "--resume", *flags]))
    assert (run / "config.json").read_text() == saved


def test_resume_allows_and_records_safe_changes_without_rewriting_the_config(tmp_path, caplog):
    run = tmp_path / "run"
    make_run(run)
    saved = (run / "config.json").read_text()
    cfg = parse_config(["--out", str(run), "--resume", "--steps", "90", "--run.eval_every", "5"])
    with caplog.at_level(logging.INFO, logger="mmrl"):
        owner = claim(cfg)
    assert "run.steps changed from 60 to 90" in caplog.text
    owner.record_config(cfg, step=2)
    owner.lock.release()
    assert (run / "config.json").read_text() == saved
    [entry] = [json.loads(x) for x in (run / RESUMES_NAME).read_text().splitlines()]
    assert entry["step"] == 2 and entry["changed"] == {"run.eval_every": [0, 5], "run.steps": [60, 90]}
    # The next resume starts from the recorded values: no flags needed, nothing to refuse.
    again = parse_config(["--out", str(run), "--resume"])
    assert again.run.steps == 90 and again.run.eval_every == 5
    claim(again).lock.release()


def test_two_trainings_at_once_from_the_command_line(tmp_path, embedded_model_dir):
    """Case 1 end to end: while one run trains, a second into the same --out stops at start with one line."""
    from mmrl.trainer.local import build_trainer

    flags = ["--out", str(tmp_path / "run"), "--rollout.prompts_per_step", "2", "--rollout.samples_per_prompt", "2",
             "--run.progress", "false", "--run.plot", "false", "--steps", "1"]
    trainer = build_trainer(parse_config(flags))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    second = subprocess.run([sys.executable, "-m", "mmrl.train", *flags, "--run.seed", "2"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 2
    assert second.stderr.strip().splitlines()[-1].startswith("error: run.out_dir")
    assert "in use by process" in second.stderr and "Traceback" not in second.stderr
    trainer.run()
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [0]


def test_a_start_that_fails_after_the_claim_leaves_no_lock_file(tmp_path):
    """The lock file goes when its process exits, however the start failed (only a kill -9 leaves one behind)."""
    run = tmp_path / "run"
    code = ("import sys; from mmrl.train import parse_config; from mmrl.trainer.run_dir import claim; "
            "owner = claim(parse_config(['--out', sys.argv[1]])); raise SystemExit(2)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, str(run)], env=env, capture_output=True, timeout=120)
    assert done.returncode == 2 and run.is_dir() and not (run / LOCK_NAME).exists()


def test_logger_files_belong_to_the_run():
    """TensorBoard event files and the W&B folder written by --run.tensorboard / --run.wandb are the run's own, not a
    user's files (a later run into the folder must not call it foreign)."""
    from mmrl.trainer.run_dir import is_run_file

    assert is_run_file("events.out.tfevents.1732300000.host.1234.0")
    assert is_run_file("wandb") and is_run_file("wandb_run_id") and is_run_file("metrics.jsonl")
    assert not is_run_file("notes.txt") and not is_run_file("events.txt")
