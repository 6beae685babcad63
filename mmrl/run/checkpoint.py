"""Checkpoints that make a resumed run bit-identical to an uninterrupted one on CPU, in files that run no code.

A checkpoint holds the model and optimizer/scheduler state *and* every source of randomness and data order: torch's
RNG (CPU and CUDA), Python's and NumPy's, the prompt sampler and GVPO's replay history. Reading one never unpickles:
a shared or downloaded run directory is data, as safe to load as a safetensors file. The folder
``checkpoints/step_<step:07d>/`` holds three files:

* ``tensors.safetensors``: every tensor of the state (weights or LoRA adapters, AdamW moments, RNG states), named by
  its place in the state, e.g. ``model/lm_head.weight`` or ``optimizer/state/0/exp_avg``; a tensor stored twice
  under two names (tied weights) is written once.
* ``state.json``: ``{"format": "mmrl-checkpoint", "version": 1, "state": ...}``, the rest of the state as JSON (step,
  optimizer hyper-parameters, scheduler, sampler order and RNG, replay history, Python's and NumPy's RNG). A tensor
  appears as ``{"__tensor__": name}``, a tuple as ``{"__tuple__": [...]}`` and a mapping whose keys are not all
  strings as ``{"__dict__": [[key, value], ...]}``, so that the state reads back exactly as it was written.
* ``SHA256SUMS``: the SHA-256 of both files, in the format of ``sha256sum -c``. A truncated or bit-flipped file is
  found before it is used, and `load_latest` falls back to the newest intact checkpoint with a warning (resume and
  mmrl.eval alike). It guards against damage, not against whoever can write the folder.

A checkpoint of an older mmrl (a pickled ``state.pt``) is never loaded: unpickling can run any code hidden in the file.
It is refused with one line naming ``python -m mmrl.convert_checkpoint``, which rewrites it in this format through
torch's restricted loader (tensors, containers and the few types such a checkpoint holds, nothing else).

A checkpoint is written to a temporary directory and renamed into place, so a kill during the write leaves the
previous checkpoint intact; the half-written ``.tmp-*`` folder such a kill leaves is removed when the next run claims
the directory (`remove_partial_writes`). A failed write (a full disk included) removes its folder and raises `RunError`
with one line saying why.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.errors import RunError, UserError
from mmrl.files import file_sha256, remove_named_files

log = logging.getLogger("mmrl")
FORMAT, VERSION = "mmrl-checkpoint", 1
STATE = "state.json"
TENSORS = "tensors.safetensors"
DIGEST = "SHA256SUMS"
LEGACY_STATE = "state.pt"  # an older mmrl's pickled checkpoint: recognised, never loaded
LEGACY_DIGEST = "state.sha256"  # the SHA-256 an older mmrl wrote beside state.pt
# Every file a checkpoint writer of mmrl puts in its folder (today's three, an older mmrl's two). Removing or replacing
# a checkpoint removes these names only: a file a user put beside them (an evaluation's results) is not the run's.
WRITTEN = (STATE, TENSORS, DIGEST, LEGACY_STATE, LEGACY_DIGEST)
PARTIAL_PREFIX = ".tmp-"
# checkpoints/step_<step:07d>; a copy the user named step_0000060-keep or step_0000060.bak is no checkpoint of the run
STEP_FOLDER = re.compile(r"step_(\d{7,})")
# the names tempfile.mkdtemp(prefix=PARTIAL_PREFIX) gives: a user's ".tmp-notes" folder is not a write of ours
PARTIAL_WRITE = re.compile(re.escape(PARTIAL_PREFIX) + r"[a-z0-9_]{8}")
# safetensors' dtype names (https://github.com/huggingface/safetensors, the format's header)
SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL"}


class LegacyCheckpoint(UserError):
    """A checkpoint in the pickled format of an older mmrl: not read (see the module's docstring)."""


def rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and JSON values (NumPy's key as a list of ints)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------ state <-> files


class _Tensors:
    """The tensors of a state being encoded: a name for each, and one entry for views of the same memory."""

    def __init__(self) -> None:
        self.by_name: dict[str, torch.Tensor] = {}
        self.by_view: dict[tuple, str] = {}

    def add(self, tensor: torch.Tensor, name: str) -> str:
        tensor = tensor.detach()
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"checkpoint: tensor {name} has dtype {tensor.dtype}, which is not stored")
        view = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                tensor.stride(), tensor.dtype)
        if tensor.numel() and view in self.by_view:
            return self.by_view[view]
        while name in self.by_name:  # two mapping keys with the same text (1 and "1")
            name += "'"
        self.by_name[name] = tensor
        if tensor.numel():
            self.by_view[view] = name
        return name


