"""Reading a DeepSpeed checkpoint (``--resume`` on the openrlhf backend) as data, never as code.

DeepSpeed reads its checkpoint files with ``torch.load(weights_only=False)``: full unpickling, which runs whatever a
crafted file names (a shell command as easily as a tensor). While :func:`weights_only_loading` is active, every
``torch.load`` of the process reads weights only, whatever its caller asks (torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD``,
read at each call), and the only classes it may build besides tensors and containers are the DeepSpeed types a
checkpoint of mmrl's runs holds (:data:`DEEPSPEED_TYPES`). A file that names anything else is refused with one line,
before any of it is built. mmrl's strategy (:mod:`mmrl.openrlhf.strategy`) loads every checkpoint under it.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from mmrl.errors import UserError

FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


def deepspeed_types() -> list[type]:
    """The classes a DeepSpeed ZeRO checkpoint pickles besides tensors, containers and numbers: the ZeRO stage, the
    loss scaler (``LossScaler`` in bf16, as mmrl trains; ``DynamicLossScaler`` when ``ds.param_dtype`` is fp16) and
    the flat-buffer addresses of ZeRO-1/2. Each holds plain numbers only."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def checkpoint_folder(load_dir: str | Path, tag: str | None) -> Path:
    """The folder DeepSpeed will read: ``load_dir/tag``, the tag named by ``load_dir/latest`` when not given."""
    load_dir = Path(load_dir)
    if tag is None and (load_dir / "latest").is_file():
        tag = (load_dir / "latest").read_text().strip()
    return load_dir / tag if tag else load_dir


def _refused_global(error: pickle.UnpicklingError) -> str:
    """The name torch's weights-only reader refused (its message goes on to suggest ways around the refusal)."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    return found.group(1) if found else "an object that is not a tensor"


def _file_naming(folder: Path, name: str) -> Path:
    """The file of ``folder`` whose pickle names ``name`` (read without running it), else the folder itself."""
    for path in sorted(folder.glob("*.pt")):
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except (ValueError, RuntimeError, OSError):  # not torch's zip format: the loader's error is all we have
            continue
        if any(n == name or n.endswith(f".{name}") for n in names):  # torch's message may leave out builtins.
            return path
    return folder


@contextmanager
def weights_only_loading(folder: str | Path) -> Iterator[None]:
    """Within: every ``torch.load`` reads weights only, DeepSpeed's checkpoint types allowed. A file of ``folder``
    (the checkpoint being read) that holds anything else raises ValueError, one line naming the file and what it
    names; nothing in it is run."""
    previous = os.environ.get(FORCE_WEIGHTS_ONLY)
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(deepspeed_types()):
            yield
    except pickle.UnpicklingError as exc:
        name = _refused_global(exc)
        raise UserError(f"{_file_naming(Path(folder), name)} holds what a DeepSpeed checkpoint never does (it names "
                         f"{name}); not loaded, and nothing in it was run") from None
    finally:
        if previous is None:
            os.environ.pop(FORCE_WEIGHTS_ONLY, None)
        else:
            os.environ[FORCE_WEIGHTS_ONLY] = previous
