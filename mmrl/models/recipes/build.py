"""``python -m mmrl.models.recipes.build NAME --out DIR [--steps N]``: build an embedded model from its recipe
into DIR.

The package ships the built models (`mmrl.models.shipped`); this runs a recipe of `mmrl.models.recipes.embedded` again,
into a new folder and never over the shipped copy: to check the recipe, to study it, or to build the next version (then
``python -m mmrl.models.recipes.ship`` adds it to the package). The build runs in a child process with one thread and,
on x86-64, AVX2 kernels (``pinned_kernel_env``), because a process picks its kernels when PyTorch starts. A rebuild on
another machine or with other library versions can give other weights than the shipped ones; ``python
benchmarks/rebuild.py`` compares its skill with theirs. ``--steps`` replaces the recipe's pre-training length (per
phase), for a quick check that the recipe runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mmrl.cache import EMBEDDED_VERSIONS
from mmrl.cli import OneLineParser, run_cli
from mmrl.errors import RunError, UserError
from mmrl.models.recipes.registry import BUILDERS, pinned_kernel_env
from mmrl.models.shipped import BUILD_RECORD, WEIGHTS_DIR, read_manifest


def build_command(name: str) -> str:
    """The command that builds ``name`` from its recipe, as the manifest records it."""
    return f"python -m mmrl.models.recipes.build {name} --out DIR"


def check_target(out: Path) -> None:
    """A build goes into a new or empty folder outside the shipped weights: nothing there is replaced."""
    resolved = out.resolve()
    if resolved == WEIGHTS_DIR or WEIGHTS_DIR in resolved.parents:
        raise UserError(f"--out: {out} is inside the shipped weights ({WEIGHTS_DIR}); build elsewhere and add it "
                         f"with python -m mmrl.models.recipes.ship")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out: {out} already exists and is not an empty folder; name a new one")


def build_model(name: str, out: Path, steps: int | None = None) -> Path:
    """Build ``name`` into the new folder ``out`` (written as a temporary sibling, renamed into place when done)."""
    if name not in BUILDERS:
        made_by = read_manifest()["models"].get(name, {}).get("command")
        if made_by:
            raise UserError(f"model: {name} has no recipe here; it was made by: {made_by}")
        raise UserError(f"model: no recipe for {name!r}; recipes: {', '.join(BUILDERS)}")
    if steps is not None and steps < 0:
        raise UserError(f"--steps must be >= 0, got {steps}")
    check_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".building-{out.name}-"))
    try:
        command = [sys.executable, "-m", "mmrl.models.recipes.build_child", name, str(tmp)]
        if steps is not None:
            command.append(str(steps))
        # a child process: the kernels are chosen when PyTorch starts (its errors reach this stderr as they happen)
        done = subprocess.run(command, env=pinned_kernel_env(), stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise RunError(f"model: building {name} failed (the build process exited with {done.returncode}; "
                               f"its error is printed above)")
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        if out.exists():
            out.rmdir()  # empty (check_target): the folder the user named for it
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _main(argv: list[str] | None) -> None:
    parser = OneLineParser(prog="python -m mmrl.models.recipes.build", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help=f"one of: {', '.join(BUILDERS)}")
    parser.add_argument("--out", required=True, help="a new (or empty) folder for the model")
    parser.add_argument("--steps", type=int, default=None,
                        help="pre-training steps (of each phase) instead of the recipe's")
    args = parser.parse_args(argv)
    out = build_model(args.name, Path(args.out), args.steps)
    print(f"built {args.name} ({EMBEDDED_VERSIONS[args.name]}) into {out}; how: {out / BUILD_RECORD}")


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
