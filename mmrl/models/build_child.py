"""The child process that builds an embedded model: ``python -m mmrl.models.build_child NAME DIRECTORY [STEPS]``.

`mmrl.models.build` starts it with the CPU kernels pinned (``pinned_kernel_env``), because the kernels a process uses
are chosen once, when PyTorch and MKL start: the parent cannot change its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mmrl.models.embedded import write_embedded

if __name__ == "__main__":
    name, directory, *steps = sys.argv[1:]
    write_embedded(name, Path(directory), int(steps[0]) if steps else None)
