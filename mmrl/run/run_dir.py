"""A run directory belongs to one run.

* A lock (``.mmrl.lock``, holding the owner's pid) stops a second run from writing into the same ``--out``. It is an
  advisory ``flock``, so the kernel drops it when its process dies, however it dies: a lock file left behind by a
  killed run is taken over, with a note naming the dead pid.
* A run records every file and folder it writes in ``.mmrl-run.json`` (rewritten atomically). A fresh run into the
  folder of an earlier one (``run.overwrite``, or a run that died before its first checkpoint) removes only what that
  record names and says what it left; a file the record does not name at a path the new run writes (a user's own
  ``metrics.jsonl``) stops it with one line. A non-empty folder that is not an mmrl run is refused outright.
* ``--out`` must be a folder of the user's own that no other user can write (not ``/tmp`` itself: a new folder inside
  it): another user could otherwise replace the run's files.
* ``--resume`` continues the run as it was configured: a change to any field that changes what is trained (the
  objective, the task, the model, the seed, learning rate, ...) stops it with one line naming the field. Fields that
  only say how long, how often or where to run (:data:`SAFE_ON_RESUME`) may change; the change is logged and
  appended to ``resumes.jsonl``. The run's ``config.json`` is never rewritten by a resume. A resume of a finished run
  (its last checkpoint at ``run.steps``) is refused with one line.

Both backends claim their directory here; each describes what its runs write with a :class:`RunLayout`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import fnmatch
import json
import logging
import os
import re
import shutil
import stat
import time
import weakref
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from mmrl.errors import UserError
from mmrl.files import atomic_write_text, is_temporary_of
from mmrl.run.checkpoint import (
    STEP_FOLDER,
    checkpoints,
    latest_checkpoint,
    remove_checkpoint,
    remove_partial_writes,
)
from mmrl.run.config import TrainConfig, saved_overrides
from mmrl.run.loggers import WANDB_DIR, WANDB_ID_FILE, remove_wandb_files
from mmrl.run.masking import masked_config

log = logging.getLogger("mmrl")

LOCK_NAME = ".mmrl.lock"
RECORD_NAME = ".mmrl-run.json"
CONFIG_NAME = "config.json"
RESUMES_NAME = "resumes.jsonl"
# Names a run of either backend writes at the top of its directory: a folder holding one of them beside an mmrl
# config.json is a run's, and mmrl.eval never writes its results over one of them.
RUN_FILES = {LOCK_NAME, RECORD_NAME, CONFIG_NAME, RESUMES_NAME, "metrics.jsonl", "curves.png", "sft.jsonl",
             "samples.jsonl", "checkpoints", WANDB_DIR, WANDB_ID_FILE,  # the last two: W&B (mmrl.run.loggers)
             "openrlhf", "model", "tensorboard", "rehearsal"}  # the openrlhf backend's (mmrl.openrlhf.launch)
# TensorBoard names its event files events.out.tfevents.<time>.<host>... (mmrl.run.loggers, --run.tensorboard)
RUN_FILE_PREFIXES = ("events.out.tfevents.",)
# The local trainer's checkpoint folders: a user may keep files in one (an evaluation of that step), so removing one
# removes only the files its writer made (mmrl.run.checkpoint.remove_checkpoint) and names what it left.
CHECKPOINT_FOLDERS = "checkpoints/step_*"
# Fields that say how long, how often, where or with what resources to run, not what is trained.
SAFE_ON_RESUME = {
    "run.steps", "run.checkpoint_every", "run.keep_checkpoints",
    "run.eval_every", "run.eval_samples", "run.eval_temperature", "run.eval_sample_prompts", "run.progress", "run.plot",
    "run.tensorboard", "run.wandb",
    "model.device", "model.threads", "model.gradient_checkpointing",
    "rollout.generation_batch_size", "rollout.env_workers", "rollout.env_step_timeout", "optim.micro_batch_size",
    "optim.row_by_row",
}
SAFE_SECTIONS_ON_RESUME = {"cluster", "evaluation"}  # resources of the openrlhf backend; held-out evaluation sets
NOT_COMPARED_ON_RESUME = {"run.resume", "run.overwrite", "run.out_dir"}  # how this process was started, and where


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``run_dir/.mmrl.lock`` held until :meth:`release` or process exit."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self._release: weakref.finalize | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            handle = open(self.path, "a+")  # noqa: SIM115 -- held open for the whole run: the fd is the lock
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                owner = handle.read().strip() or "unknown"
                handle.close()
                raise UserError(f"run.out_dir {self.path.parent} is in use by process {owner} (lock "
                                 f"{self.path}); wait for it to finish or choose another --out") from None
            # The file may have been removed by its previous owner between our open and flock: lock the live one.
            try:
                same = os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            handle.close()
        handle.seek(0)
        previous = handle.read().strip()
        if previous:
            log.warning("run.out_dir %s: taking over the lock of process %s, which is no longer running",
                        self.path.parent, previous)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        # Released by release(), when this object is collected, or at interpreter exit (a start that failed after
        # the claim leaves no lock file behind); only a kill -9 leaves one, and the next run takes it over.
        self._release = weakref.finalize(self, _unlock, handle, self.path)

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None

    @property
    def held(self) -> bool:
        return self._release is not None and self._release.alive


def _unlock(handle, path: Path) -> None:
    try:  # unlinked while still locked: a waiting opener re-checks the inode and retries on the new file
        if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:  # a folder made read-only during the run: the lock goes with the handle, its file stays
        # (the next run takes it over with a note), and the error that ended the run is the one it reports
        log.warning("run.out_dir %s: the lock file %s stays (%s); the lock itself is released", path.parent,
                    path.name, os.strerror(exc.errno) if exc.errno else exc)
    finally:
        handle.close()


def is_mmrl_config(path: Path) -> bool:
    """``path`` is a ``config.json`` written by mmrl.train (a mapping with our sections)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: JSON nested too deep to read
        return False
    return isinstance(data, dict) and {"model", "task", "algo", "run"} <= set(data)


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """``TrainConfig.to_dict()`` as ``{"section.field": value}``, hyper-parameters/options as their own fields, in
    JSON's value types (so a saved config and a live one compare equal)."""
    out = {}
    for section, fields in saved_overrides(json.loads(json.dumps(config, default=str))).items():
        for name, value in fields.items():
            out[f"{section}.{name}"] = value
    return out


