"""Checkpoints: an unreadable newest checkpoint falls back to the newest intact one,
half-written folders are removed at start, a failed write (disk full) is one line and leaves nothing behind, a
second SIGTERM exits 143 (after the checkpoint write it arrives in, never tearing it), and the stop message names
the checkpoint to resume from."""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from mmrl.errors import RunError
from mmrl.files import file_sha256
from mmrl.run import checkpoint
from mmrl.run.checkpoint import load_checkpoint, load_latest, save_checkpoint
from mmrl.run.run_dir import claim, local_latest
from mmrl.train import parse_config


def two_checkpoints(run_dir):
    for step in (1, 2):
        save_checkpoint(run_dir, step, {"model": {"w": torch.full((64,), float(step))}}, keep=2)
    return sorted((run_dir / "checkpoints").glob("step_*"))


@pytest.mark.parametrize("name", [checkpoint.TENSORS, checkpoint.STATE])
@pytest.mark.parametrize("damage", ["truncate", "bitflip", "empty"])
def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage, name):
    first, newest = two_checkpoints(tmp_path)
    data = bytearray((newest / name).read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "bitflip":
        data[len(data) // 2] ^= 0x10
    else:
        data = bytearray()
    (newest / name).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checkpoint .*step_0000002 is damaged"):
        load_checkpoint(newest)
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        path, state, skipped = load_latest(tmp_path)
    assert path == first and state["step"] == 1 and skipped == [newest]
    assert "falling back to the previous checkpoint" in caplog.text


def test_no_intact_checkpoint_is_one_line(tmp_path):
    for path in two_checkpoints(tmp_path):
        (path / checkpoint.TENSORS).write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(ValueError, match="none of its 2 checkpoints can be read"):
        load_latest(tmp_path)


def test_resume_falls_back_and_sets_the_damaged_checkpoint_aside(tmp_path, embedded_model_dir, small_config):
    from mmrl.trainer.local import build_trainer

    trainer = build_trainer(small_config(tmp_path, **{"run.checkpoint_every": 1}))
    trainer.run()
    run = trainer.run_dir
    newest = run / "checkpoints" / "step_0000002" / checkpoint.TENSORS
    newest.write_bytes(newest.read_bytes()[:1000])
    from mmrl.eval import model_from_run

    _, evaluated, state = model_from_run(str(run))  # mmrl.eval on the run: the intact step 1
    assert evaluated.name == "step_0000001" and state["step"] == 1
    resumed = build_trainer(small_config(tmp_path, **{"run.checkpoint_every": 1, "run.resume": True}))
    assert resumed.step == 1
    assert (run / "checkpoints" / "unreadable-step_0000002").is_dir()
    resumed.run()
    assert load_latest(run)[1]["step"] == 2


def test_leftover_partial_writes_are_removed_at_start(tmp_path, caplog):
    cfg = parse_config(["--out", str(tmp_path / "run")])
    first = claim(cfg)  # a run killed while writing its second checkpoint
    first.record_config(cfg, step=0)
    first.record(save_checkpoint(tmp_path / "run", 1, {"model": {"w": torch.zeros(4)}}, keep=2))
    first.lock.release()
    root = tmp_path / "run" / "checkpoints"
    partial = Path(tempfile.mkdtemp(dir=root, prefix=checkpoint.PARTIAL_PREFIX))
    (partial / checkpoint.TENSORS).write_bytes(b"half")
    # what only looks like one stays: a user's folder of that prefix, and a write's name holding a user's file
    notes = root / ".tmp-notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    mixed = Path(tempfile.mkdtemp(dir=root, prefix=checkpoint.PARTIAL_PREFIX))
    (mixed / checkpoint.TENSORS).write_bytes(b"half")
    (mixed / "mine.txt").write_text("mine")
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        claim(parse_config(["--out", str(tmp_path / "run"), "--run.overwrite", "true"])).lock.release()
    assert not partial.exists() and "a checkpoint write that never finished" in caplog.text
    assert (notes / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(mixed)) == sorted([checkpoint.TENSORS, "mine.txt"])


def test_a_users_copies_of_a_checkpoint_are_neither_pruned_nor_resumed_from(tmp_path):
    """Only ``step_<step:07d>`` folders are the run's checkpoints: a backup named otherwise keeps every file, and one
    that sorts after the newest checkpoint is not taken for it."""
    first, newest = two_checkpoints(tmp_path)
    copies = [first.with_name("step_0000001-keep"), first.with_name("step_0000001 (copy)"),
              newest.with_name("step_0000002.bak")]
    for copy in copies:
        shutil.copytree(first, copy)
    save_checkpoint(tmp_path, 3, {"model": {"w": torch.zeros(4)}}, keep=1)
    assert not first.exists() and not newest.exists()
    for copy in copies:
        assert sorted(os.listdir(copy)) == sorted(os.listdir(tmp_path / "checkpoints" / "step_0000003"))
    path, state, _ = load_latest(tmp_path)
    assert path.name == "step_0000003" and state["step"] == 3
    assert local_latest(tmp_path) == (3, path)


def test_a_checkpoint_is_never_written_through_a_link(tmp_path):
    """A link where a step's folder goes (to a folder outside the run) is refused: nothing is written through it."""
    two_checkpoints(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / checkpoint.TENSORS).write_text("USERDATA")
    (tmp_path / "checkpoints" / "step_0000003").symlink_to(outside)
    with pytest.raises(RunError, match=r"step_0000003 is a link that mmrl did not write.*nothing was written"):
        save_checkpoint(tmp_path, 3, {"model": {"w": torch.zeros(4)}}, keep=2)
    assert os.listdir(outside) == [checkpoint.TENSORS] and (outside / checkpoint.TENSORS).read_text() == "USERDATA"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step_0000001", "step_0000002", "step_0000003"]


def test_a_state_nested_too_deep_to_read_is_a_damaged_checkpoint(tmp_path, caplog):
    """Digests match (whoever wrote the folder can make them), yet the JSON cannot be read: skipped, not a crash."""
    first, newest = two_checkpoints(tmp_path)
    (newest / checkpoint.STATE).write_text("[" * 100_000 + "]" * 100_000)
    (newest / checkpoint.DIGEST).write_text("".join(f"{file_sha256(newest / n)}  {n}\n"
                                                    for n in (checkpoint.STATE, checkpoint.TENSORS)))
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        path, state, skipped = load_latest(tmp_path)
    assert path == first and skipped == [newest] and "RecursionError" in caplog.text


class FullDisk(io.FileIO):
    """A file on a disk that fills up after ``room`` bytes (the real thing is measured on a 2 MB tmpfs in
    benchmarks/faults.py)."""

    room = 4096

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_a_failed_write_says_no_space_left_and_removes_its_folder(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(4)}}, keep=2)
    monkeypatch.setattr(checkpoint, "open", lambda path, mode, buffering=-1: FullDisk(path, "wb"), raising=False)
    with pytest.raises(RunError) as err:
        save_checkpoint(tmp_path, 2, {"model": {"w": torch.zeros(100_000)}}, keep=2)
    message = str(err.value)
    assert "cannot write step 2" in message and "no space left on" in message and "\n" not in message
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_0000001"]
    monkeypatch.undo()
    assert load_latest(tmp_path)[1]["step"] == 1


