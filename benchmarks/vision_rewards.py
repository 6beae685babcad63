"""Cost of the vision rewards per completion: box parsing, and the batched IoU/GIoU against a per-pair Python loop.

A rollout batch's rewards are computed once per step, so what matters is the cost per completion compared with
generation (tens of milliseconds per token on a CPU). This prints a table and writes the results-page summary
``<out>.json``:

    python benchmarks/vision_rewards.py [--n 4096] [--repeats 5] [--threads 1]

* ``parse``: `parse_boxes` on realistic completions (think text + one JSON box, a Qwen2.5 dict, a point pair).
* ``iou reward``: the registered ``iou`` reward on those completions (parse + frame conversion + batched IoU).
* ``giou_plus_one reward``, ``detection reward`` (3 boxes each against 3 ground-truth boxes, greedy matching).
* ``paired IoU torchvision`` vs ``paired IoU python loop``: the overlap arithmetic alone, n pairs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
from summary import add_out_arguments, result_row, write_summary

from mmrl.rewards import get_reward
from mmrl.vision.boxes import as_boxes, paired_iou, parse_boxes


def completions(n: int, rng: random.Random) -> tuple[list[str], list[dict], list[str], list[dict]]:
    texts, samples, det_texts, det_samples = [], [], [], []
    for i in range(n):
        x, y = rng.uniform(0, 80), rng.uniform(0, 80)
        gt = [x, y, x + rng.uniform(5, 30), y + rng.uniform(5, 30)]
        p = [v + rng.uniform(-5, 5) for v in gt]
        form = i % 3
        box = (json.dumps([round(v) for v in p]) if form == 0 else
               json.dumps({"bbox_2d": [round(v) for v in p], "label": "thing"}) if form == 1 else
               f"({round(p[0])},{round(p[1])}),({round(p[2])},{round(p[3])})")
        texts.append(f"<think>The red circle is near the top left of the image.</think><answer>{box}</answer>")
        samples.append({"answer": gt, "coord_frame": "norm1000", "original_hw": [[112, 112]]})
        gts = [[k * 30, k * 30, k * 30 + 20, k * 30 + 20] for k in range(3)]
        preds = [{"bbox_2d": [v + rng.uniform(-3, 3) for v in g], "confidence": round(rng.random(), 2)} for g in gts]
        det_texts.append(f"<think>three of them</think><answer>{json.dumps(preds)}</answer>")
        det_samples.append({"boxes": gts})
    return texts, samples, det_texts, det_samples


def python_iou(a: list[float], b: list[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    add_out_arguments(parser, "vision_rewards")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    texts, samples, det_texts, det_samples = completions(args.n, random.Random(0))
    a = as_boxes([[v - 1 for v in s["answer"]] for s in samples])
    b = as_boxes([s["answer"] for s in samples])
    al, bl = a.tolist(), b.tolist()
    assert torch.allclose(paired_iou(a, b), torch.tensor([python_iou(x, y) for x, y in zip(al, bl, strict=True)],
                                                          dtype=torch.float64))
    iou, giou, det = get_reward("iou"), get_reward("giou_plus_one"), get_reward("detection")
    iou(texts[:8], samples[:8])  # warm-up: lazy torchvision import
    rows = {
        "parse": timed(lambda: [parse_boxes(t) for t in texts], args.repeats),
        "iou reward": timed(lambda: iou(texts, samples), args.repeats),
        "giou_plus_one reward": timed(lambda: giou(texts, samples), args.repeats),
        "detection reward": timed(lambda: det(det_texts, det_samples), args.repeats),
        "paired IoU torchvision": timed(lambda: paired_iou(a, b), args.repeats),
        "paired IoU python loop": timed(lambda: [python_iou(x, y) for x, y in zip(al, bl, strict=True)],
                                        args.repeats),
    }
    print(f"{'step':<24} {'total ms':>10} {'us / completion':>16}   (n = {args.n}, {args.threads} thread(s))")
    for name, seconds in rows.items():
        print(f"{name:<24} {seconds * 1e3:>10.1f} {seconds / args.n * 1e6:>16.2f}")
    summary_rows = [result_row(name, "time per completion, median of repeats", {0: seconds / args.n * 1e6},
                               unit="µs") for name, seconds in rows.items()]
    write_summary(Path(args.out), "Cost of the vision rewards per completion", summary_rows, seeds=[0],
                  notes=f"n = {args.n} completions (pairs for the paired-IoU rows), median of {args.repeats} "
                        f"repeats, {args.threads} thread(s), one run.")


if __name__ == "__main__":
    main()