def saved_config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.json`` with the safe changes of its earlier resumes applied, as nested overrides."""
    saved = saved_overrides(json.loads((Path(run_dir) / CONFIG_NAME).read_text()))
    for change in read_resumes(run_dir):
        for key, (_, new) in change.get("changed", {}).items():
            section, _, name = key.partition(".")
            saved.setdefault(section, {})[name] = new
    return saved


def read_resumes(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / RESUMES_NAME
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except (json.JSONDecodeError, RecursionError):  # a line cut short by a kill: that resume recorded nothing
            continue
    return out


def saved_layer(run_dir: str | Path) -> tuple[dict[str, Any], str] | None:
    """The config layer a ``--resume`` starts from (under the YAML and the flags), or None without a saved config."""
    path = Path(run_dir) / CONFIG_NAME
    if not path.exists():
        return None
    if not is_mmrl_config(path):
        raise UserError(f"run.resume: {path} is not a config.json written by mmrl.train")
    return saved_config(Path(run_dir)), str(path)


def resume_changes(run_dir: Path, cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{field: (saved, now)}`` of the safe fields a resume changes; ValueError naming the first unsafe one."""
    before = {f"{s}.{k}": v for s, fields in saved_config(run_dir).items() for k, v in fields.items()}
    now = flat_config(masked_config(cfg.to_dict()))  # the saved side holds no credential: compare what it could
    changed = {}
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if key.startswith("task.") and key != "task.name":  # a task option as the task reads it: 5 and "5" agree
            old, new = _as_task_reads(cfg.task.name, key, old), _as_task_reads(cfg.task.name, key, new)
        if old == new or key in NOT_COMPARED_ON_RESUME:
            continue
        if key in SAFE_ON_RESUME or key.partition(".")[0] in SAFE_SECTIONS_ON_RESUME:
            changed[key] = (old, new)
            continue
        raise UserError(f"config: --resume cannot change {key} ({old!r} in {run_dir / CONFIG_NAME}, {new!r} now): "
                         f"it changes what is trained; start a new run with another --out instead")
    return changed