def test_a_second_sigterm_exits_143(tmp_path, embedded_model_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mmrl.train", "--out", str(out), "--steps", "50", "--run.progress", "false",
           "--run.plot", "false", "--run.checkpoint_every", "0", "--rollout.prompts_per_step", "8",
           "--rollout.max_new_tokens", "32", "--model.threads", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size):
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
    assert b"Traceback" not in err
    last = err.decode().strip().splitlines()[-1]  # whether there is a checkpoint to resume from, and which
    assert "no checkpoint was written" in last or f"the last checkpoint is {out}/checkpoints/step_" in last, last


def test_a_second_signal_during_the_checkpoint_write_waits_for_the_write(tmp_path, embedded_model_dir, monkeypatch,
                                                                          small_config, caplog):
    from mmrl.errors import Interrupted
    from mmrl.trainer.local import build_trainer

    trainer = build_trainer(small_config(tmp_path, **{"run.steps": 1}))
    real_write = checkpoint.write_state

    def signalled_write(folder, state):
        os.kill(os.getpid(), signal.SIGTERM)  # the first: stop after this checkpoint
        while trainer.stop_signal is None:
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGTERM)  # the second, while the checkpoint is being written
        time.sleep(0.05)
        real_write(folder, state)

    monkeypatch.setattr(checkpoint, "write_state", signalled_write)
    with caplog.at_level(logging.WARNING, logger="mmrl"), pytest.raises(Interrupted) as stopped:
        trainer.run()
    written = trainer.run_dir / "checkpoints" / "step_0000001"
    assert stopped.value.signum == signal.SIGTERM and stopped.value.checkpoint == written
    assert load_checkpoint(written)["step"] == 1
    assert not list((trainer.run_dir / "checkpoints").glob(".tmp-*"))
    assert "is being written; stopping when it is complete" in caplog.text


