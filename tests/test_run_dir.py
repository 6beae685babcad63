"""Run directories are owned by one run: a lock, no writing into a foreign folder, a resume that cannot change what is
trained, and a record of what the run wrote, so that starting afresh removes only that. These checks need no model:
they run before one is loaded."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from mmrl.run.config import TrainConfig
from mmrl.run.run_dir import LOCK_NAME, RECORD_NAME, RESUMES_NAME, claim, run_owning
from mmrl.train import parse_config


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
    code = ("import sys, time; from mmrl.run.run_dir import RunLock; from pathlib import Path; "
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
    # --run.overwrite removes only what a run of ours wrote: a folder that is not one is refused all the same, and
    # the refusal does not suggest it
    with pytest.raises(ValueError, match="is not an mmrl run") as refused:
        claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    assert "overwrite" not in str(refused.value)
    assert (run / "metrics.jsonl").read_text() == '{"my": "data"}\n' and (run / "notes.txt").read_text() == "mine"


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
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1]


def test_a_start_that_fails_after_the_claim_leaves_no_lock_file(tmp_path):
    """The lock file goes when its process exits, however the start failed (only a kill -9 leaves one behind)."""
    run = tmp_path / "run"
    code = ("import sys; from mmrl.train import parse_config; from mmrl.run.run_dir import claim; "
            "owner = claim(parse_config(['--out', sys.argv[1]])); raise SystemExit(2)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, str(run)], env=env, capture_output=True, timeout=120)
    assert done.returncode == 2 and run.is_dir() and not (run / LOCK_NAME).exists()


def test_logger_files_belong_to_the_run():
    """TensorBoard event files and the W&B folder written by --run.tensorboard / --run.wandb are the run's own, not a
    user's files (a later run into the folder must not call it foreign)."""
    from mmrl.run.run_dir import is_run_file

    assert is_run_file("events.out.tfevents.1732300000.host.1234.0")
    assert is_run_file("wandb") and is_run_file("wandb_run_id") and is_run_file("metrics.jsonl")
    assert not is_run_file("notes.txt") and not is_run_file("events.txt")


def written_run(run_dir, steps=(1, 2), **flags) -> None:
    """A run as the local trainer leaves it: its record, config.json, metrics, samples, an event file and checkpoints
    (written through the claim, as build_trainer and Trainer.run write them)."""
    cfg = parse_config(["--out", str(run_dir), *[x for k, v in flags.items() for x in (f"--{k}", str(v))]])
    owner = claim(cfg)
    owner.clear_previous()
    owner.record_config(cfg, step=0)
    owner.record("metrics.jsonl", "samples.jsonl", "events.out.tfevents.1.host.1.0")
    for name in ("metrics.jsonl", "samples.jsonl", "events.out.tfevents.1.host.1.0"):
        (run_dir / name).write_text("{}\n")
    for step in steps:
        folder = run_dir / "checkpoints" / f"step_{step:07d}"
        folder.mkdir(parents=True)
        (folder / "state.pt").write_bytes(b"")
        owner.record(folder, prune=folder.parent)
    owner.lock.release()


