"""Every objective on a bundled text task with the embedded default: same seeds, same budget.

Prints a table (mean reward and training accuracy over the first 5 and the last 20 steps, their lifts, held-out
pass@1 before the first update and after the last, wall time), writes JSON and a PNG of the reward curves. Held-out
pass@1 is measured in each run at step 0 and at its end with the same settings (``--eval-samples`` per held-out
problem at temperature 1), so its lift is the run's own, not a comparison with a figure measured elsewhere.

The default task is ``arithmetic_stream``: every step draws fresh problems and the held-out problems are a part of
the problem space no training draw reaches. ``--task arithmetic`` is the fixed 100-problem set (80 trained on, each
about 30 times in 150 steps), whose published table stays as it was measured.

    python benchmarks/learning.py [--steps 500] [--seeds 0,1,2] [--algos grpo,gpg,...] [--threads 2] [--sampler hf]
                                  [--task arithmetic_stream] [--task-option max_operand=12 ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path
from typing import Any

import torch
from common import head_tail, pyplot, read_metrics, run_config, smooth
from summary import add_out_arguments, result_row, write_summary

import mmrl.algos as algos

NOTES = {
    "arithmetic": "Training draws from the task's 80 training problems (each about 30 times in 150 steps of 16 "
                  "prompts); held-out pass@1 is on the 20 problems never trained on, 32 samples each at temperature "
                  "1, measured in the same run before the first update and after the last.",
    "arithmetic_stream": "Every step draws 16 problems afresh from the training part of the problem space (with the "
                         "default operands 0..9 that part holds about 80 sums, so draws repeat them); held-out pass@1 "
                         "is on the 20 sums of the other part, which no draw reaches, 32 samples each at temperature "
                         "1, measured in the same run before the first update and after the last. Accuracy is the "
                         "share of training responses whose answer is right, apart from the reward's format term.",
}


def task_options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--task-option {pair!r}: write KEY=VALUE")
        options[f"task.{key}"] = value
    return options


def run_one(name: str, seed: int, steps: int, sampler: str, eval_samples: int, out_root: Path,
            task: dict[str, Any]) -> dict:
    # eval_every = steps: one evaluation before the first update (step 0) and one after the last
    overrides = {"algo.name": name, "run.seed": seed, "run.steps": steps, "run.eval_samples": eval_samples,
                 "run.eval_every": steps, "rollout.max_new_tokens": 12, "rollout.sampler": sampler, **task}
    records, _, wall = run_config(overrides, out_root / f"{name}-seed{seed}")
    return summarize(name, seed, steps, records, wall)


def summarize(name: str, seed: int, steps: int, records: list[dict], wall: float) -> dict:
    """One run's row from its metrics.jsonl records: reward, accuracy, format rate and entropy over the first 5 and
    the last 20 steps, held-out pass@1 at step 0 and after the last."""
    trained = [r for r in records if "reward" in r]
    start = next(r for r in records if r["step"] == 0 and "reward" not in r)
    last = next(r for r in reversed(records) if "eval/pass@1" in r)
    row: dict[str, Any] = {"algorithm": name, "seed": seed, "steps": steps}
    for key, label in (("reward", "reward"), ("accuracy", "accuracy"), ("format_rate", "format"),
                       ("entropy", "entropy"), ("truncated_frac", "truncated")):
        head, tail = head_tail([r[key] for r in trained])
        row.update({f"{label}_start": head, f"{label}_end": tail, f"{label}_lift": tail - head})
    row["lift"] = row["reward_lift"]
    row.update({"eval_start": start["eval/pass@1"], "eval_pass@1": last["eval/pass@1"],
                "eval_lift": last["eval/pass@1"] - start["eval/pass@1"],
                "eval_format_start": start.get("eval/format_rate"), "eval_format_end": last.get("eval/format_rate"),
                "wall_s": wall, "curve": [r["reward"] for r in trained]})
    return row


def finished_rows(out_root: Path, args: argparse.Namespace, task: dict[str, Any]) -> dict[tuple[str, int], dict]:
    """Rows of an earlier sweep into ``out_root`` made with the same steps, sampler, evaluation and task settings,
    by (objective, seed): ``--reuse`` reads them instead of running them again, so a sweep can be extended."""
    path = out_root / "learning.json"
    if not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    same = all(earlier["config"].get(k) == getattr(args, k) for k in ("steps", "sampler", "eval_samples", "task",
                                                                      "task_option", "lr"))
    if not same or earlier.get("task") != task:
        print(f"{path}: made with other settings; running every objective")
        return {}
    runs = out_root / "runs"
    return {(r["algorithm"], r["seed"]): summarize(r["algorithm"], r["seed"], r["steps"],
                                                  read_metrics(runs / f"{r['algorithm']}-seed{r['seed']}"
                                                               / "metrics.jsonl"), r["wall_s"])
            for r in earlier["rows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--algos", default=",".join(sorted(algos.ALGORITHMS)))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sampler", default="mmrl", help="rollout.sampler: mmrl (default) or hf (transformers' "
                        "generate)")
    parser.add_argument("--eval-samples", type=int, default=32, help="samples per held-out problem at each evaluation")
    parser.add_argument("--task", default="arithmetic_stream", help="a bundled text task (arithmetic_stream, "
                        "arithmetic)")
    parser.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a task option (repeatable), e.g. max_operand=12")
    parser.add_argument("--lr", type=float, default=None, help="optim.lr (default: the config's)")
    parser.add_argument("--reuse", action="store_true", help="read the runs an earlier sweep into --out made with "
                        "the same settings instead of running them again")
    # the published summary of each task has its own name: learning (arithmetic), learning_<task> otherwise
    chosen = argparse.ArgumentParser(add_help=False)
    chosen.add_argument("--task", default="arithmetic_stream")
    task_name = chosen.parse_known_args()[0].task
    add_out_arguments(parser, "learning" if task_name == "arithmetic" else f"learning_{task_name}")
    args = parser.parse_args()
    task: dict[str, Any] = {"task.name": args.task, **task_options(args.task_option)}
    if args.lr is not None:
        task["optim.lr"] = args.lr
    torch.set_num_threads(args.threads)
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    done = finished_rows(out_root, args, task) if args.reuse else {}
    rows = []
    for name in args.algos.split(","):
        for seed in args.seeds.split(","):
            if (name, int(seed)) in done:
                rows.append(done[name, int(seed)])
                continue
            rows.append(run_one(name, int(seed), args.steps, args.sampler, args.eval_samples, out_root / "runs", task))
            r = rows[-1]
            print(f"{name} seed {seed}: reward {r['reward_start']:.3f} -> {r['reward_end']:.3f}, accuracy "
                  f"{r['accuracy_start']:.3f} -> {r['accuracy_end']:.3f}, held-out pass@1 {r['eval_start']:.3f} -> "
                  f"{r['eval_pass@1']:.3f} ({r['wall_s']:.0f} s)", flush=True)
        # after each objective's seeds: a sweep stopped later still leaves every finished objective's summary
        publish(args, task, rows, out_root)
    print(f"task {args.task} {task}, embedded tiny Qwen2, {args.steps} steps x 16 prompts x 8 samples, "
          f"{args.threads} threads, rollout.sampler {args.sampler}")
    print(f"{'algorithm':9s} {'seed':>4s} {'reward@start':>12s} {'reward@end':>10s} {'lift':>6s} {'acc lift':>8s} "
          f"{'pass@1@0':>8s} {'pass@1':>6s} {'wall s':>7s}")
    for r in rows:
        print(f"{r['algorithm']:9s} {r['seed']:4d} {r['reward_start']:12.3f} {r['reward_end']:10.3f} "
              f"{r['lift']:6.3f} {r['accuracy_lift']:8.3f} {r['eval_start']:8.3f} {r['eval_pass@1']:6.3f} "
              f"{r['wall_s']:7.1f}")
    print("mean over seeds:")
    for name in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == name]
        m = {key: statistics.mean(r[key] for r in mine) for key in ("reward_start", "reward_end", "lift",
                                                                    "accuracy_lift", "eval_start", "eval_pass@1",
                                                                    "wall_s")}
        print(f"{name:9s} {'all':>4s} {m['reward_start']:12.3f} {m['reward_end']:10.3f} {m['lift']:6.3f} "
              f"{m['accuracy_lift']:8.3f} {m['eval_start']:8.3f} {m['eval_pass@1']:6.3f} {m['wall_s']:7.1f}")


def publish(args: argparse.Namespace, task: dict[str, Any], rows: list[dict], out_root: Path) -> None:
    """The summary (benchmarks/results/<out>.json), the per-run JSON and the reward curves of ``rows`` so far."""
    (out_root / "learning.json").write_text(json.dumps({"config": vars(args), "task": task,
                                                        "torch": torch.__version__, "machine": platform.machine(),
                                                        "rows": rows}, indent=2))
    summary_rows = []
    for name in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == name]
        summary_rows.append(result_row(name, f"mean reward, last 20 steps minus first 5 ({args.steps} steps)",
                                       {r["seed"]: r["lift"] for r in mine}))
        if args.task != "arithmetic":  # the published arithmetic table predates the accuracy rows
            for key, what in (("accuracy", "training accuracy"), ("format", "training format rate"),
                              ("entropy", "entropy"), ("truncated", "share of responses cut at the token cap")):
                summary_rows.append(result_row(name, f"{what}, last 20 steps minus first 5 ({args.steps} steps)",
                                               {r["seed"]: r[f"{key}_lift"] for r in mine}))
        summary_rows.append(result_row(name, "held-out pass@1 at step 0",
                                       {r["seed"]: r["eval_start"] for r in mine}))
        summary_rows.append(result_row(name, f"held-out pass@1 at step {args.steps}",
                                       {r["seed"]: r["eval_pass@1"] for r in mine}))
        summary_rows.append(result_row(name, f"held-out pass@1, step {args.steps} minus step 0",
                                       {r["seed"]: r["eval_lift"] for r in mine}))
    title = ("Every objective on the bundled arithmetic task (embedded text default)" if args.task == "arithmetic"
             else f"Objectives on fresh problems every step: task {args.task} (embedded text default)")
    write_summary(out_root, title, summary_rows, seeds=sorted({r["seed"] for r in rows}),
                  notes=NOTES.get(args.task, "") + (f" optim.lr {args.lr:g}, not the config's default (what the step "
                                                    "size does here: docs/objectives.md)." if args.lr else ""))
    plot(args.task, rows, out_root)


def plot(task_name: str, rows: list[dict], out_root: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        color = f"C{sorted(algos.ALGORITHMS).index(r['algorithm'])}"
        label = r["algorithm"] if r["seed"] == rows[0]["seed"] else None
        ax.plot(smooth(r["curve"]), color=color, alpha=0.85, lw=1.2, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (20-step moving average)")
    ax.set_title(f"Reward on the bundled {task_name} task, embedded tiny Qwen2")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_root / "learning.png", dpi=90)
    plt.close(fig)
    print(f"wrote {out_root / 'learning.json'} and {out_root / 'learning.png'}")


if __name__ == "__main__":
    main()
