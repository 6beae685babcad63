"""A documented training command, run as written for each seed: held-out metric before the first update and after the
last, and the wall time, as a summary for docs/results.md.

The README's and guides' example configs promise a result; this measures it with exactly that config (only
``--run.seed`` and ``--out`` added). Each run is its own process; a seed whose run folder already holds a finished
run of the same config is read, not run again. ``--out`` names where the runs and the summary go: a folder under
``runs/bench/`` (git ignores it) keeps them yours; one in ``benchmarks/results/``, as below, publishes the summary,
replacing that table of docs/results.md.

    python benchmarks/config_runs.py --config examples/alfworld_grpo_warm_start.yaml --seeds 0 \
        --out benchmarks/results/alfworld_warm_start_grpo
    python benchmarks/config_runs.py --config examples/alfworld_grpo_warm_start.yaml --seeds 0 \
        --out benchmarks/results/alfworld_warm_start_gmpo -- --algo gmpo

Seeds can run side by side as separate calls into the same ``--out`` (``--seeds 0`` and ``--seeds 1``); a last call
with every seed then reads their runs, wall times included, and writes the summary. ``--algos`` compares objectives
on one config, each seed run once per objective:

    python benchmarks/config_runs.py --config examples/alfworld_turn_warm_start.yaml --algos grpo,gigpo,gmpo \
        --seeds 0,1,2,3,4 --out benchmarks/results/alfworld_turn

Every headline of the config's ``evaluation.sets`` is reported (the ALFWorld examples: greedy and sampled success
on 96 held-out games), with what one held-out problem is worth in it. ``run.seed`` draws a run's training game order
and its evaluation's sampling, so the runs of one seed share them across objectives and differ from another seed's:
each objective's rise minus the first one's is taken seed by seed, with its 95% t-interval.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from summary import paired_row, result_row, write_summary

WALL_FILE = "wall.json"  # beside the run's metrics: its wall time, kept for a later call that reads the run


def headline_metrics(config: dict) -> list[str]:
    """The held-out metrics a config's runs log as their headline: each ``evaluation.sets`` entry's
    (``eval/<name>/<metric>``), or ``eval/pass@1`` of the task's own held-out split when it names no set."""
    sets = (config.get("evaluation") or {}).get("sets") or []
    return [f"eval/{s['name']}/{s.get('metric', 'pass@1')}" for s in sets] or ["eval/pass@1"]