def test_overwrite_removes_only_what_the_run_recorded_and_names_what_it_left(tmp_path, caplog):
    run = tmp_path / "run"
    written_run(run)
    (run / "notes.txt").write_text("mine")  # the user's, beside the run
    (run / "events.out.tfevents.9.mine").write_text("my own events")
    (run / "checkpoints" / "best.txt").write_text("keep me")
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        claim(parse_config(["--out", str(run)]))
    cfg = parse_config(["--out", str(run), "--run.overwrite", "true"])
    owner = claim(cfg)
    with caplog.at_level(logging.INFO, logger="mmrl"):
        removed = owner.clear_previous()
    owner.lock.release()
    assert sorted(removed) == ["checkpoints/step_0000001", "checkpoints/step_0000002", "config.json",
                               "events.out.tfevents.1.host.1.0", "metrics.jsonl", "samples.jsonl"]
    assert sorted(p.name for p in run.iterdir()) == [RECORD_NAME, "checkpoints", "events.out.tfevents.9.mine",
                                                      "notes.txt"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["best.txt"]
    left = "left checkpoints/best.txt, events.out.tfevents.9.mine, notes.txt (not written by an mmrl run)"
    assert left in caplog.text
    assert json.loads((run / RECORD_NAME).read_text())["files"] == []


def test_overwrite_leaves_a_users_file_in_a_checkpoint_folder_and_names_it(tmp_path, caplog):
    """A checkpoint folder is the run's, but a file the user put in it (an evaluation of that step) is not."""
    run = tmp_path / "run"
    written_run(run)
    (run / "checkpoints" / "step_0000001" / "mine.txt").write_text("mine")
    owner = claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    with caplog.at_level(logging.INFO, logger="mmrl"):
        removed = owner.clear_previous()
    owner.lock.release()
    assert "checkpoints/step_0000001" in removed and not (run / "checkpoints" / "step_0000002").exists()
    assert [p.name for p in (run / "checkpoints" / "step_0000001").iterdir()] == ["mine.txt"]
    assert "left checkpoints/step_0000001/mine.txt (not written by an mmrl run)" in caplog.text


def test_a_fresh_run_refuses_to_replace_a_file_its_record_does_not_name(tmp_path):
    run = tmp_path / "run"
    written_run(run)
    record = json.loads((run / RECORD_NAME).read_text())
    record["files"].remove("metrics.jsonl")  # as if the user had put their own metrics.jsonl here
    (run / RECORD_NAME).write_text(json.dumps(record))
    (run / "metrics.jsonl").write_text('{"my": "data"}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl was not written by an mmrl run .* move it away"):
        claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    assert (run / "metrics.jsonl").read_text() == '{"my": "data"}\n'


def test_a_run_without_a_record_is_never_cleared(tmp_path):
    """A run written before runs kept a record: which files are its is not known, so none is removed."""
    run = tmp_path / "run"
    make_run(run)
    (run / "checkpoints" / "mine").mkdir()
    with pytest.raises(ValueError, match=rf"did not record the files it wrote \(no {RECORD_NAME}\)"):
        claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    assert (run / "checkpoints" / "mine").is_dir() and (run / "checkpoints" / "step_0000002").is_dir()
    claim(parse_config(["--out", str(run), "--resume"])).lock.release()  # it can still be resumed


def test_a_resume_adopts_the_run_it_continues(tmp_path):
    run = tmp_path / "run"
    make_run(run)
    cfg = parse_config(["--out", str(run), "--resume"])
    owner = claim(cfg)
    owner.record_config(cfg, owner.step)
    owner.lock.release()
    assert owner.step == 2
    assert json.loads((run / RECORD_NAME).read_text())["files"] == ["checkpoints/step_0000002", "config.json"]


def test_a_resume_takes_only_the_checkpoint_its_run_wrote_without_recording(tmp_path):
    """With a record, a resume adds to it only a checkpoint the run wrote but was killed before recording; files that
    merely have a run's names (a user's sft.jsonl, an event file copied in, a copy of a checkpoint folder) stay the
    user's, so that a later --run.overwrite neither removes them nor replaces them."""
    run = tmp_path / "run"
    written_run(run)
    unrecorded = run / "checkpoints" / "step_0000003"
    unrecorded.mkdir()
    (unrecorded / "state.pt").write_bytes(b"")
    shutil.copytree(run / "checkpoints" / "step_0000002", run / "checkpoints" / "step_0000002 (copy)")
    (run / "sft.jsonl").write_text('{"mine": 1}\n')
    (run / "events.out.tfevents.7.otherhost.1.0").write_text("another run's events")
    cfg = parse_config(["--out", str(run), "--resume", "--steps", "90"])
    owner = claim(cfg)
    owner.record_config(cfg, owner.step)
    owner.lock.release()
    files = json.loads((run / RECORD_NAME).read_text())["files"]
    assert "checkpoints/step_0000003" in files
    assert not {"sft.jsonl", "events.out.tfevents.7.otherhost.1.0", "checkpoints/step_0000002 (copy)"} & set(files)
    with pytest.raises(ValueError, match=r"sft.jsonl was not written by an mmrl run"):
        claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    (run / "sft.jsonl").rename(tmp_path / "sft.jsonl")
    owner = claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    owner.clear_previous()
    owner.lock.release()
    assert (run / "events.out.tfevents.7.otherhost.1.0").is_file() and not unrecorded.exists()
    assert sorted(os.listdir(run / "checkpoints" / "step_0000002 (copy)")) == ["state.pt"]


def test_pruned_checkpoints_leave_the_record(tmp_path):
    run = tmp_path / "run"
    written_run(run, steps=(1, 2, 3))
    owner = claim(parse_config(["--out", str(run), "--resume"]))
    shutil.rmtree(run / "checkpoints" / "step_0000001")  # pruned by keep_checkpoints
    (run / "checkpoints" / "step_0000004").mkdir()
    owner.record(run / "checkpoints" / "step_0000004", prune=run / "checkpoints")
    owner.lock.release()
    files = json.loads((run / RECORD_NAME).read_text())["files"]
    assert [f for f in files if f.startswith("checkpoints/")] == [f"checkpoints/step_000000{i}" for i in (2, 3, 4)]


def test_resume_of_a_finished_run_says_so(tmp_path, embedded_model_dir, small_config):
    """Told once the newest intact checkpoint is loaded: a damaged one at run.steps is skipped, and that run is not
    finished (tests/test_checkpoints.py)."""
    from mmrl.trainer.local import build_trainer

    build_trainer(small_config(tmp_path, **{"run.steps": 1})).run()
    with pytest.raises(ValueError, match=r"is finished \(its last checkpoint, .*step_0000001.* is at step 1 of "
                                         r"run.steps 1\); pass --steps N with N > 1"):
        build_trainer(small_config(tmp_path, **{"run.steps": 1, "run.resume": True}))
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert build_trainer(small_config(tmp_path, **{"run.steps": 2, "run.resume": True})).step == 1


@pytest.mark.parametrize("mode,who", [(0o777, "every user"), (0o1777, "every user"), (0o775, "its group")])
def test_an_out_others_can_write_is_refused(tmp_path, mode, who):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(ValueError, match=rf"can be written by {who} \(mode {mode:o}\).*a new folder inside it"):
        claim(parse_config(["--out", str(shared)]))
    owner = claim(parse_config(["--out", str(shared / "run")]))  # a folder of one's own inside it is fine
    owner.lock.release()
    assert (shared / "run").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("umask,mode", [(0o000, 0o755), (0o002, 0o755), (0o077, 0o700)])
def test_folders_a_run_creates_are_writable_by_its_user_alone(tmp_path, umask, mode):
    """Whatever the umask: the run's folder and the folders created above it get no group or other write bit (others
    could replace the run's files), and a stricter umask stays as strict."""
    previous = os.umask(umask)
    try:
        owner = claim(parse_config(["--out", str(tmp_path / "a" / "b" / "run")]))
    finally:
        os.umask(previous)
    owner.lock.release()
    for folder in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "run"):
        assert folder.stat().st_mode & 0o777 == mode, folder


def test_the_shared_tmp_itself_is_refused():
    with pytest.raises(ValueError, match="can be written by every user"):
        claim(parse_config(["--out", tempfile.gettempdir()]))


def test_an_out_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, os.geteuid() + 4242, -1)  # the tests run as root; any other uid is "another user"
    with pytest.raises(ValueError, match=rf"belongs to another user \(uid {os.geteuid() + 4242}\)"):
        claim(parse_config(["--out", str(theirs)]))


