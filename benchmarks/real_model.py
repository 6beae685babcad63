"""A real pretrained model on this CPU: SmolLM2-135M-Instruct (offline GGUF), full fine-tune and LoRA.

Two commands:

    python benchmarks/real_model.py probe [--problems 24] [--k 4]
        Starting held-out pass@1 (sampled at temperature 1, k per problem; and greedy) and format rate on each bundled
        text task (arithmetic, countdown, math on generated word problems), with the bare question the embedded
        models use and with the instruct chat a real model gets by default (system prompt + one worked example).

    python benchmarks/real_model.py train [--algos grpo,gpg] [--modes lora,full] [--seeds 0,1,2,3,4] [--steps 10]
        RL on the arithmetic task (where the model starts above 0). Each run is its own process (peak memory is per
        run); a run whose directory already holds a result with the same settings is read, not run again (a grid can
        be stopped and continued). Held-out pass@1 (k = --eval-k at temperature 1) of the base model and after
        training, the lift, wall time, the mean step time split into generation / re-scoring / update, and peak RSS.
        Writes JSON, a table and a PNG of held-out pass@1 over steps. Target: lift >= 0.15, mean of 5 seeds, <= 45 min
        per run on 2 idle cores.

Results go to ``--out`` (default runs/bench/real_model; ``--publish``: benchmarks/results/real_model).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
HERE = Path(__file__).resolve().parent
# Learning rates: a full fine-tune of a 135 M model moves far per step (at 5e-5 one of two seeds collapsed to wrong
# sums within 10 steps); LoRA's fresh adapters need a larger step.
LR = {"full": 2e-5, "lora": 3e-4}


def word_problems(n: int = 120, seed: int = 0) -> list[dict[str, str]]:
    """Small grade-school word problems with integer answers, generated (nothing bundled or downloaded)."""
    rng = random.Random(seed)
    names, things = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay"], ["apples", "pens", "books", "coins", "stamps"]
    rows = []
    for _ in range(n):
        who, what = rng.choice(names), rng.choice(things)
        a, b, c = rng.randint(2, 20), rng.randint(2, 20), rng.randint(2, 5)
        kind = rng.randrange(3)
        if kind == 0:
            rows.append({"problem": f"{who} has {a} {what} and buys {b} more. How many {what} does {who} have now?",
                         "answer": str(a + b)})
        elif kind == 1:
            rows.append({"problem": f"{who} has {a + b} {what} and gives {b} away. How many {what} are left?",
                         "answer": str(a)})
        else:
            rows.append({"problem": f"{who} buys {c} boxes with {a} {what} in each box. How many {what} is that?",
                         "answer": str(a * c)})
    return rows


def probe(args: argparse.Namespace) -> None:
    import torch

    from mmrl.models import load_model, load_tokenizer
    from mmrl.tasks import get_task
    from mmrl.tasks.base import TASK_PRETRAINED_OPTIONS
    from mmrl.trainer.evaluate import evaluate_groups

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    math_path = out / "word_problems.jsonl"
    math_path.write_text("".join(json.dumps(r) + "\n" for r in word_problems()))
    tasks = {"arithmetic": {}, "countdown": {}, "math": {"path": str(math_path), "eval_fraction": 0.2}}
    tokenizer, model = load_tokenizer(MODEL), load_model(MODEL)
    rows = []
    for name in args.tasks.split(","):
        for prompt in ("bare", "instruct"):
            options = {**tasks[name], **(TASK_PRETRAINED_OPTIONS[name] if prompt == "instruct" else {})}
            task = get_task(name, **options)
            row: dict[str, Any] = {"task": name, "prompt": prompt, "problems": min(args.problems, len(task.eval))}
            for label, temperature in (("sampled", 1.0), ("greedy", 0.0)):
                start = time.perf_counter()
                result, groups = evaluate_groups(model, tokenizer, task, k=args.k, temperature=temperature,
                                                 max_new_tokens=args.max_new_tokens, max_problems=args.problems,
                                                 seed=0)
                row[f"{label}_pass@1"] = result["pass@1"]
                row[f"{label}_format"] = result.get("format_rate")
                row[f"{label}_s"] = time.perf_counter() - start
                row[f"{label}_example"] = groups[0].responses[0].text
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nSmolLM2-135M-Instruct, held-out problems per task <= {args.problems}, sampled: k = {args.k} at T = 1")
    print(f"{'task':10s} {'prompt':9s} {'pass@1 T=1':>10s} {'format T=1':>10s} {'greedy pass@1':>13s} "
          f"{'greedy format':>13s}")
    for r in rows:
        print(f"{r['task']:10s} {r['prompt']:9s} {r['sampled_pass@1']:10.3f} {r['sampled_format']:10.3f} "
              f"{r['greedy_pass@1']:13.3f} {r['greedy_format']:13.3f}")
    (out / "probe.json").write_text(json.dumps({"config": vars(args), "load_average": os.getloadavg(),
                                                "rows": rows}, indent=2))


def run_overrides(args: argparse.Namespace, algo: str, mode: str, seed: int) -> dict[str, Any]:
    overrides = {"model.name": MODEL, "task.name": "arithmetic", "algo.name": algo, "run.seed": seed,
                 "run.steps": args.steps, "run.eval_every": args.eval_every, "run.eval_samples": args.eval_k,
                 "rollout.prompts_per_step": args.prompts, "rollout.samples_per_prompt": args.group,
                 "rollout.max_new_tokens": args.max_new_tokens, "optim.lr": args.lr or LR[mode],
                 "optim.micro_batch_size": args.micro_batch, "model.threads": args.threads}
    if algo == "gpg":
        overrides["algo.valid_threshold"] = 0.0  # no resampling rounds: every run gets the same generation budget
    if mode == "lora":
        overrides.update({"model.lora_rank": args.lora_rank, "model.lora_alpha": 2 * args.lora_rank})
    return overrides


def one_run(args: argparse.Namespace) -> None:
    """Inside the child process: the base model's pass@1, then the run; peak RSS of this process."""
    sys.path.insert(0, str(HERE))
    from common import run_config

    overrides = json.loads(args.overrides)
    out_dir = Path(args.run_dir)
    load_before = os.getloadavg()
    records, last, wall = run_config(overrides, out_dir)
    result = {"overrides": overrides, "records": records, "last": last, "wall_s": wall,
              "load_average": [load_before, os.getloadavg()],
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    (out_dir / "result.json").write_text(json.dumps(result))


def base_pass_at_1(args: argparse.Namespace, seed: int, cache: Path) -> float:
    """Held-out pass@1 of the untrained model with the trainer's own evaluation settings (its seed is the run's)."""
    known = json.loads(cache.read_text()) if cache.exists() else {}
    key = f"seed{seed}-k{args.eval_k}-tokens{args.max_new_tokens}"
    if key not in known:
        import torch

        from mmrl.models import load_model, load_tokenizer
        from mmrl.tasks import get_task
        from mmrl.tasks.base import TASK_PRETRAINED_OPTIONS
        from mmrl.trainer.evaluate import evaluate

        torch.set_num_threads(args.threads)
        task = get_task("arithmetic", **TASK_PRETRAINED_OPTIONS["arithmetic"])
        result = evaluate(load_model(MODEL), load_tokenizer(MODEL), task, k=args.eval_k, temperature=1.0,
                          max_new_tokens=args.max_new_tokens, seed=seed)
        known[key] = result["pass@1"]
        cache.write_text(json.dumps(known, indent=2))
    return known[key]


def summarise(algo: str, mode: str, seed: int, result: dict[str, Any], start: float) -> dict[str, Any]:
    records = [r for r in result["records"] if "step_time" in r]  # not the step-0 evaluation record
    evals = [(r["step"], r["eval/pass@1"]) for r in records if "eval/pass@1" in r]
    mean = lambda key: statistics.mean(r[key] for r in records)  # noqa: E731
    return {"algorithm": algo, "mode": mode, "seed": seed, "steps": len(records), "pass@1_start": start,
            "pass@1_end": evals[-1][1], "lift": evals[-1][1] - start, "eval_curve": [(0, start)] + evals,
            "reward_curve": [r["reward"] for r in records], "wall_s": result["wall_s"],
            "generation_s": mean("generation_time"), "rescoring_s": mean("rescoring_time"),
            "update_s": mean("update_time"), "step_s": mean("step_time"), "peak_rss_mb": result["peak_rss_mb"],
            "load_average": result["load_average"]}


def train(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for algo in args.algos.split(","):
        for mode in args.modes.split(","):
            for seed in map(int, args.seeds.split(",")):
                run_dir = out / "runs" / f"{algo}-{mode}-seed{seed}"
                overrides = run_overrides(args, algo, mode, seed)
                done = run_dir / "result.json"
                finished = done.exists() and json.loads(done.read_text())["overrides"] == overrides
                if args.finished_only and not finished:
                    continue
                start = base_pass_at_1(args, seed, out / "base_pass_at_1.json")
                if not finished:
                    subprocess.run([sys.executable, __file__, "_one", "--run-dir", str(run_dir), "--overrides",
                                    json.dumps(overrides)], check=True)
                row = summarise(algo, mode, seed, json.loads(done.read_text()), start)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if "curve" not in k}), flush=True)
    print(f"\nSmolLM2-135M-Instruct on arithmetic (held-out pass@1, k = {args.eval_k} at T = 1), {args.steps} steps x "
          f"{args.prompts} prompts x {args.group} samples, {args.threads} thread(s)")
    print(f"{'algo':5s} {'mode':5s} {'seed':>4s} {'start':>6s} {'end':>6s} {'lift':>6s} {'wall min':>8s} "
          f"{'gen s':>6s} {'rescore s':>9s} {'update s':>8s} {'peak GB':>7s}")
    for r in rows:
        print(f"{r['algorithm']:5s} {r['mode']:5s} {r['seed']:4d} {r['pass@1_start']:6.3f} {r['pass@1_end']:6.3f} "
              f"{r['lift']:6.3f} {r['wall_s'] / 60:8.1f} {r['generation_s']:6.1f} {r['rescoring_s']:9.1f} "
              f"{r['update_s']:8.1f} {r['peak_rss_mb'] / 1024:7.2f}")
    means = {}
    for r in rows:
        means.setdefault(f"{r['algorithm']} {r['mode']}", []).append(r["lift"])
    for name, lifts in means.items():
        print(f"mean lift {name}: {statistics.mean(lifts):+.3f} over {len(lifts)} seed(s) (target +0.15 over 5)")
    payload = {"config": vars(args), "rows": rows,
               "mean_lift": {name: statistics.mean(lifts) for name, lifts in means.items()}}
    (out / "train.json").write_text(json.dumps(payload, indent=2))
    plot(rows, out / "real_model.png")
    if rows:
        write_train_summary(args, rows, out)