def finished(run: Path, steps: int, metrics: list[str]) -> list[dict] | None:
    """The run's records when it reached its last step with an evaluation of every metric there, else None."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    last = [r for r in records if r.get("step") == steps and all(m in r for m in metrics)]
    return records if last else None


def resolution(records: list[dict], metric: str) -> str:
    """What one problem is worth in ``metric`` (``eval/<set>/pass@1`` with the set's ``games``/``problems`` and
    samples logged beside it): the figure a reader needs to tell a gain from one more game won."""
    last = [r for r in records if metric in r][-1]
    prefix = metric.rsplit("/", 1)[0]
    count = last.get(f"{prefix}/games", last.get(f"{prefix}/problems"))
    samples = last.get(f"{prefix}/episodes_per_game", last.get(f"{prefix}/samples_per_problem", 1))
    if not count:
        return ""
    return (f"{metric}: {count} held-out problems × {samples} sample{'s' if samples != 1 else ''}, one problem is "
            f"{1 / count:.4f} of it (0.01 is {count / 100:.2f} problems)")


def run_seed(args, extra: list[str], run: Path, seed: int, steps: int,
             metrics: list[str]) -> tuple[list[dict], float | None]:
    """The records and wall time of one seed's run (``extra``: flags after the config), run here unless ``run``
    already holds it finished."""
    records, wall = finished(run, steps, metrics), None
    if records is None:
        begin = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mmrl.train", "--config", args.config, "--run.seed", str(seed),
                        "--out", str(run), "--run.overwrite", "true", *extra], check=True)
        wall = time.perf_counter() - begin
        records = finished(run, steps, metrics)
        if records is None:
            raise SystemExit(f"{run}: the run ended without its last evaluation")
        (run / WALL_FILE).write_text(json.dumps({"wall_s": wall}))
    elif (run / WALL_FILE).is_file():  # a run made by an earlier call (e.g. one seed per call, side by side)
        wall = json.loads((run / WALL_FILE).read_text())["wall_s"]
    return records, wall


def training_rows(name: str, records_of: dict[int, list[dict]]) -> list[dict]:
    """Rows of what the runs' training steps logged, where they logged it: the training success's change (mean of
    the last 3 steps minus the first 3), and the KL of each step's updated policy to π_old (``kl_step``: mean over
    the run's steps; ``kl_step_max``: the largest token's, over the whole run)."""
    train = {seed: [r for r in records if "step_time" in r] for seed, records in records_of.items()}
    rows = []
    if all(any("success_rate" in r for r in steps) for steps in train.values()):
        def change(steps: list[dict]) -> float:
            values = [r["success_rate"] for r in steps if r.get("success_rate") is not None]
            return sum(values[-3:]) / len(values[-3:]) - sum(values[:3]) / len(values[:3])
        rows.append(result_row(name, "training success_rate, last 3 steps minus first 3",
                               {seed: change(steps) for seed, steps in train.items()}))
    kl = {seed: [r for r in steps if r.get("kl_step") is not None] for seed, steps in train.items()}
    if all(kl.values()):
        rows.append(result_row(name, "kl_step (KL to π_old after a step's updates), mean over steps",
                               {seed: sum(r["kl_step"] for r in steps) / len(steps) for seed, steps in kl.items()}))
        rows.append(result_row(name, "kl_step_max (largest token's KL to π_old), max over steps",
                               {seed: max(r["kl_step_max"] for r in steps) for seed, steps in kl.items()}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the example config, run as written")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--algos", default="",
                        help="comma-separated objectives: every seed runs once with each (--algo A added), in one "
                             "summary that also gives each one's rise over the first one's, seed by seed")
    parser.add_argument("--metric", default="",
                        help="comma-separated held-out metrics to report (default: each evaluation.sets entry's "
                             "headline, eval/<name>/<metric>, or eval/pass@1 when the config names no set)")
    parser.add_argument("--out", required=True,
                        help="folder of the runs; the summary is written beside it as <out>.json. Under runs/bench/ "
                             "(git ignores it) it stays yours; in benchmarks/results/ it is published, replacing that "
                             "table of docs/results.md (then run `python benchmarks/report.py` and commit both)")
    parser.add_argument("--note", default="", help="a sentence added to the summary's notes (e.g. how the runs "
                                                   "shared the machine)")
    parser.add_argument("overrides", nargs="*", metavar="FLAG",
                        help="flags after `--`, added to every run's command (e.g. -- --algo gmpo) and to its name")
    args = parser.parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    steps = int(config["run"]["steps"])
    out, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    algos = [a for a in args.algos.split(",") if a]
    metrics = [m for m in args.metric.split(",") if m] or headline_metrics(config)
    rows, rises_of, scales = [], {}, {}
    for algo in algos or [""]:
        extra = (["--algo", algo] if algo else []) + args.overrides
        starts, ends, rises = ({m: {} for m in metrics} for _ in range(3))
        walls, records_of = {}, {}
        for seed in seeds:
            run = out / "runs" / (f"{algo}-seed{seed}" if algo else f"seed{seed}")
            records, wall = run_seed(args, extra, run, seed, steps, metrics)
            records_of[seed] = records
            for m in metrics:
                evals = [r for r in records if m in r]
                starts[m][seed], ends[m][seed] = evals[0][m], evals[-1][m]
                rises[m][seed] = ends[m][seed] - starts[m][seed]
                scales.setdefault(m, resolution(records, m))
                print(f"{algo or 'seed'} {seed}: {m} {starts[m][seed]:.3f} -> {ends[m][seed]:.3f}")
            if wall is not None:
                walls[seed] = wall
        name = " ".join(["python -m mmrl.train --config", args.config, *extra])
        for m in metrics:
            rows += [result_row(name, f"held-out {m} at step 0", starts[m]),
                     result_row(name, f"held-out {m} after step {steps}", ends[m]),
                     result_row(name, f"held-out {m} rise", rises[m])]
            if algo and algo != algos[0]:  # paired by seed: the same config, seed and start, another objective
                rows.append(paired_row(name, f"held-out {m} rise minus {algos[0]}'s rise (same seed)", rises[m],
                                       rises_of[algos[0]][m], algo=algo, against=algos[0], key=m))
        rows += training_rows(name, records_of)
        if walls:
            rows.append(result_row(name, "wall time of the run", walls, unit="s"))
        rises_of[algo] = rises
    flags = (["--algo", "|".join(algos)] if algos else []) + args.overrides
    changed = f", with {' '.join(flags)}" if flags else ", as written"
    paired = (" Runs of one seed share what the seed draws (run.seed: the training game order and the evaluation's "
              "sampling), so objectives are compared seed by seed: the mean of the paired differences with its 95% "
              "t-interval." if len(algos) > 1 else "")
    scale = "; ".join(s for s in scales.values() if s)
    write_summary(out, f"The documented run {args.config}{changed}", rows, seeds=seeds,
                  notes="Each seed is the config run as written, with --run.seed and --out added"
                        + (f" and {' '.join(flags)}." if flags else ".") + paired
                        + (f" Resolution: {scale}." if scale else "")
                        + (f" {args.note}" if args.note else ""))

if __name__ == "__main__":
    main()