def _join(where: str, key: Any) -> str:
    return f"{where}/{key}" if where else str(key)


def _encode(value: Any, tensors: _Tensors, where: str) -> Any:
    if isinstance(value, torch.Tensor):
        return {"__tensor__": tensors.add(value, where)}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, tensors, _join(where, k)) for k, v in value.items()}
        return {"__dict__": [[_encode(k, tensors, _join(where, "key")), _encode(v, tensors, _join(where, k))]
                             for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors, _join(where, i)) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, _join(where, i)) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    raise TypeError(f"checkpoint: {where} is a {type(value).__name__}, which a checkpoint does not store")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"__tensor__"}:
        return tensors[value["__tensor__"]]
    if set(value) == {"__tuple__"}:
        return tuple(_decode(v, tensors) for v in value["__tuple__"])
    if set(value) == {"__dict__"}:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__dict__"]}
    return {k: _decode(v, tensors) for k, v in value.items()}


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The safetensors format, streamed tensor by tensor through our own file (no second copy of the state in
    memory, and a full disk raises the OSError that says so)."""
    header: dict[str, Any] = {"__metadata__": {"format": FORMAT}}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for tensor in tensors.values():
            if tensor.numel():
                out.write(tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
        out.flush()
        os.fsync(out.fileno())


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors, containers and JSON values) into ``folder`` as the three files of a checkpoint."""
    tensors = _Tensors()
    tree = _encode(state, tensors, "")
    _write_safetensors(folder / TENSORS, tensors.by_name)
    _write_text(folder / STATE, json.dumps({"format": FORMAT, "version": VERSION, "state": tree}))
    _write_text(folder / DIGEST, "".join(f"{file_sha256(folder / name)}  {name}\n" for name in (STATE, TENSORS)))



def _why(exc: BaseException, where: Path) -> str:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on {where} ({shutil.disk_usage(where).free / 2**20:.1f} MiB free)"
    if isinstance(exc, OSError):
        return f"{os.strerror(exc.errno) if exc.errno else exc} ({where})"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write ``checkpoints/step_<step>`` atomically and keep the newest ``keep``; RunError (one line) on failure."""
    ckpt_root = run_dir / "checkpoints"
    target = ckpt_root / f"step_{step:07d}"
    tmp = None
    try:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=PARTIAL_PREFIX))
        write_state(tmp, {**state, "step": step, "rng": rng_state()})
        install(tmp, target)
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"checkpoint: cannot write step {step} into {ckpt_root}: {_why(exc, ckpt_root)}; the partial "
                       f"folder was removed and the previous checkpoint is intact") from exc
    except BaseException:  # a bug (a type a checkpoint does not store) or an interrupt: nothing half-written stays
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    # a folder that holds only what the run did not write (what pruning left) is no checkpoint to keep or prune
    written = [f for f in step_folders(ckpt_root) if any(os.path.lexists(f / name) for name in WRITTEN)]
    for old in written[:-keep]:
        try:
            _, left = remove_checkpoint(old)
        except OSError as exc:
            log.warning("checkpoint %s could not be pruned: %s", old, _why(exc, old))
            continue
        if left:
            log.warning("pruned checkpoint %s: left %s (not written by mmrl)", old, ", ".join(left))
    return target


def remove_checkpoint(folder: Path) -> tuple[list[str], list[str]]:
    """Remove the files a checkpoint writer put in ``folder`` (:data:`WRITTEN`), then the folder if that empties
    it. Returns (the names removed, the names left: whatever else the folder holds)."""
    return remove_named_files(folder, WRITTEN.__contains__)


def install(tmp: Path, target: Path) -> list[str]:
    """Put the checkpoint written in ``tmp`` at ``target``, replacing the checkpoint there. What ``target`` holds
    besides a writer's files stays, and the new files join it, the state last (a kill midway leaves a folder that
    is no checkpoint, or one without its digest, which is skipped as damaged). Returns the names left."""
    left: list[str] = []
    if target.is_symlink() or (os.path.lexists(target) and not target.is_dir()):
        raise RunError(f"checkpoint: {target} is a {'link' if target.is_symlink() else 'file'} that mmrl did not "
                       f"write, and a checkpoint is written only into a folder of its own; nothing was written "
                       f"there: move it away, then resume")
    if os.path.lexists(target):
        _, left = remove_checkpoint(target)
    if not left:
        os.replace(tmp, target)
        return left
    for name in sorted(os.listdir(tmp), key=lambda n: n == STATE):
        os.replace(tmp / name, target / name)
    tmp.rmdir()
    log.warning("checkpoint %s: replaced its files; left %s (not written by mmrl)", target, ", ".join(left))
    return left


def is_partial_write(path: Path) -> bool:
    """``path`` is what a checkpoint write killed midway leaves: a folder named as ``tempfile.mkdtemp`` names ours,
    holding nothing but a writer's files (:data:`WRITTEN`)."""
    return (PARTIAL_WRITE.fullmatch(path.name) is not None and path.is_dir() and not path.is_symlink()
            and all(name in WRITTEN for name in os.listdir(path)))


