"""What one held-out evaluation of an ALFWorld example config costs: the wall and CPU seconds of
``python -m mmrl.eval`` on each of the config's ``evaluation.sets``, one set per process, on one thread.

    OMP_NUM_THREADS=1 python benchmarks/alfworld_eval_cost.py --config examples/alfworld_grpo_warm_start.yaml \
        --sets greedy,sampled --publish

A run evaluates at step 0 and after its last step, so it pays this twice. The config's game set is built first by a
one-game evaluation that is not timed (building is paid once per machine, into the cache). CPU time (user + system,
from ``os.wait4``) is the figure to compare across machines: wall time grows with whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from summary import add_out_arguments, result_row, write_summary


def run(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``cmd``; a failed command stops the benchmark with its exit code."""
    begin = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - begin
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed (exit {os.waitstatus_to_exitcode(status)}): {' '.join(cmd)}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/alfworld_grpo_warm_start.yaml")
    parser.add_argument("--sets", default="greedy", help="comma-separated names of the config's evaluation sets")
    add_out_arguments(parser, "alfworld_eval_cost", what="where the summary goes, as <out>.json")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    sets = {s["name"]: s for s in (config.get("evaluation") or {}).get("sets") or []}
    names = [n for n in args.sets.split(",") if n]
    missing = [n for n in names if n not in sets]
    if missing:
        raise SystemExit(f"--sets: {args.config} has no evaluation set {missing[0]!r} (it has {', '.join(sets)})")
    base = [sys.executable, "-m", "mmrl.eval", "--config", args.config, "--model.threads", "1"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="alfworld-eval-cost-") as tmp:
        run([*base, "--evaluation.sets", json.dumps([sets[names[0]]]), "--max-problems", "1"])  # builds the games
        for name in names:
            out = Path(tmp) / f"{name}.json"
            wall, cpu = run([*base, "--evaluation.sets", json.dumps([sets[name]]), "--out", str(out)])
            result = json.loads(out.read_text())[name]
            games, per_game = result["games"], result["episodes_per_game"]
            label, tags = f"{name}: {games} held-out games × {per_game}", {"set": name, "config": args.config}
            print(f"{label}: {wall:.0f} s wall, {cpu:.0f} s CPU, pass@1 {result['pass@1']:.3f}")
            rows += [result_row(label, "CPU time of one evaluation", {0: cpu}, unit="s", **tags),
                     result_row(label, "wall time of one evaluation", {0: wall}, unit="s", **tags),
                     result_row(label, "held-out success (pass@1)", {0: result["pass@1"]}, **tags),
                     result_row(label, "env steps per episode", {0: result["episode_length"]}, **tags)]
    write_summary(Path(args.out), f"What one held-out evaluation of {args.config} costs", rows, seeds=[0],
                  notes="Each set evaluated alone by python -m mmrl.eval with --model.threads 1 (OMP_NUM_THREADS=1), "
                        "the game set already built; CPU time is user + system of that process. A run pays its "
                        "evaluation twice (step 0 and after the last step).")


if __name__ == "__main__":
    main()