def test_the_stop_message_names_the_checkpoint(tmp_path, embedded_model_dir, monkeypatch, small_config, capsys):
    from mmrl.trainer.local import Trainer, train

    real_step = Trainer.train_step

    def signalled_step(self):
        if self.step == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            while self.stop_signal is None:
                time.sleep(0.001)
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", signalled_step)
    _, trainer = train(small_config(tmp_path, **{"run.steps": 3}))
    written = trainer.run_dir / "checkpoints" / "step_0000001"
    assert trainer.step == 1 and load_checkpoint(written)["step"] == 1
    err = capsys.readouterr().err
    assert f"interrupted by signal {signal.SIGTERM} at step 1; the last checkpoint is {written}, intact" in err


def test_pruning_removes_only_the_checkpoints_files_and_names_what_it_left(tmp_path, caplog):
    """keep_checkpoints drops an old checkpoint's own files; a file the user put in its folder stays, and is named."""
    save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(4)}}, keep=1)
    step1 = tmp_path / "checkpoints" / "step_0000001"
    (step1 / "my_eval.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        save_checkpoint(tmp_path, 2, {"model": {"w": torch.ones(4)}}, keep=1)
    assert [p.name for p in step1.iterdir()] == ["my_eval.json"]
    assert f"pruned checkpoint {step1}: left my_eval.json" in caplog.text
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step_0000002"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mmrl"):  # a folder of the user's files is no longer counted
        save_checkpoint(tmp_path, 3, {"model": {"w": torch.ones(4)}}, keep=1)
    assert "my_eval.json" not in caplog.text and step1.is_dir()
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step_0000003"]


def test_a_checkpoint_written_over_a_folder_keeps_the_users_files(tmp_path):
    folder = tmp_path / "checkpoints" / "step_0000001"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    (folder / checkpoint.STATE).write_text("{}")  # a damaged earlier checkpoint of this step: replaced
    save_checkpoint(tmp_path, 1, {"model": {"w": torch.ones(4)}}, keep=2)
    expected = sorted([checkpoint.DIGEST, checkpoint.STATE, checkpoint.TENSORS, "notes.txt"])
    assert sorted(p.name for p in folder.iterdir()) == expected
    assert load_checkpoint(folder)["step"] == 1 and (folder / "notes.txt").read_text() == "mine"
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_setting_aside_twice_keeps_the_first_one(tmp_path):
    first, _ = two_checkpoints(tmp_path)
    kept = checkpoint.set_aside(first)
    (kept / "what_i_found.txt").write_text("notes")
    save_checkpoint(tmp_path, 1, {"model": {"w": torch.zeros(4)}}, keep=3)
    again = checkpoint.set_aside(first)
    assert kept.name == "unreadable-step_0000001" and again.name == "unreadable-step_0000001-2"
    assert (kept / "what_i_found.txt").read_text() == "notes" and (again / checkpoint.STATE).is_file()


def test_a_signal_during_the_final_evaluation_names_it(tmp_path, embedded_model_dir, monkeypatch, small_config,
                                                       caplog):
    """The step counter is already advanced when the final evaluation runs: no step after it is announced."""
    from mmrl.trainer.local import Trainer, train

    real_evaluate = Trainer.evaluate

    def signalled_evaluate(self, *args, **kwargs):
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            while self.stop_signal is None:
                time.sleep(0.001)
        return real_evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "evaluate", signalled_evaluate)
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        _, trainer = train(small_config(tmp_path, **{"run.steps": 1}))
    assert f"signal {signal.SIGTERM}: finishing the final evaluation (step 1), then checkpointing" in caplog.text
    assert "step 2" not in caplog.text
    assert trainer.step == 1 and load_checkpoint(trainer.run_dir / "checkpoints" / "step_0000001")["step"] == 1
    # a signal after the final evaluation (while the curves are drawn) names no step after the last either
    assert trainer.stop_message() == "step 1 was the last; finishing the run's files, then stopping"