def test_an_out_under_a_file_or_in_proc_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"run.out_dir .*/file/run: .*/file is a file, not a folder"):
        claim(parse_config(["--out", str(tmp_path / "file" / "run")]))
    with pytest.raises(ValueError, match=r"run.out_dir /proc/mmrl-run cannot be created"):
        claim(parse_config(["--out", "/proc/mmrl-run"]))
    with pytest.raises(ValueError, match="is not an mmrl run"):
        claim(parse_config(["--out", "/proc"]))


def test_a_refused_claim_leaves_no_new_folder(tmp_path):
    with pytest.raises(ValueError, match="has no checkpoint"):
        claim(parse_config(["--out", str(tmp_path / "new" / "run"), "--resume"]))
    assert list(tmp_path.iterdir()) == []


def test_a_runs_own_files_are_known_as_its_own(tmp_path):
    run = tmp_path / "run"
    written_run(run)
    assert run_owning(run / "config.json") == run and run_owning(run / "checkpoints" / "step_0000002") == run
    assert run_owning(run / "wandb_run_id") == run  # a name a run writes, recorded or not
    assert run_owning(run / "eval.json") is None and run_owning(tmp_path / "config.json") is None


def test_a_crafted_record_cannot_remove_anything_outside_the_folder(tmp_path):
    """A shared or downloaded run folder decides what --run.overwrite removes through its record: never a path
    outside it, not by '..', an absolute path or a folder replaced by a symlink."""
    victim = tmp_path / "victim"
    (victim / "step_0000001").mkdir(parents=True)
    (victim / "keep.txt").write_text("mine")
    run = tmp_path / "run"
    written_run(run)
    for entry in ("../victim", str(victim / "keep.txt")):
        (run / RECORD_NAME).write_text(json.dumps({"files": ["config.json", entry]}))
        with pytest.raises(ValueError, match="which is not a path inside the folder"):
            claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    (run / "extra").symlink_to(victim)  # extra/keep.txt now leads into the victim folder
    record = {"files": ["config.json", "metrics.jsonl", "samples.jsonl", "extra/keep.txt", "checkpoints/step_0000001",
                        "checkpoints/step_0000002"]}
    (run / RECORD_NAME).write_text(json.dumps(record))
    owner = claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    owner.clear_previous()
    owner.lock.release()
    assert (victim / "keep.txt").read_text() == "mine" and not (run / "config.json").exists()
    written_run(run)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(victim)  # checkpoints/step_0000001 would be the victim's
    record = json.loads((run / RECORD_NAME).read_text())
    (run / RECORD_NAME).write_text(json.dumps({"files": record["files"] + ["checkpoints/step_0000001"]}))
    with pytest.raises(ValueError, match="checkpoints was not written by an mmrl run"):
        claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    assert (victim / "step_0000001").is_dir()


