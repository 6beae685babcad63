"""The shared cache: a target is built once even when several processes ask for it at the same moment (parallel test
workers and runs side by side start on an empty cache), a failed build leaves nothing behind, and the root is found
from the environment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mmrl.cache import build_once, cache_root

# Each process records that it built, then takes long enough that the others are all waiting before it finishes.
BUILDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from mmrl.cache import build_once

    target, log = Path(sys.argv[1]), Path(sys.argv[2])

    def build(directory):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.0)
        (directory / "weights").write_text(str(os.getpid()))
        (directory / "DONE").write_text("")

    print(build_once(target, build, "DONE").joinpath("weights").read_text())
""")


def test_processes_that_ask_at_once_share_one_build(tmp_path):
    target, log = tmp_path / "cache" / "model-v1", tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(target), str(log)], stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    builders = log.read_text().split()
    assert len(builders) == 1, f"built {len(builders)} times"
    assert outputs == [builders[0]] * 4  # every process read the one result
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".building")] == []


def test_a_failed_build_leaves_nothing_and_the_next_call_builds(tmp_path):
    target = tmp_path / "model-v1"

    def broken(directory: Path) -> None:
        (directory / "half").write_text("x")
        raise RuntimeError("out of disk")

    with pytest.raises(RuntimeError, match="out of disk"):
        build_once(target, broken, "DONE")
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".building")] == []

    built = []
    build_once(target, lambda d: (built.append(d), (d / "DONE").write_text("")), "DONE")
    build_once(target, lambda d: built.append(d), "DONE")  # already there: not built again
    assert len(built) == 1 and (target / "DONE").exists()


def test_a_built_target_is_readable_by_other_users(tmp_path):
    target = build_once(tmp_path / "model-v1", lambda d: (d / "DONE").write_text(""), "DONE")
    assert target.stat().st_mode & 0o777 == 0o755


def test_force_rebuilds_over_an_existing_result(tmp_path):
    target = tmp_path / "model-v1"
    build_once(target, lambda d: (d / "DONE").write_text("first"), "DONE")
    build_once(target, lambda d: (d / "DONE").write_text("second"), "DONE", force=True)
    assert (target / "DONE").read_text() == "second"


def test_a_link_where_the_cache_builds_is_refused_in_one_line(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "games-v1").symlink_to(mine)
    with pytest.raises(ValueError, match=r"games-v1 is a link, where the cache keeps a folder it builds"):
        build_once(tmp_path / "cache" / "games-v1", lambda d: (d / "DONE").write_text("x"), "DONE")
    assert (mine / "keep.txt").read_text() == "mine" and [p.name for p in mine.iterdir()] == ["keep.txt"]
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == ["games-v1"]


def test_a_file_system_without_flock_still_builds(tmp_path, monkeypatch, caplog):
    """NFS mounted nolock and some FUSE mounts raise ENOLCK / EOPNOTSUPP from flock: the build goes on unlocked."""
    import errno

    import mmrl.cache as cache

    def no_flock(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(cache.fcntl, "flock", no_flock)
    with caplog.at_level("WARNING", logger="mmrl.cache"):
        build_once(tmp_path / "model-v1", lambda d: (d / "DONE").write_text("x"), "DONE")
    assert (tmp_path / "model-v1" / "DONE").read_text() == "x"
    assert "does not support flock" in caplog.text


def test_a_copy_finished_meanwhile_by_an_unlocked_builder_is_kept(tmp_path):
    """Where the lock holds nobody back, a second builder must not remove the complete copy readers may be loading."""
    target = tmp_path / "model-v1"

    def build_while_another_finishes(directory: Path) -> None:
        (directory / "DONE").write_text("mine")
        target.mkdir()
        (target / "DONE").write_text("theirs")  # the other process's rename landed during this build

    assert build_once(target, build_while_another_finishes, "DONE") == target
    assert (target / "DONE").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".building")] == []


@pytest.mark.parametrize("value", [None, ""])
def test_an_unset_or_empty_mmrl_cache_means_the_home_cache(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("MMRL_CACHE", raising=False)
    else:
        monkeypatch.setenv("MMRL_CACHE", value)
    assert cache_root() == Path.home() / ".cache" / "mmrl"


def test_mmrl_cache_names_the_root(monkeypatch, tmp_path):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path))
    assert cache_root() == tmp_path


@pytest.mark.parametrize("under", ["", "sub"])
def test_mmrl_cache_at_a_file_is_one_line(tmp_path, under):
    """A run on an MMRL_CACHE that is (or lies under) a file stops with one line, and its --out is left as it was."""
    import os

    (tmp_path / "file").write_text("x")
    cache = tmp_path / "file" / under if under else tmp_path / "file"
    env = {**os.environ, "MMRL_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "mmrl.train", "--steps", "1", "--out", str(tmp_path / "run")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (f"error: MMRL_CACHE={cache}: {tmp_path / 'file'} is a file, not "
                                                    f"a folder; point MMRL_CACHE at a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
