"""Failures that are reported as one line by the command line (mmrl.cli.run_cli), not as a traceback.

`UserError` is bad input (config, data, paths): exit code 2. `RunError` is a failure of the machine: exit code 1.
Every other exception is a bug (in mmrl, a plug-in or a library) and keeps its traceback. This module imports nothing
from mmrl, so every layer may raise these.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path


class UserError(ValueError):
    """Bad input that the user can fix (a flag, a config field, a data file or row, a path): one line naming it, exit
    code 2. A ValueError so that callers catching bad input as ValueError keep working; a plain ValueError is not
    bad input but a bug, and keeps its traceback."""


class RunError(RuntimeError):
    """The machine failed the run (a disk full during a checkpoint, ...): one line, exit code 1."""


class Interrupted(KeyboardInterrupt):
    """A second SIGINT/SIGTERM while the first one's checkpoint was pending: stop now, exit 128 + ``signum``.
    ``checkpoint``: the newest checkpoint on disk then (None: the run has none)."""

    def __init__(self, signum: int, checkpoint: Path | None = None):
        super().__init__(f"signal {signum}")
        self.signum, self.checkpoint = signum, checkpoint


def checkpoint_note(checkpoint: Path | None) -> str:
    """What a stopped run leaves to continue from, for its stop message."""
    if checkpoint is None:
        return "no checkpoint was written, so there is nothing to resume; start the run again"
    return f"the last checkpoint is {checkpoint}, intact; continue with --resume"


def printable(text: str) -> str:
    """``text`` with its control, format and line-separator characters escaped (``\\n``, ``\\u202e``): a path or a
    value a user gave is printed inside mmrl's own lines, and a newline or a right-to-left override in it would
    otherwise start a line of its own or reorder the line, forging output that mmrl did not write."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " or unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp")
                   else c.encode("unicode_escape").decode("ascii") for c in text)