def test_a_start_refused_after_the_folder_was_cleared_leaves_nothing(tmp_path):
    """A fresh run writes its record when it clears the folder; a refusal after that (the SFT warm-up's, with no
    demonstration won) removes it with the folders the claim made."""
    owner = claim(parse_config(["--out", str(tmp_path / "new" / "run")]))
    owner.clear_previous()
    assert (tmp_path / "new" / "run" / RECORD_NAME).is_file()
    owner.abandon()
    assert list(tmp_path.iterdir()) == []


def test_a_refused_start_into_an_earlier_runs_folder_keeps_its_record(tmp_path):
    run = tmp_path / "run"
    written_run(run)
    owner = claim(parse_config(["--out", str(run), "--run.overwrite", "true"]))
    owner.clear_previous()
    owner.abandon()
    assert json.loads((run / RECORD_NAME).read_text())["files"] == []  # still a run's folder, not a foreign one


def test_a_refusal_late_in_the_set_up_leaves_no_folder(tmp_path, embedded_model_dir, small_config, monkeypatch):
    from mmrl.errors import UserError
    from mmrl.trainer import local

    def refuse(*args, **kwargs):
        raise UserError("task 'x': no expert demonstration was won; cannot warm up")

    monkeypatch.setattr(local, "_setup_reference", refuse)  # the first phase after the folder is cleared
    with pytest.raises(ValueError, match="cannot warm up"):
        local.build_trainer(small_config(tmp_path))
    assert list(tmp_path.iterdir()) == []