def remove_partial_writes(run_dir: Path) -> list[Path]:
    """Remove the folders of checkpoint writes that never finished (a kill -9 mid-write, `is_partial_write`). Only
    the run that holds the directory's lock may call this: another live run's write in progress looks the same."""
    root = Path(run_dir) / "checkpoints"
    found = sorted(p for p in root.glob(f"{PARTIAL_PREFIX}*") if is_partial_write(p)) if root.is_dir() else []
    for partial in found:
        shutil.rmtree(partial, ignore_errors=True)
    return found


def step_folders(root: Path) -> list[Path]:
    """The real folders of ``root`` named as checkpoints are (``step_<step:07d>``), by step."""
    found = [(int(m[1]), p) for p in root.glob("step_*") if (m := STEP_FOLDER.fullmatch(p.name))
             and p.is_dir() and not p.is_symlink()] if root.is_dir() else []
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint's folder, intact or not (see `load_latest`)."""
    found = checkpoints(run_dir)
    return found[-1] if found else None


def checkpoints(run_dir: Path) -> list[Path]:
    """Every checkpoint's folder (`step_folders` with a state, an older mmrl's included), oldest first."""
    return [folder for folder in step_folders(Path(run_dir) / "checkpoints")
            if (folder / STATE).exists() or (folder / LEGACY_STATE).exists()]


def legacy_message(folder: Path) -> str:
    run_dir = folder.parent.parent
    return (f"checkpoint {folder} was written by an older mmrl as a pickled {LEGACY_STATE}, which mmrl no longer "
            f"loads (unpickling a file can run code hidden in it); start a new run with another --out, or convert "
            f"the run with: python -m mmrl.convert_checkpoint {run_dir}")


