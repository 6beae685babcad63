"""Make OpenRLHF 0.11.2 importable on a CPU, the way OpenRLHF's own tests do.

OpenRLHF imports ``flash_attn`` (ring attention, packing) and ``vllm`` (rollout engines) at module level. Both are
CUDA-only: they cannot be installed on this machine. Their modules are replaced by empty stand-ins in ``sys.modules``
while OpenRLHF's modules are imported; nothing any mmrl test runs calls into them (packing, ring attention and vLLM
generation are off or not exercised), so a test that reached them would fail, not pass.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
from unittest.mock import MagicMock

CUDA_ONLY = ("flash_attn", "flash_attn.bert_padding", "flash_attn.utils", "flash_attn.utils.distributed", "vllm",
             "vllm.inputs", "vllm.utils")


def install() -> list[str]:
    """Put the stand-ins into ``sys.modules``; returns the names inserted."""
    inserted = []
    for name in CUDA_ONLY:
        if name not in sys.modules:
            stub = MagicMock(name=name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = stub
            inserted.append(name)
    return inserted


@contextlib.contextmanager
def openrlhf_importable():
    """Import OpenRLHF (and mmrl.openrlhf) inside this block; the stand-ins are removed afterwards so later code sees
    flash_attn and vllm as absent again (modules already imported keep working)."""
    inserted = install()
    try:
        yield
    finally:
        for name in inserted:
            sys.modules.pop(name, None)
