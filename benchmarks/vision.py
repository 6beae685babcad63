"""Vision RL on the embedded tiny Qwen-VL defaults (Qwen2.5-VL for geoqa, Qwen3-VL for grounding): held-out learning
curves of every objective, and a step's time split.

1. ``curves``: objectives × tasks × seeds, each the demo's setting (``make demo``: 40 steps of 16 prompts × 8
   samples, held-out evaluation at step 0 and every 20 steps; grounding: 150 steps at the task's lr 5e-4,
   evaluation every 50). ``geoqa`` reports held-out pass@1,
   pass@4 and format rate; ``grounding`` (with the IoU reward and with GIoU + 1) held-out mIoU, Acc@0.5 and the
   rate of parseable boxes. Every run writes its own ``runs/<name>.json`` as it ends (wall and CPU seconds, load
   average), so a sweep cut short or run piecewise in several processes (``--algos``, ``--seeds``, ``--tasks``)
   keeps what finished; ``summarise`` rebuilds the table and the PNG from every run file present.
2. ``timing``: the mean split of a GPG step on geoqa (generation / reward / re-scoring / update), with the vision
   tower run once per prompt (``--model.share_image_features true``, the default) and once per response (false),
   side by side in one process.

Writes ``runs/bench/vision/vision.json``, ``vision.png`` and ``table.md`` (``--publish``: into
``benchmarks/results/vision/``, with the summary the results page renders).

    python benchmarks/vision.py curves [--algos gpg,grpo] [--tasks geoqa,grounding-iou,grounding-giou] [--seeds 0,1,2]
                                       [--lr 2.5e-4 --out runs/bench/vision-lr2.5e-4]
    python benchmarks/vision.py timing [--timing-steps 4]
    python benchmarks/vision.py summarise
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from common import QUIET, pyplot
from summary import add_out_arguments, publish_figure, result_row, write_summary

from mmrl.tasks.grounding import GROUNDING_DEFAULTS
from mmrl.trainer.config import resolve_config
from mmrl.trainer.local import build_trainer
from mmrl.trainer.metrics import read_metrics

ALGOS = ("gpg", "grpo", "dr_grpo", "gmpo", "gvpo", "cw_grpo")
# name -> (task, task overrides, steps, held-out evaluation every so many steps, the held-out metrics reported).
# Grounding runs for the task's own steps, evaluation interval and samples per scene (GROUNDING_DEFAULTS; the
# samples must be given again here because DEMO's sit above the task's defaults); its lr comes from those defaults.
GROUNDING_RUN = {"run.eval_samples": GROUNDING_DEFAULTS["run.eval_samples"]}
GROUNDING_METRICS = ("miou", "acc@0.5", "box_rate", "format_rate")
TASKS: dict[str, tuple[str, dict[str, Any], int, int, tuple[str, ...]]] = {
    "geoqa": ("geoqa", {}, 40, 20, ("pass@1", "pass@4", "format_rate")),
    "grounding-iou": ("grounding", {"task.reward": "iou", **GROUNDING_RUN}, GROUNDING_DEFAULTS["run.steps"],
                      GROUNDING_DEFAULTS["run.eval_every"], GROUNDING_METRICS),
    "grounding-giou": ("grounding", {"task.reward": "giou_plus_one", **GROUNDING_RUN}, GROUNDING_DEFAULTS["run.steps"],
                       GROUNDING_DEFAULTS["run.eval_every"], GROUNDING_METRICS),
}
DEMO = {"rollout.prompts_per_step": 16, "rollout.samples_per_prompt": 8, "run.eval_samples": 4}


def cpu_seconds() -> float:
    """CPU seconds of this process (all its threads): the figure a loaded machine does not inflate."""
    return time.process_time()


def run_one(task_name: str, algo: str, seed: int, steps: int, eval_every: int, threads: int, out: Path,
            lr: float = 0.0) -> dict:
    task, task_overrides, default_steps, default_eval_every, keys = TASKS[task_name]
    steps, eval_every = steps or default_steps, eval_every or default_eval_every
    overrides = {**QUIET, **DEMO, **task_overrides, "algo.name": algo, "task.name": task, "run.seed": seed,
                 "run.steps": steps, "run.eval_every": eval_every, "model.threads": threads,
                 "run.out_dir": str(out / "runs" / f"{task_name}-{algo}-s{seed}")}
    if lr:  # else the task's own lr (grounding 5e-4) or the generic default
        overrides["optim.lr"] = lr
    cfg = resolve_config([(overrides, "benchmark")])  # the task's declared defaults underneath, as mmrl.train
    load_start, wall, cpu = os.getloadavg()[0], time.perf_counter(), cpu_seconds()
    trainer = build_trainer(cfg)
    trainer.run()
    if trainer.stop_signal is not None:
        raise SystemExit(128 + trainer.stop_signal)
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    records = read_metrics(trainer.run_dir / "metrics.jsonl")
    evals = [r for r in records if "eval/pass@1" in r]
    curves = {k: [(r["step"], r.get(f"eval/{k}")) for r in evals] for k in keys}
    result = {"task": task_name, "algo": algo, "seed": seed, "steps": steps, "lr": cfg.optim.lr, "lr_flag": lr,
              "wall_s": wall,
              "cpu_s": cpu,
              "load_start": load_start, "load_end": os.getloadavg()[0],
              "start": {k: evals[0].get(f"eval/{k}") for k in keys},
              "end": {k: evals[-1].get(f"eval/{k}") for k in keys},
              "curves": curves, "train_reward": [r.get("reward") for r in records if "reward" in r]}
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "runs" / f"{task_name}-{algo}-s{seed}.json").write_text(json.dumps(result, indent=1))
    print(f"{task_name} {algo} seed {seed}: " + ", ".join(f"{k} {result['start'][k]:.3f} -> {result['end'][k]:.3f}"
                                                         for k in keys if result['start'][k] is not None)
          + f" ({wall:.0f} s wall, {cpu:.0f} s CPU, load {load_start:.1f})", flush=True)
    return result


def summarise(out: Path) -> None:
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    if not runs:
        print("no runs yet")
        return
    lines = ["| task | objective | seeds | held-out metric: start → end (rise), mean over seeds | wall s (mean) | "
             "CPU s (mean) | load avg |", "|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["task"], r["algo"]), []).append(r)
    for (task, algo), rs in sorted(groups.items()):
        keys = TASKS[task][4]
        parts = []
        for k in keys:
            starts = [r["start"][k] for r in rs if r["start"][k] is not None]
            ends = [r["end"][k] for r in rs if r["end"][k] is not None]
            if starts and ends:
                parts.append(f"{k} {statistics.mean(starts):.3f} → {statistics.mean(ends):.3f} "
                             f"({statistics.mean(ends) - statistics.mean(starts):+.3f})")
        seeds = ",".join(str(r["seed"]) for r in sorted(rs, key=lambda r: r["seed"]))
        wall, cpu = statistics.mean(r["wall_s"] for r in rs), statistics.mean(r["cpu_s"] for r in rs)
        lines.append(f"| {task} | {algo} | {seeds} | {'; '.join(parts)} | {wall:.0f} | {cpu:.0f} | "
                     f"{statistics.mean(r['load_start'] for r in rs):.1f} |")
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")
    (out / "vision.json").write_text(json.dumps({"torch": torch.__version__, "machine": platform.machine(),
                                                 "runs": runs}, indent=1))
    plt = pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    # the two headline metrics of each task (pass@1 and pass@4; mIoU and Acc@0.5), one row each
    fig, axes = plt.subplots(2, len(tasks), figsize=(5 * len(tasks), 7), squeeze=False)
    for ax, (task, key) in zip(axes.T.flat, ((t, k) for t in tasks for k in TASKS[t][4][:2]), strict=True):
        for algo in dict.fromkeys(r["algo"] for r in runs if r["task"] == task):
            rs = [r for r in runs if r["task"] == task and r["algo"] == algo]
            steps = [s for s, _ in rs[0]["curves"][key]]
            means = [statistics.mean(r["curves"][key][i][1] for r in rs if i < len(r["curves"][key]))
                     for i in range(len(steps))]
            ax.plot(steps, means, marker="o", label=f"{algo} ({len(rs)} seeds)")
        ax.set_title(f"{task}: held-out {key}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("RL on the shipped Qwen-VL defaults (mean over seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "vision.png", dpi=90)
    print(f"wrote {out / 'table.md'}, {out / 'vision.json'} and {out / 'vision.png'}")
    write_vision_summary(out, runs, groups)


def write_vision_summary(out: Path, runs: list[dict], groups: dict[tuple[str, str], list[dict]]) -> None:
    """``<out>.json`` for docs/results.md: per task and objective, each held-out metric's start, end and rise per
    seed. Its command is the ``curves`` call that gives these runs again, whatever pieces they were run in."""
    rows = []
    for (task, algo), rs in sorted(groups.items()):
        for k in TASKS[task][4][:2]:
            done = [r for r in rs if r["start"][k] is not None and r["end"][k] is not None]
            if done:
                steps = done[0]["steps"]
                options = {f.split(".", 1)[1]: v for f, v in TASKS[task][1].items() if f.startswith("task.")}
                tags = {"task": TASKS[task][0], "options": options, "algo": algo, "key": f"eval/{k}",
                        "steps": steps}
                rows.append(result_row(f"{task} {algo}", f"held-out {k} at step 0",
                                       {r["seed"]: r["start"][k] for r in done}, kind="start", **tags))
                rows.append(result_row(f"{task} {algo}", f"held-out {k} rise by step {steps}",
                                       {r["seed"]: r["end"][k] - r["start"][k] for r in done}, kind="rise", **tags))
    seeds = sorted({r["seed"] for r in runs})
    lr_flags = {r.get("lr_flag", 0.0) for r in runs}  # 0: the task's own lr
    command = (f"python benchmarks/vision.py curves --tasks {','.join(sorted({r['task'] for r in runs}))} "
               f"--algos {','.join(sorted({r['algo'] for r in runs}))} --seeds {','.join(map(str, seeds))} "
               f"--threads 1 --out {out}" + "".join(f" --lr {lr}" for lr in lr_flags if lr))
    title = (f"Vision RL on the shipped embedded Qwen-VL defaults: {', '.join(sorted({r['task'] for r in runs}))} "
             f"with {', '.join(sorted({r['algo'] for r in runs}))}")
    write_summary(out, title, rows, seeds=seeds, command=command,
                  figure=publish_figure(out, out / "vision.png"),
                  notes="Held-out evaluation on the tasks' held-out splits (apart from the training rows; the small "
                        "diagram generator repeats some held-out pictures in training and pre-training: "
                        "docs/vision.md); the rise is end minus start of each seed's own run.")


def timed(fn, bucket: list[float]):
    """``fn`` recording the CPU seconds of each call (this process, all threads): on a machine shared with other
    work, wall seconds measure the neighbours as much as the code; CPU seconds do not."""
    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket.append(time.process_time() - start)

    return wrapper


def time_split(steps: int, overrides: dict, out: Path) -> dict[str, float]:
    """Mean CPU seconds per step in each phase (the trainer's bound methods and the task's reward, timed in place)."""
    cfg = resolve_config([({**QUIET, **overrides, "run.steps": steps + 1, "run.eval_every": 0,
                            "run.out_dir": str(out)}, "benchmark")])
    trainer = build_trainer(cfg)
    buckets: dict[str, list[float]] = {"reward": [], "rescore": [], "update": [], "step": []}
    reward = trainer.task.reward
    trainer.task.reward = type("TimedReward", (), {"__call__": staticmethod(timed(reward, buckets["reward"])),
                                                   "name": reward.name})()
    trainer.prepare_batch = timed(trainer.prepare_batch, buckets["rescore"])
    trainer.update = timed(trainer.update, buckets["update"])
    trainer.train_step = timed(trainer.train_step, buckets["step"])
    trainer.train_step()  # warm-up (first-call allocations), not counted
    for b in buckets.values():
        b.clear()
    for _ in range(steps):
        trainer.train_step()
    mean = {k: statistics.mean(v) for k, v in buckets.items()}
    # prepare_batch also computes advantages (microseconds); generation is what remains of collect_rollouts.
    mean["generation"] = mean["step"] - mean["reward"] - mean["rescore"] - mean["update"]
    return mean


def timing(args, out: Path) -> None:
    base = {**DEMO, "algo.name": "gpg", "task.name": "geoqa", "model.threads": args.threads}
    splits = {}
    for shared in (False, True):
        splits[shared] = time_split(args.timing_steps, {**base, "model.share_image_features": shared},
                                    out / "runs" / f"timing-{shared}")
    print(f"CPU seconds per step, gpg on geoqa, 16 prompts x 8 samples, {args.threads} threads, mean of "
          f"{args.timing_steps} steps after a warm-up, load average {os.getloadavg()[0]:.1f}")
    print(f"{'phase':12s} {'per response':>20s} {'shared per prompt':>20s}")
    for phase in ("generation", "reward", "rescore", "update", "step"):
        a, b = splits[False][phase], splits[True][phase]
        print(f"{phase:12s} {a:8.2f} s ({a / splits[False]['step']:5.1%}) {b:8.2f} s ({b / splits[True]['step']:5.1%})")
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing.json").write_text(json.dumps({"per_response": splits[False], "shared": splits[True],
                                                 "load": os.getloadavg()}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("curves", "timing", "summarise"))
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=0, help="RL steps per run (0: the task's default)")
    parser.add_argument("--eval-every", type=int, default=0, help="0: the task's default (geoqa 20, grounding 50)")
    parser.add_argument("--timing-steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.0,
                        help="peak lr of every run (0: the task's own); give each lr its own --out")
    add_out_arguments(parser, "vision")
    args = parser.parse_args()
    out = Path(args.out)
    if args.part == "timing":
        return timing(args, out)
    if args.part == "curves":
        for task in args.tasks.split(","):
            for algo in args.algos.split(","):
                for seed in (int(s) for s in args.seeds.split(",")):
                    run_one(task, algo, seed, args.steps, args.eval_every, args.threads, out, args.lr)
    summarise(out)


if __name__ == "__main__":
    main()
