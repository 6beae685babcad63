"""Every objective on the bundled arithmetic task with the embedded default: same seeds, same budget.

Prints a table (mean reward over the first 5 and the last 20 steps, the lift, held-out pass@1 before the first
update and after the last, wall time), writes JSON and a PNG of the reward curves. Held-out pass@1 is measured in
each run at step 0 and at its end with the same settings (``--eval-samples`` per held-out problem at temperature 1),
so its lift is the run's own, not a comparison with a figure measured elsewhere.

    python benchmarks/learning.py [--steps 500] [--seeds 0,1,2] [--algos grpo,gpg,...] [--threads 2] [--sampler hf]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch
from common import head_tail, pyplot, run_config, smooth
from summary import add_out_arguments, result_row, write_summary

import mmrl.algos as algos

NOTES = ("Training draws from the task's 80 training problems (each about 30 times in 150 steps of 16 prompts); "
         "held-out pass@1 is on the 20 problems never trained on, 32 samples each at temperature 1, measured in the "
         "same run before the first update and after the last.")


def run_one(name: str, seed: int, steps: int, sampler: str, eval_samples: int, out_root: Path) -> dict:
    # eval_every = steps: one evaluation before the first update (step 0) and one after the last
    overrides = {"algo.name": name, "run.seed": seed, "run.steps": steps, "run.eval_samples": eval_samples,
                 "run.eval_every": steps, "rollout.max_new_tokens": 12, "rollout.sampler": sampler}
    records, last, wall = run_config(overrides, out_root / f"{name}-seed{seed}")
    rewards = [r["reward"] for r in records if "reward" in r]
    start = next(r for r in records if r["step"] == 0 and "reward" not in r)
    head, tail = head_tail(rewards)
    return {"algorithm": name, "seed": seed, "steps": steps, "reward_start": head, "reward_end": tail,
            "lift": tail - head, "eval_start": start["eval/pass@1"], "eval_pass@1": last["eval/pass@1"],
            "eval_lift": last["eval/pass@1"] - start["eval/pass@1"], "wall_s": wall, "curve": rewards}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--algos", default=",".join(sorted(algos.ALGORITHMS)))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sampler", default="mmrl", help="rollout.sampler: mmrl (default) or hf (transformers' "
                        "generate)")
    parser.add_argument("--eval-samples", type=int, default=32, help="samples per held-out problem at each evaluation")
    add_out_arguments(parser, "learning")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    rows = [run_one(name, int(seed), args.steps, args.sampler, args.eval_samples, out_root / "runs")
            for name in args.algos.split(",") for seed in args.seeds.split(",")]
    print(f"bundled arithmetic task, embedded tiny Qwen2, {args.steps} steps x 16 prompts x 8 samples, "
          f"{args.threads} threads, rollout.sampler {args.sampler}")
    print(f"{'algorithm':9s} {'seed':>4s} {'reward@start':>12s} {'reward@end':>10s} {'lift':>6s} "
          f"{'pass@1@0':>8s} {'pass@1':>6s} {'wall s':>7s}")
    for r in rows:
        print(f"{r['algorithm']:9s} {r['seed']:4d} {r['reward_start']:12.3f} {r['reward_end']:10.3f} "
              f"{r['lift']:6.3f} {r['eval_start']:8.3f} {r['eval_pass@1']:6.3f} {r['wall_s']:7.1f}")
    print("mean over seeds:")
    for name in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == name]
        m = {key: statistics.mean(r[key] for r in mine) for key in ("reward_start", "reward_end", "lift",
                                                                    "eval_start", "eval_pass@1", "wall_s")}
        print(f"{name:9s} {'all':>4s} {m['reward_start']:12.3f} {m['reward_end']:10.3f} {m['lift']:6.3f} "
              f"{m['eval_start']:8.3f} {m['eval_pass@1']:6.3f} {m['wall_s']:7.1f}")
    (out_root / "learning.json").write_text(json.dumps({"config": vars(args), "torch": torch.__version__,
                                                        "machine": platform.machine(), "rows": rows}, indent=2))
    summary_rows = []
    for name in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == name]
        summary_rows.append(result_row(name, f"mean reward, last 20 steps minus first 5 ({args.steps} steps)",
                                       {r["seed"]: r["lift"] for r in mine}))
        summary_rows.append(result_row(name, "held-out pass@1 at step 0",
                                       {r["seed"]: r["eval_start"] for r in mine}))
        summary_rows.append(result_row(name, f"held-out pass@1 at step {args.steps}",
                                       {r["seed"]: r["eval_pass@1"] for r in mine}))
        summary_rows.append(result_row(name, f"held-out pass@1, step {args.steps} minus step 0",
                                       {r["seed"]: r["eval_lift"] for r in mine}))
    write_summary(out_root, "Every objective on the bundled arithmetic task (embedded text default)", summary_rows,
                  seeds=sorted({r["seed"] for r in rows}), notes=NOTES)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        color = f"C{sorted(algos.ALGORITHMS).index(r['algorithm'])}"
        label = r["algorithm"] if r["seed"] == rows[0]["seed"] else None
        ax.plot(smooth(r["curve"]), color=color, alpha=0.85, lw=1.2, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (20-step moving average)")
    ax.set_title("Reward on the bundled arithmetic task, embedded tiny Qwen2")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_root / "learning.png", dpi=90)
    print(f"wrote {out_root / 'learning.json'} and {out_root / 'learning.png'}")


if __name__ == "__main__":
    main()