def refuse_edited_config(run_dir: Path, trained: dict[str, Any] | None, checkpoint: Path) -> None:
    """Refuse a ``config.json`` edited by hand since the checkpoint was written: ``trained`` is the config the
    checkpoint records (masked, as config.json holds it; None for a checkpoint from before checkpoints held one).
    A field that changes what is trained and differs is one line naming it and both values, as a flag changing it
    on ``--resume`` is: applied, it would not match the optimizer state the checkpoint restores; ignored, config.json
    would describe another run."""
    if not isinstance(trained, dict):
        return
    before = flat_config(trained)
    now = {f"{s}.{k}": v for s, fields in saved_config(run_dir).items() for k, v in fields.items()}
    for key in sorted(set(before) | set(now)):
        if key in NOT_COMPARED_ON_RESUME or key in SAFE_ON_RESUME or key.partition(".")[0] in SAFE_SECTIONS_ON_RESUME:
            continue
        if before.get(key) != now.get(key):
            raise UserError(f"config: {run_dir / CONFIG_NAME} says {key} is {now.get(key)!r}, but {checkpoint} was "
                             f"trained with {before.get(key)!r}: config.json was edited after the run started; put "
                             f"it back (a run that trains otherwise is a new run with another --out)")


def _as_task_reads(task: str, key: str, value: Any) -> Any:
    """``value`` of option ``key`` typed as the task converts it (runs saved before task options kept their text
    hold ``--task.x 5`` as the number 5; flags now keep the text "5"); unchanged when it is not an option or does not
    convert."""
    from mmrl.tasks import TASKS
    from mmrl.tasks.base import option_defaults, typed_option

    defaults = option_defaults(task) if task in TASKS else {}
    name = key.partition(".")[2]
    if name not in defaults or value is None:
        return value
    try:
        return typed_option(key, value, defaults[name])
    except ValueError:
        return value


@dataclasses.dataclass(frozen=True)
class RunLayout:
    """What one backend's runs write into their directory.

    ``writes``: the paths (relative, glob patterns allowed) a run writes at fixed names; a file there that the
    directory's record does not name would be replaced, so a fresh run refuses to start over it. ``unique``: names a
    run makes unique itself (TensorBoard's event files), never in a new run's way. ``latest``: the newest checkpoint as
    (step, path), None without one. ``resumes_latest``: a resume always continues from that checkpoint, so the claim
    can tell a finished run; otherwise (a damaged newest checkpoint is skipped) the trainer tells it once loaded.
    ``removers``: (pattern, remove) for recorded folders a user may keep files in (checkpoints): ``remove(folder)``
    removes only the files the run's writers made, the folder too once that empties it, and returns (the names
    removed, the names left); any other recorded folder is removed whole. ``names``: whether a path that matches a
    pattern is one the run writes (a checkpoint folder's exact name, where a pattern cannot say it).
    ``written_unrecorded``: what a run may have written without recording it yet (a kill between the two), which a
    resume takes as its own."""

    writes: tuple[str, ...]
    unique: tuple[str, ...]
    latest: Callable[[Path], tuple[int, Path] | None]
    resumes_latest: bool
    removers: tuple[tuple[str, Callable[[Path], tuple[list[str], list[str]]]], ...] = ()
    names: Callable[[str], bool] = lambda _: True
    written_unrecorded: Callable[[Path], list[Path]] = lambda _: []

    def remover(self, rel: str) -> Callable[[Path], tuple[list[str], list[str]]] | None:
        return next((remove for pattern, remove in self.removers if fnmatch.fnmatchcase(rel, pattern)), None)

    def owned_on_resume(self, run_dir: Path, record: set[str] | None) -> tuple[str, ...]:
        """What a resume takes as its own beyond the record: what the run it continues wrote before recording it. A
        run of an mmrl that kept no record (``record`` None) has every path its backend writes taken; with a record,
        a file that only has a run's name (a copied event file, a user's sft.jsonl) stays the user's."""
        if record is None:
            found = {rel for pattern in (*self.writes, *self.unique) for p in run_dir.glob(pattern)
                     if self.names(rel := p.relative_to(run_dir).as_posix())}
        else:
            found = {p.relative_to(run_dir).as_posix() for p in self.written_unrecorded(run_dir)}
        return tuple(sorted(found - (record or set())))

    def in_the_way(self, rel: str) -> bool:
        """``rel`` is, or is a folder holding, a path this backend's run writes."""
        return any((fnmatch.fnmatchcase(rel, p) and self.names(rel)) or p.startswith(rel + "/") for p in self.writes)


