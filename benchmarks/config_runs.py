"""A documented training command, run as written for each seed: held-out metric before the first update and after the
last, and the wall time, as a summary for docs/results.md.

The README's and guides' example configs promise a result; this measures it with exactly that config (only
``--run.seed`` and ``--out`` added). Each run is its own process; a seed whose run folder already holds a finished
run of the same config is read, not run again.

    python benchmarks/config_runs.py --config examples/alfworld_grpo_warm_start.yaml --seeds 0 \
        --out benchmarks/results/alfworld_warm_start_grpo
    python benchmarks/config_runs.py --config examples/alfworld_grpo_warm_start.yaml --seeds 0 \
        --out benchmarks/results/alfworld_warm_start_gmpo -- --algo gmpo

Seeds can run side by side as separate calls into the same ``--out`` (``--seeds 0`` and ``--seeds 1``); a last call
with every seed then reads their runs, wall times included, and writes the summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from summary import result_row, write_summary

WALL_FILE = "wall.json"  # beside the run's metrics: its wall time, kept for a later call that reads the run


def finished(run: Path, steps: int) -> list[dict] | None:
    """The run's records when it reached its last step with an evaluation there, else None."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    last = [r for r in records if r.get("step") == steps - 1 and "eval/pass@1" in r]
    return records if last else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the example config, run as written")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--metric", default="eval/pass@1", help="the held-out metric to report")
    parser.add_argument("--out", required=True)
    parser.add_argument("--note", default="", help="a sentence added to the summary's notes (e.g. how the runs "
                                                   "shared the machine)")
    parser.add_argument("overrides", nargs="*", metavar="FLAG",
                        help="flags after `--`, added to every run's command (e.g. -- --algo gmpo) and to its name")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    steps = int(config["run"]["steps"])
    out, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    starts, ends, rises, walls = {}, {}, {}, {}
    for seed in seeds:
        run = out / "runs" / f"seed{seed}"
        records, wall = finished(run, steps), None
        if records is None:
            begin = time.perf_counter()
            subprocess.run([sys.executable, "-m", "mmrl.train", "--config", args.config, "--run.seed", str(seed),
                            "--out", str(run), "--run.overwrite", "true", *args.overrides], check=True)
            wall = time.perf_counter() - begin
            records = finished(run, steps)
            if records is None:
                raise SystemExit(f"{run}: the run ended without its last evaluation")
            (run / WALL_FILE).write_text(json.dumps({"wall_s": wall}))
        elif (run / WALL_FILE).is_file():  # a run made by an earlier call (e.g. one seed per call, side by side)
            wall = json.loads((run / WALL_FILE).read_text())["wall_s"]
        evals = [r for r in records if args.metric in r]
        starts[seed], ends[seed] = evals[0][args.metric], evals[-1][args.metric]
        rises[seed] = ends[seed] - starts[seed]
        if wall is not None:
            walls[seed] = wall
        print(f"seed {seed}: {args.metric} {starts[seed]:.3f} -> {ends[seed]:.3f}")
    name = " ".join(["python -m mmrl.train --config", args.config, *args.overrides])
    rows = [result_row(name, f"held-out {args.metric} at step 0", starts),
            result_row(name, f"held-out {args.metric} after step {steps}", ends),
            result_row(name, f"held-out {args.metric} rise", rises)]
    if walls:
        rows.append(result_row(name, "wall time of the run", walls, unit="s"))
    changed = f", with {' '.join(args.overrides)}" if args.overrides else ", as written"
    write_summary(out, f"The documented run {args.config}{changed}", rows, seeds=seeds,
                  notes="Each seed is the config run as written, with --run.seed and --out added"
                        + (f" and {' '.join(args.overrides)}." if args.overrides else ".")
                        + (f" {args.note}" if args.note else ""))


if __name__ == "__main__":
    main()
