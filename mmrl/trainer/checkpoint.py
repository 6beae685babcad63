"""Checkpoints that make a resumed run bit-identical to an uninterrupted one on CPU.

A checkpoint holds the model and optimizer/scheduler state *and* every source of randomness and data order: torch's
RNG, Python's and NumPy's, the prompt sampler and GVPO's replay history. It is written to a temporary directory and
renamed into place, so a kill during the write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    ckpt_root = run_dir / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    target = ckpt_root / f"step_{step:07d}"
    tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=".tmp-"))
    torch.save({**state, "step": step, "rng": rng_state()}, tmp / "state.pt")
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    for old in sorted(ckpt_root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "checkpoints").glob("step_*/state.pt"))
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    # weights_only=False: the state holds Python RNG tuples and sampler state written by us, not foreign data.
    return torch.load(path, map_location="cpu", weights_only=False)
