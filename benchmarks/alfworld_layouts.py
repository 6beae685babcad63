"""ALFWorld in the two agent layouts: what a step costs (time, peak memory, trained tokens) and held-out success
before and after RL, for each objective × layout pair, from the shipped warm start.

Each pair runs ``python -m mmrl.train --config examples/alfworld_grpo_warm_start.yaml`` (the shipped warm start
on the game set it was trained on) with ``--algo``, ``--rollout.agent_layout`` and ``--task.max_steps`` set, one
process per run, so a run's peak resident memory (``ru_maxrss`` of that process, from ``os.wait4``) is its own. Step
time, trained tokens, episode length and the share of episodes cut off by the token budget
(``rollout.max_episode_tokens``, which bounds the episode layout's one growing sequence) are the means over the
run's steps from its ``metrics.jsonl``; held-out greedy success is the run's evaluation at step 0 and after its
last step.

    python benchmarks/alfworld_layouts.py --pairs grpo:episode,grpo:turn,gigpo:turn --seeds 0 --steps 2 \
        --max-steps 50 --eval-games 8 --publish

A finished run in ``<out>/runs`` is read, not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from summary import add_out_arguments, result_row, write_summary

CONFIG = "examples/alfworld_grpo_warm_start.yaml"


def command(algo: str, layout: str, seed: int, run: Path, args) -> list[str]:
    return [sys.executable, "-m", "mmrl.train", "--config", CONFIG, "--algo", algo,
            "--rollout.agent_layout", layout, "--task.max_steps", str(args.max_steps), "--steps", str(args.steps),
            "--run.eval_every", str(args.steps), "--task.max_eval_games", str(args.eval_games),
            "--run.seed", str(seed), "--out", str(run), "--run.overwrite", "true"]


def run_once(cmd: list[str], run: Path) -> dict:
    """Run ``cmd``; its wall time and peak resident memory (MiB), kept in ``<run>/cost.json``."""
    begin = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{run}: the run failed (exit {proc.returncode}): {' '.join(cmd)}")
    cost = {"wall_s": time.perf_counter() - begin, "peak_rss_mib": usage.ru_maxrss / 1024}  # Linux: KiB
    (run / "cost.json").write_text(json.dumps(cost))
    return cost


def read_run(run: Path, steps: int) -> dict | None:
    """The run's step and evaluation records and cost, when it finished with an evaluation after its last step."""
    metrics, cost = run / "metrics.jsonl", run / "cost.json"
    if not (metrics.is_file() and cost.is_file()):
        return None
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    evals = [r for r in records if "eval/success_rate" in r]
    train = [r for r in records if "step_time" in r]
    if len(train) < steps or not evals or evals[-1]["step"] != steps:
        return None
    return {"train": train, "evals": evals, **json.loads(cost.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="grpo:episode,grpo:turn,gigpo:turn,gmpo:turn",
                        help="objective:layout pairs to run")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=2, help="RL steps per run")
    parser.add_argument("--max-steps", type=int, default=50, help="env steps per episode (task.max_steps)")
    parser.add_argument("--eval-games", type=int, default=0, help="held-out games evaluated (0: all 24)")
    add_out_arguments(parser, "alfworld_layouts")
    args = parser.parse_args()
    out, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",")]
    rows = []
    for algo, layout in pairs:
        values: dict[str, dict[int, float]] = {k: {} for k in ("step", "tokens", "rss", "cut", "length", "start", "end",
                                                                 "rise")}
        for seed in seeds:
            run = out / "runs" / f"{algo}-{layout}-s{seed}"
            found = read_run(run, args.steps)
            if found is None:
                run_once(command(algo, layout, seed, run, args), run)
                found = read_run(run, args.steps)
                if found is None:
                    raise SystemExit(f"{run}: the run ended without its last evaluation")
            train = found["train"]
            values["step"][seed] = sum(r["step_time"] for r in train) / len(train)
            values["tokens"][seed] = sum(r["batch_tokens"] for r in train) / len(train)
            values["rss"][seed] = found["peak_rss_mib"]
            values["cut"][seed] = sum(r["truncated_episodes"] for r in train) / len(train)
            values["length"][seed] = sum(r["episode_length"] for r in train) / len(train)
            values["start"][seed] = found["evals"][0]["eval/success_rate"]
            values["end"][seed] = found["evals"][-1]["eval/success_rate"]
            values["rise"][seed] = values["end"][seed] - values["start"][seed]
            print(f"{algo} {layout} seed {seed}: step {values['step'][seed]:.1f} s, "
                  f"{values['tokens'][seed]:.0f} trained tokens/step, peak {values['rss'][seed]:.0f} MiB, "
                  f"held-out success {values['start'][seed]:.3f} -> {values['end'][seed]:.3f}")
        label, tags = f"{algo}, {layout} layout", {"algo": algo, "layout": layout, "max_steps": args.max_steps}
        rows += [result_row(label, "step time", values["step"], unit="s", **tags),
                 result_row(label, "tokens trained per step", values["tokens"], **tags),
                 result_row(label, "peak resident memory of the run", values["rss"], unit="MiB", **tags),
                 result_row(label, "training episodes cut off by rollout.max_episode_tokens", values["cut"], **tags),
                 result_row(label, "env steps per training episode", values["length"], **tags),
                 result_row(label, "held-out success at step 0", values["start"], **tags),
                 result_row(label, f"held-out success after step {args.steps}", values["end"], **tags),
                 result_row(label, "held-out success rise", values["rise"], **tags)]
    write_summary(out, f"ALFWorld agent layouts from the shipped warm start, {args.max_steps}-step episodes", rows,
                  seeds=seeds, notes=f"{CONFIG} with --algo, --rollout.agent_layout, --task.max_steps "
                                     f"{args.max_steps}, --steps {args.steps}; peak memory is the run process's "
                                     "resident set (CPU), step time excludes evaluation.")


if __name__ == "__main__":
    main()
