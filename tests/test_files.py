"""Whole-file rewrites of a run's logs are atomic: a full disk (or a kill) during the rewrite leaves the old file."""

from __future__ import annotations

import errno
import io
import json
import os

import pytest


class FullDisk:
    """A file opened for writing on a disk that fills up after a few bytes."""

    def __init__(self, raw):
        self.raw, self.written = raw, 0

    def write(self, text):
        self.written += len(text)
        if self.written > 8:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.raw.write(text)

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.raw.close()


@pytest.mark.parametrize("log", ["metrics", "samples"])
def test_rewriting_a_runs_log_on_resume_never_leaves_it_half_written(tmp_path, monkeypatch, log):
    """The resume rewrite keeps the lines before the checkpoint's step; a full disk during it leaves the old file."""
    from mmrl.run.metrics import MetricsLog
    from mmrl.samples import RunSamples

    path = tmp_path / f"{log}.jsonl"
    before = "".join(json.dumps({"step": s, "note": "x" * 40}) + "\n" for s in range(5))
    path.write_text(before)
    real_open = open

    def full_disk_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        writes_here = isinstance(file, int) or str(file).startswith(str(tmp_path))  # an int: an os.open'ed file
        return FullDisk(handle) if "w" in mode and writes_here else handle

    monkeypatch.setattr("builtins.open", full_disk_open)
    monkeypatch.setattr(io, "open", full_disk_open)
    with pytest.raises(OSError):
        MetricsLog(path, resume_step=3) if log == "metrics" else RunSamples(tmp_path, resume_step=3)
    monkeypatch.undo()
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left behind
    MetricsLog(path, resume_step=3) if log == "metrics" else RunSamples(tmp_path, resume_step=3)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [0, 1, 2]


def test_a_temporary_left_by_a_killed_rewrite_is_recognised_by_its_name(tmp_path):
    from mmrl.files import is_temporary_of

    assert is_temporary_of(".config.json.0a1b2c3d.tmp", "config.json")
    assert not is_temporary_of(".config.json.tmp", "config.json")
    assert not is_temporary_of(".config.json.0a1b2c3d.tmp", "metrics.jsonl")


def test_an_exclusive_write_keeps_whatever_is_already_there(tmp_path):
    from mmrl.files import atomic_write_text

    atomic_write_text(tmp_path / "new.txt", "written", replace=False)
    assert (tmp_path / "new.txt").read_text() == "written"
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere.txt")
    for name in ("new.txt", "dangling"):
        with pytest.raises(FileExistsError):
            atomic_write_text(tmp_path / name, "again", replace=False)
    assert (tmp_path / "new.txt").read_text() == "written" and not (tmp_path / "nowhere.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "new.txt"]  # no temporary file left
