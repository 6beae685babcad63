"""Which recipe builds which embedded model, and how one build runs: in this process with one thread and fixed seeds
(`write_embedded`), writing the record of how it was built beside the files; a build child gets the pinned CPU kernels
of `pinned_kernel_env` (why: `mmrl.models.recipes.embedded`).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from mmrl.cache import (
    EMBEDDED_AGENT_NAME,
    EMBEDDED_GROUNDING_NAME,
    EMBEDDED_MOE_NAME,
    EMBEDDED_NAME,
    EMBEDDED_VL_NAME,
    RECIPE_VERSIONS,
)
from mmrl.models.recipes.embedded import build_agent, build_dense, build_moe
from mmrl.models.recipes.embedded_vl import build_tiny_grounding_vl, build_tiny_vl
from mmrl.models.shipped import BUILD_RECORD

# name -> builder(steps): (model, tokenizer or processor); steps None runs the recipe's own pre-training length
BUILDERS = {EMBEDDED_NAME: build_dense, EMBEDDED_MOE_NAME: build_moe, EMBEDDED_VL_NAME: build_tiny_vl,
            EMBEDDED_AGENT_NAME: build_agent, EMBEDDED_GROUNDING_NAME: build_tiny_grounding_vl}


# The kernels of every x86-64 build (see `mmrl.models.recipes.embedded`): PyTorch's own, MKL's and oneDNN's, each
# capped at AVX2, which every x86-64 CPU since 2013 has. On a CPU without AVX2 each library falls back to what the
# CPU has.
PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
KERNELS_PINNED_HERE = platform.machine().lower() in ("x86_64", "amd64")


def pinned_kernel_env() -> dict[str, str]:
    """This process's environment for a build child: ``PINNED_KERNELS`` on x86-64, and mmrl importable."""
    env = dict(os.environ)
    if KERNELS_PINNED_HERE:
        env.update(PINNED_KERNELS)
    source_root = str(Path(__file__).resolve().parents[3])  # the folder holding the mmrl package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH", "")) if p)
    return env


def write_embedded(name: str, directory: Path, steps: int | None = None) -> None:
    """Build embedded model ``name`` in this process and save it into ``directory`` (one thread, fixed seeds), with
    a record of how (``BUILD_RECORD``). ``steps``: pre-training steps instead of the recipe's (each phase's, for a
    recipe of several), for a quick check of the recipe."""
    import transformers

    torch.set_num_threads(1)  # bit-identical result whatever the machine's core count
    with torch.random.fork_rng():
        model, tokenizer = BUILDERS[name](steps)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)  # a processor (vision default) saves its tokenizer and image processor
    record = {"name": name, "recipe": RECIPE_VERSIONS[name], "steps": steps, "machine": platform.machine(),
              "kernels": torch.backends.cpu.get_cpu_capability(),
              "pinned": {k: os.environ.get(k) for k in PINNED_KERNELS},
              "torch": torch.__version__, "transformers": transformers.__version__}
    (directory / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n")
