"""GMPO vs GRPO on the embedded tiny Qwen3-MoE (8 experts, 2 active) on the bundled CountDown task, with and without
routing replay: same seeds, same budget.

Four mini-batches per rollout make the later updates off-policy, so the routing chosen at rollout and in the training
forward can differ; the table reports that mismatch with the reward lift, the KL to the initial policy and the grad
norm. Writes JSON and a PNG of the curves.

    python benchmarks/moe.py [--steps 200] [--seeds 0,1,2] [--lr 5e-4] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch
from common import head_tail, pyplot, run_config, smooth
from summary import add_out_arguments

CURVES = [("reward", "mean reward"), ("kl_init", "KL(π || π_init)"), ("grad_norm", "grad norm"),
          ("moe/routing_mismatch", "routing mismatch (training vs rollout)")]


def summary(rows: list[dict]) -> list[dict]:
    """Mean over seeds of every numeric column, one row per (algorithm, replay); seed -1 marks it."""
    out = []
    for key in dict.fromkeys((r["algorithm"], r["replay"]) for r in rows):
        mine = [r for r in rows if (r["algorithm"], r["replay"]) == key]
        mean = {k: statistics.mean(r[k] for r in mine) for k, v in mine[0].items()
                if isinstance(v, float) and k != "seed"}
        out.append({"algorithm": key[0], "replay": key[1], "seed": -1, **mean})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--lr", type=float, default=5e-4, help="1e-3 with 4 mini-batches collapses early on the MoE")
    parser.add_argument("--threads", type=int, default=2)
    add_out_arguments(parser, "moe", summary=False)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    rows = []
    for algo in ("grpo", "gmpo"):
        for replay in (False, True):
            for seed in map(int, args.seeds.split(",")):
                overrides = {"model.name": "embedded:tiny-qwen3-moe", "task.name": "countdown", "algo.name": algo,
                             "moe.routing_replay": replay, "optim.minibatches": 4, "optim.lr": args.lr,
                             "run.seed": seed,
                             "run.steps": args.steps, "run.track_kl_to_init": True, "run.eval_samples": 8,
                             "rollout.max_new_tokens": 12}
                records, last, wall = run_config(overrides, out / "runs" / f"{algo}-replay{int(replay)}-seed{seed}")
                head, tail = head_tail([r["reward"] for r in records])
                rows.append({"algorithm": algo, "replay": replay, "seed": seed, "reward_start": head,
                             "reward_end": tail, "lift": tail - head, "eval_pass@1": last.get("eval/pass@1"),
                             "mismatch_mean": statistics.mean(r["moe/routing_mismatch"] for r in records),
                             "kl_init_end": records[-1]["kl_init"],
                             "grad_norm_mean": statistics.mean(r["grad_norm"] for r in records),
                             "imbalance_end": records[-1]["moe/load_imbalance"], "wall_s": wall,
                             "curves": {k: [r.get(k) for r in records] for k, _ in CURVES}})
    print(f"tiny Qwen3-MoE (8 experts, top-2), CountDown, {args.steps} steps x 16 prompts x 8 samples, "
          f"4 mini-batches, lr {args.lr:g}, {args.threads} threads")
    header = ("algo", "replay", "seed", "reward@start", "reward@end", "lift", "eval p@1", "mismatch", "KL init",
              "grad norm", "imbalance", "wall s")
    print("(seed -1 rows: mean over seeds)")
    print(("{:6s} {:>6s} {:>4s}" + " {:>12s}" * 9).format(*header))
    for r in rows + summary(rows):
        print(f"{r['algorithm']:6s} {str(r['replay']):>6s} {r['seed']:4d} {r['reward_start']:12.3f} "
              f"{r['reward_end']:12.3f} {r['lift']:12.3f} {r['eval_pass@1']:12.3f} {r['mismatch_mean']:12.4f} "
              f"{r['kl_init_end']:12.4f} {r['grad_norm_mean']:12.3f} {r['imbalance_end']:12.2f} {r['wall_s']:12.1f}")
    (out / "moe.json").write_text(json.dumps({"config": vars(args), "torch": torch.__version__,
                                              "machine": platform.machine(), "rows": rows}, indent=2))
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (key, label) in zip(axes.flat, CURVES, strict=True):
        for r in rows:
            color = {("grpo", False): "C0", ("grpo", True): "C1", ("gmpo", False): "C2", ("gmpo", True): "C3"}
            values = [v for v in r["curves"][key] if v is not None]
            ax.plot(smooth(values), color=color[(r["algorithm"], r["replay"])], lw=1.1, alpha=0.85,
                    label=f"{r['algorithm']}{' + replay' if r['replay'] else ''}" if r["seed"] == rows[0]["seed"]
                    else None)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle("GMPO vs GRPO on a tiny MoE, with and without routing replay (20-step moving average)")
    fig.tight_layout()
    fig.savefig(out / "moe.png", dpi=90)
    print(f"wrote {out / 'moe.json'} and {out / 'moe.png'}")


if __name__ == "__main__":
    main()