def checkpoint_step(path: Path) -> int:
    """The step of a local checkpoint from its folder's name (``checkpoints/step_0000060``)."""
    for part in (path, *path.parents):
        found = re.fullmatch(r"step_(\d+)", part.name)
        if found:
            return int(found[1])
    raise ValueError(f"checkpoint {path} is not inside a step_* folder")


def local_latest(run_dir: Path) -> tuple[int, Path] | None:
    path = latest_checkpoint(run_dir)
    return None if path is None else (checkpoint_step(path), path)


def local_name(rel: str) -> bool:
    """A path of the local run's layout by its exact name: a checkpoint folder as `save_checkpoint` names it."""
    folder, _, name = rel.partition("/")
    return folder != "checkpoints" or "/" in name or STEP_FOLDER.fullmatch(name) is not None


LOCAL_RUN = RunLayout(
    writes=(CONFIG_NAME, RESUMES_NAME, "metrics.jsonl", "samples.jsonl", "curves.png", "sft.jsonl", WANDB_DIR,
            WANDB_ID_FILE, CHECKPOINT_FOLDERS),
    unique=(f"{RUN_FILE_PREFIXES[0]}*",), latest=local_latest, resumes_latest=False,
    removers=((CHECKPOINT_FOLDERS, remove_checkpoint), (WANDB_DIR, remove_wandb_files)), names=local_name,
    # a checkpoint is recorded just after it is written (mmrl.trainer.local)
    written_unrecorded=checkpoints)


def read_record(run_dir: Path) -> set[str] | None:
    """The relative paths the directory's record names; None when it has no record (not an mmrl run, or one written
    before runs kept a record). ValueError when the record cannot be read."""
    path = Path(run_dir) / RECORD_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UserError(f"run.out_dir {run_dir}: its record {path} cannot be read ({exc}); move the folder aside "
                         f"or choose another --out") from None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise UserError(f"run.out_dir {run_dir}: its record {path} is not a list of files written by an mmrl run")
    # a record is only ever read to remove what it names: a crafted one must not reach outside the folder
    outside = [f for f in files if PurePosixPath(f).is_absolute() or not f or {"..", "."} & set(f.split("/"))]
    if outside:
        raise UserError(f"run.out_dir {run_dir}: its record {path} names {outside[0]!r}, which is not a path inside "
                         f"the folder; it was not written by mmrl: move the folder aside or choose another --out")
    return set(files)


# The directory's lock and record, and what an atomic rewrite of the record or config.json killed midway leaves.
def is_own_file(name: str) -> bool:
    return name in (LOCK_NAME, RECORD_NAME) or any(is_temporary_of(name, f) for f in (RECORD_NAME, CONFIG_NAME))


def unrecorded(run_dir: Path, record: set[str]) -> list[str]:
    """Paths in ``run_dir`` (relative) that ``record`` does not name; a folder is looked into only when the record
    names something inside it (``checkpoints/`` holding a user's file beside the run's ``step_*``)."""
    out = []

    def visit(folder: Path, prefix: str) -> None:
        for child in sorted(folder.iterdir()):
            rel = prefix + child.name
            if rel in record or is_own_file(rel):
                continue
            is_folder = child.is_dir() and not child.is_symlink()
            if is_folder and not any(child.iterdir()):  # nothing in it to lose or to leave
                continue
            if is_folder and any(r.startswith(rel + "/") for r in record):
                visit(child, rel + "/")
            else:
                out.append(rel)

    visit(run_dir, "")
    return out


