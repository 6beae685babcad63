"""Where a run's scalars go besides ``metrics.jsonl``: TensorBoard (``--run.tensorboard true``) and Weights & Biases
(``--run.wandb PROJECT``), for the local trainer; and the same two choices as OpenRLHF's own ``--logger.*`` flags.

Both receive exactly the scalars of each ``metrics.jsonl`` line: every finite number except ``step``, which is the
x axis (lists such as ``moe/expert_load``, strings and non-finite values, which the JSONL writes as ``null``, are left
out). Event files are written into the run directory itself, beside ``metrics.jsonl``, so ``tensorboard --logdir
runs`` shows one run per run directory. W&B runs offline (files under ``<run>/wandb``, upload later with
``wandb sync``) unless this machine is logged in (``wandb login`` or ``WANDB_API_KEY``) or ``WANDB_MODE`` says
otherwise; the run's whole config is the W&B config.
"""

from __future__ import annotations

import math
import os
import re
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmrl.files import remove_named_files, remove_owned
from mmrl.run.masking import masked_argv

EVENT_FILE_PREFIX = "events.out.tfevents."
WANDB_ID_FILE = "wandb_run_id"  # in the run dir: --resume continues the same W&B run
WANDB_DIR = "wandb"  # W&B's own files, under the run dir (wandb.init(dir=run_dir))
OPENRLHF_WANDB_KEY = "existing-login-or-offline"  # see openrlhf_flags: OpenRLHF switches W&B on by a key


# What W&B writes into its folder: a folder per run (run-<time>-<id>, offline-run-<time>-<id>), and links to the
# newest run and to its two logs.
WANDB_RUN_FOLDER = re.compile(r"(offline-)?run-\d{8}_\d{6}-[0-9a-z]+")
WANDB_LINKS = ("latest-run", "debug.log", "debug-internal.log")


def remove_wandb_files(folder: Path) -> tuple[list[str], list[str]]:
    """Remove what W&B wrote into a run's ``wandb/`` folder (its run folders and links), then the folder if that
    empties it. Returns (the names removed, the names left: whatever else the folder holds)."""
    def owned(child: Path) -> bool:
        if WANDB_RUN_FOLDER.fullmatch(child.name):
            return child.is_dir() and not child.is_symlink()
        return child.name in WANDB_LINKS and child.is_symlink()

    return remove_owned(folder, owned)


def remove_event_files(folder: Path) -> tuple[list[str], list[str]]:
    """Remove the TensorBoard event files of the openrlhf backend's ``tensorboard/`` folder (OpenRLHF writes them
    into a folder per run name), each such folder once empty, then ``tensorboard/`` itself if that empties it.
    Returns (the names removed, the names left)."""
    def events(run: Path) -> tuple[list[str], list[str]]:
        return remove_named_files(run, lambda name: name.startswith(EVENT_FILE_PREFIX))

    return remove_owned(folder, lambda _: False, inside=lambda _: events)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric, finite values of a metrics record, ``step`` excluded."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def wandb_logged_in() -> bool:
    """True when W&B has an API key here (it is neither read nor kept by mmrl: W&B finds it itself)."""
    import wandb

    return bool(wandb.api.api_key)


def wandb_mode() -> str:
    """``WANDB_MODE`` if the user set it, else online when logged in and offline otherwise."""
    return os.environ.get("WANDB_MODE") or ("online" if wandb_logged_in() else "offline")


class TensorBoardLog:
    """TensorBoard event files in ``run_dir``. A resumed run tells TensorBoard to drop the old files' events from
    ``resume_step`` on, which the resumed run logs again. The event files of a run that a fresh one replaces
    (``--run.overwrite``) are removed by the run directory's claim (mmrl.run.run_dir), which knows which are a
    run's; ``files`` names the one this log created."""

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        run_dir.mkdir(parents=True, exist_ok=True)
        before = set(run_dir.glob(f"{EVENT_FILE_PREFIX}*"))
        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=resume_step)
        self.files = sorted(p.name for p in set(run_dir.glob(f"{EVENT_FILE_PREFIX}*")) - before)

    def write(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a running job can be watched

    def close(self) -> None:
        self.writer.close()


@contextmanager
def masked_command_line() -> Iterator[None]:
    """W&B stores the process's command line (``sys.argv``) with a run, in its files and on its servers: while
    ``wandb.init`` reads it, it is the masked one (:func:`mmrl.run.masking.masked_argv`)."""
    saved = list(sys.argv)
    sys.argv[:] = masked_argv(saved)
    try:
        yield
    finally:
        sys.argv[:] = saved


class WandbLog:
    def __init__(self, project: str, run_dir: Path, config: dict[str, Any], resume: bool):
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        id_file = run_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        with masked_command_line():
            self.run = wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir),
                                  config=config, mode=wandb_mode())

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class RunLoggers:
    """The loggers a run's config asks for (none by default); ``write`` each metrics record, ``close`` at the end."""

    def __init__(self, run_dir: Path, tensorboard: bool, wandb_project: str, config: dict[str, Any],
                 resume_step: int | None = None):
        self.logs: list[TensorBoardLog | WandbLog] = []
        self.event_files: list[str] = []  # the TensorBoard event files created in run_dir
        try:
            if tensorboard:
                self.logs.append(TensorBoardLog(run_dir, resume_step))
                self.event_files = self.logs[-1].files
            if wandb_project:
                self.logs.append(WandbLog(wandb_project, run_dir, config, resume=resume_step is not None))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def names(wandb_project: str) -> list[str]:
        """What the loggers write into the run directory at fixed names (W&B's), before they write it."""
        return [WANDB_ID_FILE, WANDB_DIR] if wandb_project else []

    def write(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        for log in self.logs:
            log.write(int(record["step"]), values)

    def close(self) -> None:
        for log in self.logs:
            log.close()
        self.logs = []


def openrlhf_flags(tensorboard: bool, wandb_project: str, out_dir: str, run_name: str) -> dict[str, Any]:
    """The same choices as OpenRLHF 0.11.2 flags. OpenRLHF has no on/off switches for them: TensorBoard is on when
    ``--logger.tensorboard_dir`` is given (it writes ``<dir>/<run_name>``), W&B when ``--logger.wandb.key`` is
    non-empty; OpenRLHF logs in with that key only if W&B has none already, and not at all in offline mode. So mmrl
    never passes a real key (it would show in the printed command): the value is a marker, and the launcher runs
    OpenRLHF with ``WANDB_MODE=offline`` unless this machine is logged in (:func:`wandb_mode`)."""
    flags: dict[str, Any] = {}
    if tensorboard or wandb_project:
        flags["logger.wandb.run_name"] = run_name
    if tensorboard:
        flags["logger.tensorboard_dir"] = f"{out_dir}/tensorboard"
    if wandb_project:
        flags.update({"logger.wandb.project": wandb_project, "logger.wandb.key": OPENRLHF_WANDB_KEY})
    return flags
