"""A run directory belongs to one run.

* A lock (``.mmrl.lock``, holding the owner's pid) stops a second run from writing into the same ``--out``. It is an
  advisory ``flock``, so the kernel drops it when its process dies, however it dies: a lock file left behind by a
  killed run is taken over, with a note naming the dead pid.
* A non-empty folder that is not an mmrl run is refused unless ``run.overwrite`` is set: it may be the user's own
  ``config.json`` and ``metrics.jsonl``.
* ``--resume`` continues the run as it was configured: a change to any field that changes what is trained (the
  objective, the task, the model, the seed, learning rate, ...) stops it with one line naming the field. Fields that
  only say how long, how often or where to run (:data:`SAFE_ON_RESUME`) may change; the change is logged and
  appended to ``resumes.jsonl``. The run's ``config.json`` is never rewritten by a resume.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import weakref
from pathlib import Path
from typing import Any

from mmrl.files import atomic_write_text
from mmrl.trainer.checkpoint import latest_checkpoint, remove_partial_writes
from mmrl.trainer.config import TrainConfig, saved_overrides

log = logging.getLogger("mmrl")

LOCK_NAME = ".mmrl.lock"
CONFIG_NAME = "config.json"
RESUMES_NAME = "resumes.jsonl"
# Files a run of ours writes; anything else in a folder means it is not (only) an mmrl run.
RUN_FILES = {LOCK_NAME, CONFIG_NAME, RESUMES_NAME, "metrics.jsonl", "curves.png", "sft.jsonl", "samples.jsonl",
             "checkpoints", "wandb", "wandb_run_id"}  # the last two: mmrl.trainer.loggers' W&B files
# TensorBoard names its event files events.out.tfevents.<time>.<host>... (mmrl.trainer.loggers, --run.tensorboard)
RUN_FILE_PREFIXES = ("events.out.tfevents.",)
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
                raise ValueError(f"run.out_dir {self.path.parent} is in use by process {owner} (lock "
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
    handle.close()


def is_mmrl_config(path: Path) -> bool:
    """``path`` is a ``config.json`` written by mmrl.train (a mapping with our sections)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
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
        except json.JSONDecodeError:  # a line cut short by a kill: that resume recorded nothing
            continue
    return out


def saved_layer(run_dir: str | Path) -> tuple[dict[str, Any], str] | None:
    """The config layer a ``--resume`` starts from (under the YAML and the flags), or None without a saved config."""
    path = Path(run_dir) / CONFIG_NAME
    if not path.exists():
        return None
    if not is_mmrl_config(path):
        raise ValueError(f"run.resume: {path} is not a config.json written by mmrl.train")
    return saved_config(Path(run_dir)), str(path)


def resume_changes(run_dir: Path, cfg: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{field: (saved, now)}`` of the safe fields a resume changes; ValueError naming the first unsafe one."""
    before = {f"{s}.{k}": v for s, fields in saved_config(run_dir).items() for k, v in fields.items()}
    now = flat_config(cfg.to_dict())
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
        raise ValueError(f"config: --resume cannot change {key} ({old!r} in {run_dir / CONFIG_NAME}, {new!r} now): "
                         f"it changes what is trained; start a new run with another --out instead")
    return changed


def _as_task_reads(task: str, key: str, value: Any) -> Any:
    """``value`` of option ``key`` typed as the task converts it (runs saved before session 17 kept ``--task.x 5``
    as the number 5; flags now keep the text "5"); unchanged when it is not an option or does not convert."""
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


class RunDir:
    """The claimed run directory of one run: its lock and what a resume changed."""

    def __init__(self, path: Path, lock: RunLock, changes: dict[str, tuple[Any, Any]]):
        self.path, self.lock, self.changes = path, lock, changes

    def record_config(self, cfg: TrainConfig, step: int) -> None:
        """A fresh run writes ``config.json`` (atomically); a resume appends its safe changes to ``resumes.jsonl``."""
        if not cfg.run.resume:
            atomic_write_text(self.path / CONFIG_NAME, json.dumps(cfg.to_dict(), indent=2, default=str))
            return
        if self.changes:
            entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": step,
                     "changed": {k: list(v) for k, v in self.changes.items()}}
            with (self.path / RESUMES_NAME).open("a") as out:
                out.write(json.dumps(entry, default=str) + "\n")


def is_run_file(name: str) -> bool:
    """True for a file or folder an mmrl run writes into its directory."""
    return name in RUN_FILES or name.startswith(RUN_FILE_PREFIXES)


def claim(cfg: TrainConfig) -> RunDir:
    """Lock ``cfg.out_dir`` for this run and check that the run may write there; removes half-written checkpoints
    of earlier (dead) runs of this directory. Raises ValueError with one line."""
    run_dir = cfg.out_dir
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run.out_dir {run_dir} exists and is not a directory")
    entries = sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else []
    if entries and not cfg.run.overwrite:
        foreign = [name for name in entries if not is_run_file(name)]
        # a run's directory holds mmrl's config.json (written at start) or, if that run was killed before writing
        # it, its lock file; files that only share a run's names (a user's own metrics.jsonl) are not a run's
        ours = ((run_dir / CONFIG_NAME).exists() and is_mmrl_config(run_dir / CONFIG_NAME)) or LOCK_NAME in entries
        if not ours or (foreign and not cfg.run.resume):  # a resumed run may keep the user's files beside it
            shown = (foreign or entries)[:3]
            raise ValueError(f"run.out_dir {run_dir} is not empty and is not an mmrl run (it holds {', '.join(shown)}"
                             f"{', ...' if len(foreign or entries) > 3 else ''}); "
                             + ("nothing here to resume" if cfg.run.resume else
                                "choose another --out, or pass --run.overwrite true to write into it"))
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        for partial in remove_partial_writes(run_dir):
            log.warning("removed %s, a checkpoint write that never finished", partial)
        existing = latest_checkpoint(run_dir)
        if cfg.run.resume and existing is None:
            raise ValueError(f"config: run.resume is set but {run_dir} has no checkpoint")
        if not cfg.run.resume and existing is not None and not cfg.run.overwrite:
            raise ValueError(f"config: run.out_dir {run_dir} already holds a run; pass --resume to continue it, "
                             f"--run.overwrite true to start afresh, or another --run.out_dir")
        changes = {}
        if cfg.run.resume and (run_dir / CONFIG_NAME).exists():
            changes = resume_changes(run_dir, cfg)
            for key, (old, new) in changes.items():
                log.info("resume: %s changed from %r to %r", key, old, new)
    except BaseException:
        lock.release()
        raise
    return RunDir(run_dir, lock, changes)


def trained_task(run_dir: str | Path) -> tuple[str, dict[str, Any]] | None:
    """(task name, task options) a run directory was trained on, from its ``config.json``; None for anything else
    (a model folder, a hub id)."""
    path = Path(run_dir) / CONFIG_NAME
    if not path.is_file() or not is_mmrl_config(path):
        return None
    task = json.loads(path.read_text())["task"]
    return task.get("name", ""), dict(task.get("options") or {})
