"""Cost of each objective alone: advantages + batch statistics + loss + backward on a 64 x 1024-token batch.

The log-probs are a leaf tensor, so this measures the objective's own arithmetic, not a model. Every objective is
timed in the same process, interleaved round by round, and reported as a ratio to GRPO measured in the same run.

    python benchmarks/objectives.py [--n 64] [--t 1024] [--group 8] [--repeats 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from summary import result_row, write_summary

import mmrl.algos as algos


def one_pass(algo, rewards, groups, logprobs, old, mask) -> float:
    lp = logprobs.detach().requires_grad_(True)
    start = time.perf_counter()
    adv = algo.advantages(rewards, groups)
    stats = algo.batch_stats(rewards, groups, adv, old, mask)
    loss, _ = algo.policy_loss(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, group_ids=groups,
                               stats=stats)
    loss.backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--t", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/objectives")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (args.n,), generator=g).float()
    groups = torch.arange(args.n) // args.group
    old = -torch.rand(args.n, args.t, generator=g) * 3
    logprobs = old + 0.05 * torch.randn(args.n, args.t, generator=g)
    lengths = torch.randint(args.t // 4, args.t + 1, (args.n,), generator=g)
    mask = (torch.arange(args.t)[None] < lengths[:, None]).float()
    names = sorted(algos.ALGORITHMS, key=lambda n: (n != "grpo", n))
    built = {n: algos.get(n, kl_coef=0.0) if "kl_coef" in algos.hyperparameters(n) else algos.get(n) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up
        one_pass(built[n], rewards, groups, logprobs, old, mask)
    for _ in range(args.repeats):
        for n in names:  # interleaved, so drift in machine load hits every objective alike
            times[n].append(one_pass(built[n], rewards, groups, logprobs, old, mask))
    base = statistics.median(times["grpo"])
    rows = [{"algorithm": n, "median_ms": 1e3 * statistics.median(times[n]),
             "p90_ms": 1e3 * sorted(times[n])[int(0.9 * (len(times[n]) - 1))],
             "ratio_to_grpo": statistics.median(times[n]) / base} for n in names]
    print(f"advantages + stats + loss + backward, N={args.n} x T={args.t}, groups of {args.group}, "
          f"{args.repeats} interleaved repeats, {args.threads} threads")
    print(f"{'algorithm':10s} {'median ms':>10s} {'p90 ms':>8s} {'x GRPO':>7s}")
    for r in rows:
        print(f"{r['algorithm']:10s} {r['median_ms']:10.2f} {r['p90_ms']:8.2f} {r['ratio_to_grpo']:7.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "objectives.json").write_text(json.dumps({"config": vars(args), "torch": torch.__version__,
                                                     "machine": platform.machine(), "times_s": times}, indent=2))
    summary_rows = [result_row(r["algorithm"], f"time ÷ GRPO's, median of {args.repeats} interleaved repeats",
                               {"median": r["ratio_to_grpo"]}, unit="×") for r in rows]
    summary_rows += [result_row(r["algorithm"], f"ms per pass (N={args.n}, T={args.t}, {args.threads} threads)",
                                {"median": r["median_ms"]}, unit="ms") for r in rows]
    write_summary(out, "Cost of each objective alone (advantages, statistics, loss, backward)", summary_rows,
                  seeds=[0])


if __name__ == "__main__":
    main()
