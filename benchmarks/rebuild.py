"""A rebuild of an embedded model from its recipe against the shipped copy: same weights? same skill?

The package ships each embedded model as built files (mmrl/models/weights, `mmrl.models.shipped`); its recipe, run
again on another machine or with other torch / transformers versions, can give other weights. This rebuilds the
model (``python -m mmrl.models.recipes.build``, or takes ``--rebuilt DIR``), compares the files' sha256, and evaluates
both with the manifest's own measuring command (``python -m mmrl.eval`` with the arguments the manifest records), one
after the other on this machine. Prints a table with the manifest's recorded figures beside them and writes
``rebuild.json`` into ``--out``.

    python benchmarks/rebuild.py [--model embedded:tiny-qwen2] [--rebuilt DIR] [--out runs/rebuild]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

from mmrl.models.recipes.build import build_model
from mmrl.models.shipped import file_sha256, read_manifest, shipped_model

SKILL_KEYS = ("pass@1", "format_rate", "miou", "acc@0.5", "success_rate", "valid_action_rate")


def evaluate(model: str, eval_args: list[str], out: Path) -> tuple[dict, float]:
    """(result, wall seconds) of ``python -m mmrl.eval --model MODEL ARGS`` in a child process."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mmrl.eval", "--model", model, *eval_args, "--out", str(out)], check=True,
                   stdin=subprocess.DEVNULL)
    return json.loads(out.read_text()), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded:tiny-qwen2")
    parser.add_argument("--rebuilt", default="", help="a rebuild to compare (default: build one into --out)")
    parser.add_argument("--out", default="runs/rebuild")
    args = parser.parse_args()
    entry = read_manifest()["models"].get(args.model)
    if entry is None:
        raise SystemExit(f"error: {args.model} is not shipped")
    skill = entry.get("skill") or {}
    if "eval_args" not in skill:
        raise SystemExit(f"error: the manifest records no mmrl.eval arguments for {args.model} (its skill: "
                         f"{skill.get('command', 'none')})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shipped = shipped_model(args.model)
    build_seconds = None
    if args.rebuilt:
        rebuilt = Path(args.rebuilt)
    else:
        rebuilt = out / f"rebuilt-{entry['dir']}"
        start = time.perf_counter()
        build_model(args.model, rebuilt)
        build_seconds = time.perf_counter() - start
    same_files = {name: (rebuilt / name).is_file() and file_sha256(rebuilt / name) == digest
                  for name, digest in entry["files"].items()}
    results = {}
    for label, model in (("shipped", args.model), ("rebuilt", str(rebuilt))):
        result, seconds = evaluate(model, skill["eval_args"], out / f"eval-{label}.json")
        results[label] = {"result": result, "seconds": seconds}
    rows = [("recorded", skill["result"]), ("shipped", results["shipped"]["result"]),
            ("rebuilt", results["rebuilt"]["result"])]
    keys = [k for k in SKILL_KEYS if any(k in r for _, r in rows)]
    print(f"\n{args.model}: {skill['command']} (the rebuilt one with --model {rebuilt})")
    print(f"{'':10}" + "".join(f"{k:>14}" for k in keys))
    for label, result in rows:
        print(f"{label:10}" + "".join(f"{result[k]:>14.4f}" if k in result else f"{'-':>14}" for k in keys))
    differing = sorted(name for name, same in same_files.items() if not same)
    print(f"files identical to the shipped ones: {'all' if not differing else 'all but ' + ', '.join(differing)}")
    meta = {"command": " ".join(["python", "benchmarks/rebuild.py", *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d"),
            "machine": platform.machine(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
            "kernels": torch.backends.cpu.get_cpu_capability()}
    record = {"meta": meta, "model": args.model, "shipped": str(shipped), "rebuilt": str(rebuilt),
              "build_seconds": build_seconds, "same_files": same_files, "shipped_build": entry["build"],
              "rebuilt_build": json.loads((rebuilt / "build.json").read_text())
              if (rebuilt / "build.json").is_file() else None,
              "eval_command": skill["command"], "recorded": skill["result"], **results}
    (out / "rebuild.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {out / 'rebuild.json'}")


if __name__ == "__main__":
    main()
