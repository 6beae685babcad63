"""mmrl's own text sampling loop against ``transformers``' ``generate``: the same batch, interleaved, CPU time.

Both samplers draw one response per prompt for a training step's batch (``--prompts`` problems of the bundled
arithmetic task, each repeated ``--group`` times, ``--max-new-tokens``, temperature 1) from the same model, one after
the other, ``--repeats`` times. Each call is timed in process CPU time (``time.process_time``; one torch thread), which
stays meaningful when other jobs share the cores; wall time is printed too.

Prints a table (median and quartiles per sampler, the median of the per-repeat ratios) and writes ``sampler.json``.

    python benchmarks/sampler.py [--model embedded:tiny-qwen2] [--prompts 16] [--group 8] [--max-new-tokens 12]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from summary import add_out_arguments

from mmrl.models import load_model, load_tokenizer
from mmrl.tasks import get_task
from mmrl.trainer.rollout import encode_prompt, generate
from mmrl.trainer.text_sampler import SAMPLERS


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded:tiny-qwen2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=30)
    add_out_arguments(parser, "sampler", summary=False)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    task = get_task("arithmetic")
    prompts = [encode_prompt(tokenizer, row["messages"], 512) for row in task.train[: args.prompts]
               for _ in range(args.group)]
    cpu: dict[str, list[float]] = {s: [] for s in SAMPLERS}
    wall: dict[str, list[float]] = {s: [] for s in SAMPLERS}
    tokens: dict[str, list[float]] = {s: [] for s in SAMPLERS}
    load_before = os.getloadavg()[0]
    for repeat in range(args.repeats + 1):  # repeat 0 warms both up and is not counted
        order = SAMPLERS if repeat % 2 else SAMPLERS[::-1]
        for sampler in order:
            torch.manual_seed(repeat)
            c0, w0 = time.process_time(), time.perf_counter()
            out = generate(model, tokenizer, prompts, args.max_new_tokens, 1.0, 1.0, batch_size=len(prompts),
                           sampler=sampler)
            c1, w1 = time.process_time(), time.perf_counter()
            if repeat:
                cpu[sampler].append(c1 - c0)
                wall[sampler].append(w1 - w0)
                tokens[sampler].append(statistics.mean(len(r.token_ids) for r in out))
    ratios = [h / m for h, m in zip(cpu["hf"], cpu["mmrl"], strict=True)]
    print(f"{args.model}: {args.prompts} prompts x {args.group} samples, max {args.max_new_tokens} new tokens, "
          f"1 thread, {args.repeats} interleaved repeats; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print(f"{'sampler':8s} {'CPU s (q1 / median / q3)':>28s} {'median wall s':>14s} {'mean tokens':>12s}")
    rows = {}
    for s in SAMPLERS:
        q1, med, q3 = quartiles(cpu[s])
        rows[s] = {"cpu_s_q1": q1, "cpu_s_median": med, "cpu_s_q3": q3, "wall_s_median": statistics.median(wall[s]),
                   "mean_response_tokens": statistics.mean(tokens[s])}
        print(f"{s:8s} {q1:8.4f} / {med:.4f} / {q3:.4f} {rows[s]['wall_s_median']:14.4f} "
              f"{rows[s]['mean_response_tokens']:12.2f}")
    q1, med, q3 = quartiles(ratios)
    print(f"hf / mmrl CPU time per generation: median of the paired ratios {med:.2f}x (quartiles {q1:.2f}-{q3:.2f})")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sampler.json").write_text(json.dumps({
        "config": vars(args), "torch": torch.__version__, "machine": platform.machine(), "load_before": load_before,
        "rows": rows, "paired_ratio_median": med, "paired_ratio_q1": q1, "paired_ratio_q3": q3,
        "cpu_s": cpu, "wall_s": wall}, indent=2))
    print(f"wrote {out_dir / 'sampler.json'}")


if __name__ == "__main__":
    main()
