"""Shared command-line plumbing: flags generated from the config dataclasses, errors as one line."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import mmrl.algos as algos
from mmrl.errors import Interrupted, RunError, UserError, checkpoint_note, printable
from mmrl.tasks import TASKS


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors (a flag without its value, a bad choice) are a UserError, so they end as one
    line and exit code 2 like every other bad input, not as a usage dump. Flags are never abbreviated: a task option
    such as ``--task.reward`` would otherwise be read as a prefix of ``--task.reward_model``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        raise UserError(f"{message} (see --help)")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "...'"


def catalogue(algorithms: bool = True) -> str:
    """The ``--help`` epilogue: the algorithms and their hyper-parameters (training only), the tasks and options."""
    import inspect

    lines = []
    if algorithms:
        lines.append("algorithms (--algo NAME, hyper-parameters as --algo.KEY VALUE):")
        for name in sorted(algos.ALGORITHMS):
            params = ", ".join(f"{k}={v!r}" for k, v in algos.hyperparameters(name).items())
            lines.append(f"  {name:8s} {params}")
    lines.append("tasks (--task NAME, options as --task.KEY VALUE):")
    for name in sorted(TASKS):
        sig = inspect.signature(TASKS[name])
        opts = ", ".join(f"{p.name}={_short(p.default)}" for p in sig.parameters.values())
        lines.append(f"  {name:10s} {opts}")
    return "\n".join(lines)


def add_dataclass_flags(parser: argparse.ArgumentParser, section: str, obj: Any, skip: set[str] = frozenset(),
                        only: set[str] | None = None) -> None:
    """``--section.field`` flags for the fields of ``obj`` (all but ``skip``, or just ``only``)."""
    group = parser.add_argument_group(section)
    for f in dataclasses.fields(obj):
        if f.name in skip or (only is not None and f.name not in only):
            continue
        default = getattr(obj, f.name)
        limit = f.metadata.get("range")
        text = f.metadata.get("help", "") + (f"; {limit.text}" if limit is not None else "")
        group.add_argument(f"--{section}.{f.name}", dest=f"{section}.{f.name}", default=argparse.SUPPRESS,
                           metavar=type(default).__name__.upper(),
                           help=f"{text} (default: {default!r})".replace("%", "%%"))


def split_open_flags(extra: list[str], sections: set[str]) -> dict[str, str]:
    """``--algo.beta 0.1`` / ``--task.path=x`` flags not known to argparse, for the open sections."""
    out: dict[str, str] = {}
    i = 0
    while i < len(extra):
        arg = extra[i]
        key, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        section = key.partition(".")[0]
        if not key or section not in sections or "." not in key:
            raise UserError(f"unknown option {arg!r} (see --help)")
        if not eq:
            if i + 1 >= len(extra):
                raise UserError(f"option {arg!r} needs a value")
            value = extra[i + 1]
            i += 1
        out[key] = value
        i += 1
    return out


def join_negative_values(argv: list[str]) -> list[str]:
    """``--optim.lr -1e-3`` as ``--optim.lr=-1e-3``: argparse takes a token starting with ``-`` for an option unless
    it looks like a plain integer or decimal, so scientific notation (``-1e-3``) and ``-inf`` would be refused."""
    out: list[str] = []
    for arg in argv:
        previous = out[-1] if out else ""
        if (arg.startswith("-") and _is_number(arg) and previous.startswith("--") and "=" not in previous
                and previous != "--"):
            out[-1] = f"{previous}={arg}"
        else:
            out.append(arg)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def debug() -> bool:
    """``MMRL_DEBUG=1``: a failure reported as one line shows its traceback first, to find where it was raised; the
    exit code stays the same, so scripts that test it behave alike with and without the switch."""
    return os.environ.get("MMRL_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


class PrintableFormatter(logging.Formatter):
    """Log lines whose message is one printable line (`mmrl.errors.printable`); a traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 -- logging's name
        record.message = printable(record.message)
        return super().formatMessage(record)


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run ``main``; a `UserError` (bad config or data) becomes one line on stderr and exit code 2, a `RunError` or a
    full disk one line and exit code 1, a second signal exit code 128 + signal. Any other exception is a bug and keeps
    its traceback (exit code 1). ``MMRL_DEBUG=1`` shows the traceback of a user error too."""
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    argv = join_negative_values(sys.argv[1:] if argv is None else list(argv))
    try:
        return main(argv) or 0
    except UserError as exc:
        if debug():
            traceback.print_exc()
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except RunError as exc:
        if debug():
            traceback.print_exc()
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # a folder made read-only or taken away meanwhile
            if debug():
                traceback.print_exc()
            where = printable(str(exc.filename)) if exc.filename else "an output file"
            print(f"error: cannot use {where}: {os.strerror(exc.errno)} (a file or folder this command reads or "
                  "writes was made read-only, or another user's)", file=sys.stderr)
            return 1
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"error: no space left on the device of {exc.filename or 'an output file'}", file=sys.stderr)
        return 1
    except Interrupted as exc:  # a second SIGINT/SIGTERM: the last checkpoint on disk stays valid
        print(f"stopped by signal {exc.signum}; {checkpoint_note(exc.checkpoint)}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (loading, evaluating): nothing was being written
        print("stopped (Ctrl-C)", file=sys.stderr)
        return 130
