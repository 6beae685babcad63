"""The child process that builds an embedded model:
``python -m mmrl.models.recipes.build_child NAME DIRECTORY [STEPS]``.

`mmrl.models.recipes.build` starts it with the CPU kernels pinned (``pinned_kernel_env``), because the kernels a
process uses are chosen once, when PyTorch and MKL start: the parent cannot change its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mmrl.cli import run_cli
from mmrl.models.recipes.registry import write_embedded


def _main(argv: list[str]) -> None:
    name, directory, *steps = argv
    write_embedded(name, Path(directory), int(steps[0]) if steps else None)


if __name__ == "__main__":
    sys.exit(run_cli(_main))  # a user error (a missing extra) prints one line, as the parent's own errors do