def verify(folder: Path) -> None:
    """ValueError (one line) unless ``SHA256SUMS`` lists both files of the checkpoint with their digests."""
    digest_file = folder / DIGEST
    if not digest_file.is_file():
        raise UserError(f"checkpoint {folder} is damaged (it has no {DIGEST})")
    expected = {}
    for line in digest_file.read_text(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        expected[name] = digest
    for name in (STATE, TENSORS):
        if name not in expected:
            raise UserError(f"checkpoint {folder} is damaged ({DIGEST} does not list {name})")
        if not (folder / name).is_file():
            raise UserError(f"checkpoint {folder} is damaged ({name} is missing)")
        if file_sha256(folder / name) != expected[name]:
            raise UserError(f"checkpoint {folder} is damaged (the SHA-256 of {name} does not match {DIGEST})")


def read_state(folder: Path) -> dict[str, Any]:
    """The state of a checkpoint folder in this module's format, digests not checked (see `load_checkpoint`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        doc = json.loads((folder / STATE).read_text())
        tensors = load_file(folder / TENSORS, device="cpu")
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise UserError(f"{STATE} is not an mmrl checkpoint's")
        if doc.get("version") != VERSION:
            raise UserError(f"format version {doc.get('version')!r}; this mmrl reads version {VERSION}")
        return _decode(doc["state"], tensors)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError, SafetensorError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(f"checkpoint {folder} cannot be read ({type(exc).__name__}: {first[:200]})") from exc


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's state (``path``: its folder, or a file in it). `LegacyCheckpoint` for an older mmrl's pickled
    one; ValueError (one line) when it is truncated, bit-flipped or otherwise unreadable."""
    folder = Path(path)
    if not folder.is_dir():
        folder = folder.parent
    if not (folder / STATE).exists() and (folder / LEGACY_STATE).exists():
        raise LegacyCheckpoint(legacy_message(folder))
    verify(folder)
    state = read_state(folder)
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise UserError(f"checkpoint {folder} is not a checkpoint of mmrl.train (no model state)")
    problem = content_problem(state)
    if problem:
        raise UserError(f"checkpoint {folder} is damaged ({problem})")
    return state


def content_problem(state: dict[str, Any]) -> str:
    """What is wrong with the contents of a checkpoint's state, or "": SHA256SUMS vouches only that the files are
    those that were hashed, and a checkpoint edited (or written wrong) and re-hashed must fail here in one line, not
    in the middle of a resume (a step of -5 would train steps -4, -3, ...; NaN weights would train on NaN)."""
    step = state["step"]
    if type(step) is not int or step < 0:
        return f"{STATE}: step is {step!r}, not a whole number >= 0"
    model = state["model"]
    if not isinstance(model, dict) or not all(isinstance(t, torch.Tensor) for t in model.values()):
        return f"{STATE}: model is not a mapping of tensors"
    for name, tensor in model.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"{TENSORS}: model/{name} holds NaN or infinite values"
    return _rng_problem(state.get("rng"))


def _rng_problem(rng: Any) -> str:
    """What is wrong with a checkpoint's RNG state (as `rng_state` writes it), or ""."""
    if not isinstance(rng, dict):
        return f"{STATE}: rng is not a mapping of generator states"
    torch_state = rng.get("torch")
    size = torch.get_rng_state().numel()
    if not isinstance(torch_state, torch.Tensor) or torch_state.dtype != torch.uint8 or torch_state.numel() != size:
        return f"{TENSORS}: rng/torch is not torch's generator state ({size} bytes)"
    python = rng.get("python")
    if not (isinstance(python, (tuple, list)) and len(python) == 3 and isinstance(python[1], (tuple, list))
            and len(python[1]) == len(random.getstate()[1]) and all(type(k) is int for k in python[1])):
        return f"{STATE}: rng/python is not Python's generator state"
    numpy = rng.get("numpy")
    if not (isinstance(numpy, (tuple, list)) and len(numpy) == 5 and isinstance(numpy[1], (tuple, list))
            and len(numpy[1]) == 624 and all(type(k) is int and 0 <= k < 2**32 for k in numpy[1])
            and type(numpy[2]) is int and 0 <= numpy[2] <= 624):
        return f"{STATE}: rng/numpy is not NumPy's generator state (624 words and a position)"
    return ""


def load_latest(run_dir: Path) -> tuple[Path, dict[str, Any], list[Path]]:
    """(folder, state, unreadable newer folders) of the newest checkpoint that can be read; each one skipped is
    logged. ValueError when none can; `LegacyCheckpoint` at the first one of an older mmrl (never set aside)."""
    skipped = []
    for path in reversed(checkpoints(run_dir)):
        try:
            return path, load_checkpoint(path), skipped
        except LegacyCheckpoint:
            raise
        except ValueError as exc:
            log.warning("%s; falling back to the previous checkpoint", exc)
            skipped.append(path)
    if skipped:
        raise UserError(f"run {run_dir}: none of its {len(skipped)} checkpoints can be read")
    raise UserError(f"run {run_dir} has no checkpoint")


def set_aside(unreadable: Path) -> Path:
    """Rename an unreadable checkpoint folder out of the ``step_*`` sequence (kept for inspection, never pruned
    into or resumed from)."""
    folder = unreadable if unreadable.is_dir() else unreadable.parent
    target = folder.with_name(f"unreadable-{folder.name}")
    count = 1
    while os.path.lexists(target):  # one set aside before (and perhaps looked into): kept as well, under its name
        count += 1
        target = folder.with_name(f"unreadable-{folder.name}-{count}")
    os.replace(folder, target)
    return target