def _shown(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")


class RunDir:
    """The claimed run directory of one run: its lock, what a resume changed, and the record of what it wrote."""

    def __init__(self, path: Path, lock: RunLock, changes: dict[str, tuple[Any, Any]], *,
                 record: set[str] | None = None, adopted: tuple[str, ...] = (), left: tuple[str, ...] = (),
                 step: int = 0, created: tuple[Path, ...] = (), new_record: bool = False,
                 layout: RunLayout = LOCAL_RUN):
        self.path, self.lock, self.changes, self.layout = path, lock, changes, layout
        self.step = step  # of the checkpoint a resume continues from (0 for a fresh run)
        self.files = set(record or ()) | set(adopted)  # what the record names once it is next written
        self.left = list(left)  # entries of the directory that no run of ours wrote
        self._created = created  # folders the claim made: removed again by abandon() while still empty
        self._new_record = new_record  # the folder had no record before this run: abandon() may remove its own

    def record(self, *paths: str | Path, prune: str | Path | None = None) -> None:
        """Add ``paths`` (relative to the run directory, or inside it) to the record, before or just after they are
        written; with ``prune`` (a folder), entries inside it whose files the run has since removed (checkpoints
        past ``run.keep_checkpoints``) are dropped. Atomic."""
        added = {self._relative(p) for p in paths}
        if prune is not None:
            inside = self._relative(prune) + "/"
            self.files = {f for f in self.files if not f.startswith(inside) or os.path.lexists(self.path / f)}
        self.files |= added
        self._write_record()

    def _relative(self, path: str | Path) -> str:
        """A name (``str``) is relative to the run directory already; a ``Path`` is one inside it."""
        return path if isinstance(path, str) else path.relative_to(self.path).as_posix()

    def _confined(self, rel: str) -> bool:
        """``rel`` lies in this directory through real folders (no symlinked folder on the way out of it)."""
        parent = (self.path / rel).parent
        return parent.resolve() == self.path.resolve().joinpath(*PurePosixPath(rel).parts[:-1])

    def _write_record(self) -> None:
        atomic_write_text(self.path / RECORD_NAME,
                          json.dumps({"written_by": "mmrl", "files": sorted(self.files)}, indent=1) + "\n")

    def clear_previous(self) -> list[str]:
        """A fresh run: remove what the earlier run of this directory recorded (and nothing else), log what was
        removed and what was left. Returns the removed paths."""
        removed = []
        for rel in sorted(self.files, key=lambda r: (-r.count("/"), r)):  # the deepest first
            target = self.path / rel
            if not os.path.lexists(target):
                continue
            if not self._confined(rel):  # a folder on its way replaced by a link out of the run directory
                self.left.append(rel)
                continue
            remove = self.layout.remover(rel)
            if target.is_dir() and not target.is_symlink() and remove is not None:
                gone, left = remove(target)
                if left:  # the folder stays, with what the user put in it
                    self.left.extend(f"{rel}/{name}" for name in left)
                    removed.extend([rel] if gone else [])
                    continue
            elif target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
            removed.append(rel)
            for parent in target.parents:  # folders the record's entries sat in, once empty (checkpoints/)
                if parent == self.path or not parent.is_relative_to(self.path):
                    break
                try:
                    parent.rmdir()
                except OSError:
                    break
        self.files = set()
        self._write_record()
        if removed:
            log.info("run.out_dir %s: removed the earlier run's %s", self.path, _shown(removed, 6))
        if self.left:
            log.warning("run.out_dir %s: left %s (not written by an mmrl run)", self.path, _shown(self.left, 6))
        return removed

    def record_config(self, cfg: TrainConfig, step: int) -> None:
        """A fresh run writes ``config.json`` (atomically, credentials masked); a resume appends its safe changes to
        ``resumes.jsonl`` (:func:`resume_changes` compares masked values, so none holds a credential)."""
        if not cfg.run.resume:
            self.record(CONFIG_NAME)
            atomic_write_text(self.path / CONFIG_NAME, json.dumps(masked_config(cfg.to_dict()), indent=2, default=str))
            return
        self.record(CONFIG_NAME, *([RESUMES_NAME] if self.changes else []))  # a resumed run's config is its own
        if self.changes:
            entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": step,
                     "changed": {k: list(v) for k, v in self.changes.items()}}
            with (self.path / RESUMES_NAME).open("a") as out:
                out.write(json.dumps(entry, default=str) + "\n")

    def abandon(self) -> None:
        """A start refused after the claim: release the lock, remove the record the run began (while it names
        nothing that was written) and the folders the claim made, if then empty, so that a refused start leaves
        nothing behind."""
        self.lock.release()
        # the record is written as soon as the run clears the folder, before the later set-up phases (the SFT
        # warm-up's demonstrations, the env workers) that may still refuse the start
        if self._new_record and not any(os.path.lexists(self.path / rel) for rel in self.files):
            try:
                (self.path / RECORD_NAME).unlink()
            except FileNotFoundError:
                pass
        for folder in self._created:  # the deepest first
            try:
                folder.rmdir()
            except OSError:
                break


