"""The compact result file every benchmark writes, and that docs/results.md is generated from.

A benchmark keeps its bulky output (runs, curves, per-step records) in its ``--out`` folder and writes one summary
beside it: ``<out>.json``. By default ``--out`` is ``runs/bench/<name>``, which git ignores, so trying a benchmark
leaves the checkout as it was. ``--publish`` writes into ``benchmarks/results/<name>`` instead (``--publish`` of
learning.py gives ``benchmarks/results/learning.json``), replacing the published summary of that table. A published
summary is small (< 100 KB) and is committed; ``python benchmarks/report.py`` renders every one into docs/results.md.
A summary says how to get the figure again (the command, the machine, the versions, the seeds) and holds the
figure's per-seed values, so the page states mean, standard error and range from data rather than from prose.

    rows = [result_row("gpg", "held-out pass@1 lift", {0: 0.17, 1: 0.12, 2: 0.15})]
    write_summary(Path(args.out), "Embedded geoqa demo: GPG lifts held-out pass@1", rows, seeds=[0, 1, 2])
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

SCHEMA = "mmrl-result/1"
MAX_BYTES = 100_000
ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "benchmarks" / "results"  # what docs/results.md renders; written only on --publish
RUNS = Path("runs") / "bench"  # a user's own runs; git ignores every runs/ folder
# The CPU flags that decide which kernels PyTorch and MKL pick, and so the last bits of every float result.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "fma", "asimd", "sve")


def published(name: str) -> Path:
    """``benchmarks/results/<name>``, relative when run from the repository root (as the published commands are)."""
    path = PUBLISHED / name
    try:
        return path.relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def add_out_arguments(parser: argparse.ArgumentParser, name: str, *, option: str = "--out",
                      default: str | None = None, summary: bool = True,
                      what: str = "folder of the run's own files; the summary is written beside it as <out>.json",
                      ) -> None:
    """``option`` (``--out``) and, for a benchmark that writes a summary, ``--publish``, which sets it to
    ``benchmarks/results/<name>``; the two exclude each other. ``default``: where a run goes without either
    (``runs/bench/<name>``; "" for no summary). Results are published on purpose only: a default run leaves the
    published figures, and the checkout, as they were."""
    default = str(RUNS / name) if default is None else default
    where = f"default: {default}, a folder of yours that git ignores" if default else "default: none"
    if not summary:
        parser.add_argument(option, default=default, help=f"folder of the run's files ({where}); this benchmark "
                            "writes no summary for docs/results.md")
        return
    group = parser.add_mutually_exclusive_group()
    group.add_argument(option, default=default, help=f"{what} ({where}; with --publish: {published(name)})")
    group.add_argument("--publish", dest=option.lstrip("-").replace("-", "_"), action="store_const",
                       const=str(published(name)),
                       help=f"publish: the summary goes to {published(name)}.json, replacing the one docs/results.md "
                            f"renders (the run's files, if any, beside it in {published(name)}/); then run "
                            "`python benchmarks/report.py` and commit both")


def machine() -> dict[str, Any]:
    """Architecture, usable cores, CPU model and the kernel-relevant CPU flags of this machine."""
    # platform.processor() is often only the architecture ("x86_64"): the CPU's model name is read first
    cpu, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model name") and not cpu:
                cpu = value.strip()
            if key.strip() in ("flags", "Features"):
                flags = set(value.split())
    except OSError:  # not Linux: the flags are unknown, the rest still holds
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = cpu or (platform.processor() if platform.processor() != platform.machine() else "")
    return {"arch": platform.machine(), "cores": cores, "cpu": cpu,
            "flags": sorted(f for f in KERNEL_FLAGS if f in flags)}


def source_commit() -> str | None:
    """The git commit of the code that measured, with ``+changes`` when tracked files differ from it (the results
    folder aside: writing results changes it); None outside a git checkout."""
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True,
                                  timeout=30).stdout.strip()

        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if changed else "")


def versions() -> dict[str, str]:
    """Versions of Python and of the libraries that move results: torch, transformers and (when imported) the
    trainers a benchmark compares with, TRL and verl."""
    import torch
    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__,
             "transformers": transformers.__version__}
    for other in ("trl", "verl"):
        if other in sys.modules:
            found[other] = str(getattr(sys.modules[other], "__version__", "unknown"))
    return found


def result_row(label: str, metric: str, values: dict[Any, float], unit: str = "", **tags: Any) -> dict[str, Any]:
    """One claim: ``values`` per seed (or per repeat); its mean, standard error (n - 1) and range are derived here.
    ``tags`` say what was measured in fields a program can match (task, options, algo, key, steps): `mmrl.expect`
    reads them to set a user's run beside the published figure."""
    if not values:
        raise ValueError(f"result row {label!r}: no values")
    numbers = [float(v) for v in values.values()]
    if not all(math.isfinite(v) for v in numbers):
        raise ValueError(f"result row {label!r}: a value is not finite: {values}")
    se = statistics.stdev(numbers) / math.sqrt(len(numbers)) if len(numbers) > 1 else None
    return {"label": label, "metric": metric, "unit": unit, "values": {str(k): v for k, v in values.items()},
            "n": len(numbers), "mean": statistics.mean(numbers), "se": se, "min": min(numbers), "max": max(numbers),
            **({"tags": tags} if tags else {})}


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran, as a user would type it from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    try:
        script = script.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return shlex.join(["python", str(script), *argv[1:]])


def publish_figure(out: Path, png: Path) -> str | None:
    """Copy a benchmark's PNG to ``docs/img/<out name>.png`` when its summary is one of the repository's own
    (``out`` inside benchmarks/results/), and return that path for the summary; elsewhere leave the docs alone."""
    if Path(out).resolve().parent != PUBLISHED or not Path(png).is_file():
        return None
    target = ROOT / "docs" / "img" / f"{Path(out).name}.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, target)
    return target.relative_to(ROOT).as_posix()


def write_summary(out: Path, title: str, rows: list[dict[str, Any]], *, seeds: list[int], notes: str = "",
                  figure: str | None = None, command: str | None = None,
                  cases: list[dict[str, str]] | None = None, measured_on: dict[str, Any] | None = None) -> Path:
    """Write ``<out>.json`` (see the module docstring) and return its path. ``cases``: a table of named cases and
    their outcomes (``case``, ``what``, ``outcome``, ``detail``), for checks that are not measurements.
    ``measured_on``: ``date``, ``machine``, ``versions`` (and ``commit``) of figures measured on another machine
    (a GPU machine's results summarised here); by default this machine's, today, at this checkout's commit."""
    out = Path(out)
    where = {"date": datetime.date.today().isoformat(), "machine": machine(), "versions": versions(),
             "commit": source_commit(), **(measured_on or {})}
    summary = {"schema": SCHEMA, "name": out.name, "title": title, "command": command or command_line(),
               "date": where["date"], "machine": where["machine"], "versions": where["versions"],
               "commit": where["commit"],
               "seeds": list(seeds), "rows": rows, "notes": notes, "figure": figure}
    if cases:
        summary["cases"] = cases
    text = json.dumps(summary, indent=1, sort_keys=True) + "\n"
    if len(text.encode()) > MAX_BYTES:
        raise ValueError(f"summary {out}.json would be {len(text.encode())} bytes; keep per-step data in {out}/")
    path = out.parent / f"{out.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    print(f"wrote {path}")
    return path
