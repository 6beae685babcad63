"""A GGUF file's de-quantised copy, written once into the shared cache and loaded from there afterwards.

transformers de-quantises a GGUF file on every load: for SmolLM2-135M (Q4_1) that is ~30-45 s and a peak of the GGUF
reader's buffers, the tokenizer rebuilt from GGUF metadata (~0.7 GB and ~6 s on its own) and the float32 weights at
once. The first load writes the de-quantised float32 weights (safetensors) and the tokenizer with ``save_pretrained``
into ``cache_root()/models/gguf-<file stem>-<SHA-256 of the file, 16 hex digits>-<GGUF_CACHE_VERSION>``; every later
load is an ordinary checkpoint load (a few seconds, about the size of the weights). The key is the file's content, not
its size and modification time: a GGUF file replaced by another of the same size and time (``cp -p``, an archive)
gets its own copy, and never the other's weights; hashing reads the file once per load (about a second per GB). The
version is bumped whenever the conversion changes.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from pathlib import Path

import torch

from mmrl.cache import build_once, cache_root
from mmrl.errors import UserError

GGUF_CACHE_VERSION = "v1"  # bump when the conversion below changes: nobody's cached copy is overwritten


def cached_copy_dir(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """Where the de-quantised copy of ``gguf_path`` lives (whether or not it exists yet)."""
    with open(gguf_path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    name = f"gguf-{gguf_path.stem}-{digest[:16]}-{GGUF_CACHE_VERSION}"
    return (cache_dir or cache_root()) / "models" / name


def dequantised_copy(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """The directory of ``gguf_path``'s float32 copy (config, safetensors weights, tokenizer), converting on first use.

    Written into a temporary directory and renamed into place (``mmrl.cache.build_once``): a concurrent reader sees
    either nothing or the whole copy, and of two first loads at once one converts while the other waits for it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(gguf_path)
    target = cached_copy_dir(gguf_path, cache_dir)
    def convert(tmp: Path) -> None:
        logging.getLogger("mmrl").info("de-quantising %s once into %s (later loads read the copy)", gguf_path, target)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        tokenizer.save_pretrained(tmp)
        del tokenizer  # the GGUF tokenizer's buffers go before the weights are read
        loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        # transformers marks a GGUF-loaded model as quantised and refuses to save it; its weights are plain float32,
        # so they go into a fresh model of the same config (no quantisation entry) that saves as any checkpoint.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        del loaded
        model.save_pretrained(tmp)

    return build_once(target, convert, "config.json")


# the smallest a GGUF header's entries can be: a tensor's name length, one dimension, type and offset; a metadata
# entry's key length, value type and a one-byte value
TENSOR_INFO_BYTES, METADATA_BYTES = 8 + 4 + 8 + 4 + 8, 8 + 4 + 1


def check_gguf(path: Path) -> None:
    """UserError (one line naming the file) unless ``path`` is a whole GGUF file: its magic, a version transformers
    reads, entry counts that fit the file (a count that lies makes a reader allocate or loop for it), a header the
    ``gguf`` reader parses and tensor data inside the file (a truncated download ends mid-tensor)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != b"GGUF":
        raise UserError(f"model: {path} is not a GGUF file (it does not start with the GGUF magic)")
    version, tensors, entries = struct.unpack("<IQQ", head[4:])
    if version not in (2, 3):
        raise UserError(f"model: {path} is GGUF version {version}; versions 2 and 3 are read")
    if tensors * TENSOR_INFO_BYTES + entries * METADATA_BYTES > size:
        raise UserError(f"model: {path} is damaged: its header lists {tensors} tensors and {entries} metadata "
                         f"entries, more than its {size} bytes can hold")
    try:
        from gguf import GGUFReader
    except ImportError:  # transformers needs it to read the file at all, and says so
        return
    try:
        reader = GGUFReader(path)
        ends = [int(t.data_offset) + int(t.n_bytes) for t in reader.tensors]
    except Exception as exc:  # noqa: BLE001 -- the parser's own failure on a damaged file, whatever its kind
        raise UserError(f"model: {path} is damaged: the GGUF reader stopped at it ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]})") from None
    if len(ends) != tensors or any(end > size for end in ends):
        raise UserError(f"model: {path} is damaged or truncated: its tensors end past its {size} bytes")