def is_run_file(name: str) -> bool:
    """True for a file or folder an mmrl run writes into its directory."""
    return name in RUN_FILES or name.startswith(RUN_FILE_PREFIXES)


def check_out_path(run_dir: Path) -> None:
    """``run.out_dir`` can be a run's folder: under folders (not a file), and, when it exists, a folder of this user's
    that no other user can write. ValueError with one line."""
    for where in (run_dir, *run_dir.parents):
        if not os.path.lexists(where):
            continue
        if not where.is_dir():
            raise UserError(f"run.out_dir {run_dir} exists and is not a directory" if where == run_dir else
                             f"run.out_dir {run_dir}: {where} is a file, not a folder")
        break
    if not run_dir.is_dir():
        return
    info = run_dir.stat()
    if info.st_uid != os.geteuid():
        raise UserError(f"run.out_dir {run_dir} belongs to another user (uid {info.st_uid}); choose a folder of your "
                         f"own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "every user" if info.st_mode & stat.S_IWOTH else "its group"
        raise UserError(f"run.out_dir {run_dir} can be written by {who} (mode {stat.S_IMODE(info.st_mode):o}), who "
                         f"could replace the run's files; choose a folder only you can write, such as a new folder "
                         f"inside it")


def _check_not_foreign(cfg: TrainConfig) -> set[str] | None:
    """Refuse a non-empty folder that is not an mmrl run; the directory's record (None without one)."""
    run_dir = cfg.out_dir
    entries = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    record = read_record(run_dir) if entries else None
    others = [name for name in entries if not is_own_file(name)]
    # a run's directory holds its record, mmrl's config.json (runs from before records) or, if that run was killed
    # before writing either, its lock file; files that only share a run's names (a user's metrics.jsonl) are not a run's
    ours = record is not None or is_mmrl_config(run_dir / CONFIG_NAME) or LOCK_NAME in entries
    if others and not ours:
        shown = [name for name in others if not is_run_file(name)] or others  # the user's own names say most
        raise UserError(f"run.out_dir {run_dir} is not empty and is not an mmrl run (it holds {_shown(shown)}); "
                         + ("nothing here to resume" if cfg.run.resume else "choose another --out"))
    return record


def _check_run(cfg: TrainConfig, layout: RunLayout, record: set[str] | None) -> dict[str, Any]:
    """The checks of a run directory that read its checkpoints and files (under the lock, or in a dry run)."""
    run_dir = cfg.out_dir
    if not run_dir.is_dir():
        if cfg.run.resume:
            raise UserError(f"config: run.resume is set but {run_dir} does not exist")
        return {"changes": {}, "adopted": (), "left": (), "step": 0}
    latest = layout.latest(run_dir)
    if cfg.run.resume and latest is None:
        raise UserError(f"config: run.resume is set but {run_dir} has no checkpoint")
    if cfg.run.resume and layout.resumes_latest:
        refuse_finished(cfg.run.steps, run_dir, *latest)
    if not cfg.run.resume and latest is not None and not cfg.run.overwrite:
        raise UserError(f"config: run.out_dir {run_dir} already holds a run; pass --resume to continue it, "
                         f"--run.overwrite true to start afresh, or another --run.out_dir")
    loose = unrecorded(run_dir, record or set())
    adopted: tuple[str, ...] = ()
    if cfg.run.resume:  # the run it continues (and its checkpoints) is this run's own, recorded or not
        adopted = layout.owned_on_resume(run_dir, record)
    else:
        blocking = [rel for rel in loose if layout.in_the_way(rel)]
        if blocking and record is None:
            raise UserError(f"run.out_dir {run_dir} holds a run from an mmrl that did not record the files it wrote "
                             f"(no {RECORD_NAME}), so none of them is removed; move away what you want to keep and "
                             f"delete the rest, or choose another --out")
        if blocking:
            raise UserError(f"run.out_dir {run_dir}: {_shown(blocking)} was not written by an mmrl run (it is not in "
                             f"{RECORD_NAME}) and a new run would replace it; move it away or choose another --out")
    changes = {}
    if cfg.run.resume and (run_dir / CONFIG_NAME).exists():
        changes = resume_changes(run_dir, cfg)
    left = tuple(rel for rel in loose if rel not in adopted)
    return {"changes": changes, "adopted": adopted, "left": left, "step": latest[0] if latest else 0}


def refuse_finished(steps: int, run_dir: Path, step: int, checkpoint: Path) -> None:
    """A resume of the run in ``run_dir`` from ``checkpoint`` at ``step`` would train nothing when ``steps``
    (``run.steps``) are done: one line saying so."""
    if step >= steps:
        raise UserError(f"run.resume: the run in {run_dir} is finished (its last checkpoint, {checkpoint}, is at "
                         f"step {step} of run.steps {steps}); pass --steps N with N > {step} to train it "
                         f"further, or evaluate it with python -m mmrl.eval --model {run_dir}")


def inspect(cfg: TrainConfig, layout: RunLayout = LOCAL_RUN) -> None:
    """Every check of :func:`claim` without taking the directory or writing anything (a dry run)."""
    check_out_path(cfg.out_dir)
    _check_run(cfg, layout, _check_not_foreign(cfg))


def claim(cfg: TrainConfig, layout: RunLayout = LOCAL_RUN) -> RunDir:
    """Lock ``cfg.out_dir`` for this run and check that the run may write there; removes half-written checkpoints
    of earlier (dead) runs of this directory. Raises ValueError with one line; a refused claim leaves no new file or
    folder behind."""
    run_dir = cfg.out_dir
    check_out_path(run_dir)
    record = _check_not_foreign(cfg)
    created = tuple(p for p in (run_dir, *run_dir.parents) if not os.path.lexists(p))
    made: list[Path] = []
    try:
        for folder in reversed(created):  # from the top; 0o755 less the umask: no group or other write bit, ever
            try:
                folder.mkdir(mode=0o755)
            except FileExistsError:  # another run starting into the same new folder made it first
                if not folder.is_dir() or folder.is_symlink():
                    raise
                continue
            made.append(folder)
    except OSError as exc:
        for folder in reversed(made):
            folder.rmdir()
        raise UserError(f"run.out_dir {run_dir} cannot be created ({os.strerror(exc.errno) if exc.errno else exc})"
                         ) from None
    lock = RunLock(run_dir)
    try:
        try:
            lock.acquire()
        except OSError as exc:
            raise UserError(f"run.out_dir {run_dir}: cannot write its lock file "
                             f"({os.strerror(exc.errno) if exc.errno else exc})") from None
        for partial in remove_partial_writes(run_dir):
            log.warning("removed %s, a checkpoint write that never finished", partial)
        found = _check_run(cfg, layout, record)
        for key, (old, new) in found["changes"].items():
            log.info("resume: %s changed from %r to %r", key, old, new)
    except BaseException:
        RunDir(run_dir, lock, {}, created=created).abandon()
        raise
    return RunDir(run_dir, lock, found["changes"], record=record, adopted=found["adopted"], left=found["left"],
                  step=found["step"], created=created, new_record=record is None, layout=layout)


def run_owning(path: str | Path) -> Path | None:
    """The run directory that ``path`` is one of the files or folders of (named by the directory's record, or a name
    a run writes, in a folder holding a record, an mmrl config.json or a run's lock); None for any other path."""
    path = Path(path).resolve()
    for folder in path.parents:
        rel = path.relative_to(folder).as_posix()
        try:
            record = read_record(folder)
        except ValueError:  # a record that cannot be read is still a run's
            record = set()
        except OSError:  # a folder we cannot look into
            continue
        if record is None and not is_mmrl_config(folder / CONFIG_NAME) and not (folder / LOCK_NAME).exists():
            continue
        top = rel.split("/")[0]
        if is_run_file(top) or any(rel == r or rel.startswith(r + "/") for r in record or ()):
            return folder
    return None


def trained_task(run_dir: str | Path) -> tuple[str, dict[str, Any], str] | None:
    """(task name, task options, agent layout) a run directory was trained on, from its ``config.json``; None for
    anything else (a model folder, a hub id)."""
    path = Path(run_dir) / CONFIG_NAME
    if not path.is_file() or not is_mmrl_config(path):
        return None
    config = json.loads(path.read_text())
    task = config["task"]
    layout = (config.get("rollout") or {}).get("agent_layout", "episode")
    return task.get("name", ""), dict(task.get("options") or {}), layout