def write_train_summary(args: argparse.Namespace, rows: list[dict[str, Any]], out: Path) -> None:
    """The results-page summary: per objective x mode, held-out pass@1 before and after, its lift, wall time and
    peak memory, seed by seed."""
    sys.path.insert(0, str(HERE))
    from summary import command_line, publish_figure, result_row, write_summary

    summary_rows = []
    for algo in dict.fromkeys(r["algorithm"] for r in rows):
        for mode in dict.fromkeys(r["mode"] for r in rows if r["algorithm"] == algo):
            mine = [r for r in rows if r["algorithm"] == algo and r["mode"] == mode]
            label = f"{algo}, {'LoRA' if mode == 'lora' else 'full fine-tune'}, {args.steps} steps"
            summary_rows += [
                result_row(label, f"held-out pass@1 at step 0 (k = {args.eval_k})",
                           {r["seed"]: r["pass@1_start"] for r in mine}),
                result_row(label, f"held-out pass@1 after step {args.steps}",
                           {r["seed"]: r["pass@1_end"] for r in mine}),
                result_row(label, "held-out pass@1 rise", {r["seed"]: r["lift"] for r in mine}),
                result_row(label, "wall time of the run", {r["seed"]: r["wall_s"] for r in mine}, unit="s"),
                result_row(label, "peak RSS", {r["seed"]: r["peak_rss_mb"] for r in mine}, unit="MB")]
    seeds = sorted({r["seed"] for r in rows})
    write_summary(out, f"SmolLM2-135M-Instruct (GGUF) on arithmetic: {', '.join(args.algos.split(','))}, "
                       f"LoRA and full fine-tune", summary_rows, seeds=seeds,
                  figure=publish_figure(out, out / "real_model.png"),
                  # a grid run in parts is tabulated with --finished-only; the command that makes its runs has none
                  command=command_line([a for a in sys.argv if a != "--finished-only"]),
                  notes=f"{args.prompts} prompts x {args.group} samples per step, {args.max_new_tokens} new tokens, "
                        f"{args.threads} thread(s) per run; held-out pass@1 sampled at temperature 1, k = "
                        f"{args.eval_k} per problem, the untrained model's from the same evaluation and seed."
                        + (f" {args.note}" if args.note else ""))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    sys.path.insert(0, str(HERE))
    from common import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in rows:
        xs, ys = zip(*r["eval_curve"], strict=True)
        ax.plot(xs, ys, marker="o", label=f"{r['algorithm']} {r['mode']} seed {r['seed']}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out pass@1")
    ax.set_title("SmolLM2-135M-Instruct, arithmetic")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    sys.path.insert(0, str(HERE))
    from summary import add_out_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--tasks", default="arithmetic,countdown,math")
    p.add_argument("--problems", type=int, default=24)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    t = sub.add_parser("train")
    t.add_argument("--algos", default="grpo,gpg")
    t.add_argument("--modes", default="lora,full")
    t.add_argument("--seeds", default="0,1,2,3,4")
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--prompts", type=int, default=4, help="prompts per step")
    t.add_argument("--group", type=int, default=4, help="samples per prompt")
    t.add_argument("--max-new-tokens", type=int, default=24)
    t.add_argument("--eval-every", type=int, default=0, help="0: held-out pass@1 only after the last step")
    t.add_argument("--eval-k", type=int, default=8)
    t.add_argument("--note", default="", help="a sentence for the results page on how the runs were made")
    t.add_argument("--finished-only", action="store_true",
                   help="tabulate and plot the runs that already have a result; run nothing")
    t.add_argument("--lr", type=float, default=0.0, help=f"0: per mode, {LR}")
    t.add_argument("--micro-batch", type=int, default=8,
                   help="responses per forward/backward: activation memory of the update grows with it")
    t.add_argument("--lora-rank", type=int, default=16)
    for q in (p, t):
        q.add_argument("--threads", type=int, default=1)
        add_out_arguments(q, "real_model")
    one = sub.add_parser("_one")  # internal: one training run in a fresh process
    one.add_argument("--run-dir", required=True)
    one.add_argument("--overrides", required=True)
    args = parser.parse_args()
    {"probe": probe, "train": train, "_one": one_run}[args.command](args)


if __name__ == "__main__":
    main()
