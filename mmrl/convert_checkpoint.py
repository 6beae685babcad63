"""``python -m mmrl.convert_checkpoint RUN_DIR``: rewrite an older mmrl's checkpoints in today's format.

Older mmrl wrote each checkpoint as one pickled ``state.pt``; mmrl no longer loads those (unpickling can run code
hidden in a file). This command reads each such file of ``RUN_DIR/checkpoints/step_*`` through torch's restricted
loader (``weights_only=True``), which builds tensors and plain containers and, here, only the few other types such a
checkpoint holds (NumPy's RNG key, the replay history's responses); a file that names anything else is refused, not
run. It then writes the three files of today's format (mmrl/run/checkpoint.py) beside it, and the run resumes or
evaluates as before. ``state.pt`` itself is left in place: remove it once you no longer need it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.batch import Response
from mmrl.cli import OneLineParser, run_cli
from mmrl.errors import UserError
from mmrl.rewards.base import RewardResult
from mmrl.run.checkpoint import (
    DIGEST,
    LEGACY_DIGEST,
    LEGACY_STATE,
    PARTIAL_PREFIX,
    STATE,
    TENSORS,
    file_sha256,
    step_folders,
    write_state,
)

log = logging.getLogger("mmrl")
_reconstruct = np._core.multiarray._reconstruct
_scalar = np._core.multiarray.scalar
# What an older checkpoint holds besides tensors and containers; a pickle written by NumPy 1 names its functions by
# their old module, numpy.core.
LEGACY_TYPES = [Response, RewardResult, np.ndarray, np.dtype, _reconstruct, _scalar,
                (_reconstruct, "numpy.core.multiarray._reconstruct"), (_scalar, "numpy.core.multiarray.scalar"),
                *(type(np.dtype(t)) for t in (np.uint32, np.int64, np.int32, np.float64, np.float32, np.bool_))]


def _plain(value: Any) -> Any:
    """``value`` with dataclasses as dicts and NumPy values as lists and numbers: what a checkpoint stores today."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def read_legacy(path: Path) -> dict[str, Any]:
    """An older mmrl's ``state.pt`` through torch's restricted loader; ValueError (one line) for anything else."""
    digest = path.parent / LEGACY_DIGEST
    if digest.is_file() and file_sha256(path) != digest.read_text().strip():
        raise UserError(f"{path} is damaged (its SHA-256 does not match {LEGACY_DIGEST}); not converted")
    try:
        with torch.serialization.safe_globals(LEGACY_TYPES):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        first = next((line for line in lines if "unsupported" in line.lower()), lines[0] if lines else "")
        raise UserError(f"{path} holds what an mmrl checkpoint never does ({first.strip()[:200]}); not converted, "
                         f"and nothing in it was run") from None
    except (OSError, RuntimeError, EOFError) as exc:
        raise UserError(f"{path} cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise UserError(f"{path} is not a checkpoint of mmrl.train (no model state)")
    return _plain(state)


def convert_folder(folder: Path) -> None:
    """Write today's files for ``folder/state.pt``; ``state.json``, whose presence marks the format, comes last. A
    file of today's names already there is replaced only when it holds what the conversion writes (a conversion
    killed before its ``state.json``): an older mmrl never wrote those names, so any other is someone's."""
    state = read_legacy(folder / LEGACY_STATE)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=PARTIAL_PREFIX))  # removed at the next start if left
    try:
        write_state(tmp, state)
        for name in (TENSORS, DIGEST):
            there = folder / name
            if os.path.lexists(there) and (there.is_symlink() or not there.is_file()
                                           or file_sha256(there) != file_sha256(tmp / name)):
                raise UserError(f"{there} is not an older mmrl checkpoint's file and the conversion would replace "
                                 f"it; move it away first ({folder} was not converted)")
        for name in (TENSORS, DIGEST, STATE):
            os.replace(tmp / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_run(run_dir: Path) -> list[Path]:
    """Convert every older checkpoint of ``run_dir``; the converted folders. ValueError (one line) at the first that
    cannot be."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        raise UserError(f"{run_dir} has no checkpoints folder; is it a run directory of mmrl.train?")
    todo = [f for f in step_folders(root) if (f / LEGACY_STATE).is_file() and not (f / STATE).exists()]
    for folder in todo:
        convert_folder(folder)
        log.info("converted %s", folder)
    return todo


def _main(argv: list[str] | None) -> int:
    parser = OneLineParser(prog="python -m mmrl.convert_checkpoint", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run directory of mmrl.train whose checkpoints are pickled state.pt files")
    args = parser.parse_args(argv)
    done = convert_run(Path(args.run_dir))
    if done:
        print(f"converted {len(done)} checkpoint(s) of {args.run_dir}; their {LEGACY_STATE} files were left in place")
    else:
        print(f"{args.run_dir}: no checkpoint to convert")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
