"""Re-scoring and update of long multi-turn batches: padded vs one unpadded row at a time, side by side in one run.

The local trainer scores a batch twice per RL step with more than one update epoch: π_old (re-scoring) and π_θ in
the update's forward and backward. ALFWorld episodes are one row each, 1,000-3,000 tokens long and of uneven
length, so a padded batch spends most of its attention on padding (``optim.row_by_row``, default true, scores text
batches at least ``ROW_BY_ROW_MIN_WIDTH`` tokens wide one row at a time). This script runs ``--rl-steps`` steps of
the local trainer on ``--task alfworld`` with each setting, same seed, and reports the mean re-scoring, update and
step times, and whether both settings took the same steps (loss, gradient norm, rewards per step). The whole-run
wall and CPU seconds include model loading and the one evaluation the trainer runs after its last step. Then
``--sft-steps`` SFT warm-up steps (8 explorer demonstrations per step, as ``--sft-warmup``) from the same model with
each setting: seconds per step, and whether the losses are the same.

    python benchmarks/scoring.py [--model <warm-started agent model>] [--games-root <games>] [--rl-steps 2]

With the default model (the untrained embedded agent) every episode plays all 15 turns, so rows are nearly equal in
length; a warm-started model's episodes end when won, which is where padding costs most. Prints a table and writes
``--out``/scoring.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]  # see benchmarks/alfworld.py

import torch  # noqa: E402
from common import run_config  # noqa: E402
from summary import add_out_arguments  # noqa: E402

from mmrl.models import load_model, load_tokenizer  # noqa: E402
from mmrl.tasks import get_task  # noqa: E402
from mmrl.tasks.alfworld import ALFWORLD_DEFAULTS  # noqa: E402
from mmrl.trainer.rollout import ROW_BY_ROW_MIN_WIDTH  # noqa: E402
from mmrl.trainer.sft import render_demonstrations, sft_warmup  # noqa: E402

SAME_STEP_KEYS = ("reward", "success_rate", "loss", "grad_norm")


def timed_steps(args, row_by_row: bool, out: Path) -> dict:
    """The mean times, episode length and per-step results of ``--rl-steps`` steps with one scoring setting."""
    overrides = {**ALFWORLD_DEFAULTS, "task.name": "alfworld", "algo.name": args.algo, "model.name": args.model,
                 "model.threads": args.threads, "run.steps": args.rl_steps, "run.seed": 0, "run.eval_every": 0,
                 "rollout.temperature": 0.7, "optim.epochs": 2, "optim.row_by_row": row_by_row,
                 "task.games_root": args.games_root, "task.max_steps": 15, "task.max_eval_games": 1,
                 "run.eval_samples": 1, "run.eval_temperature": 0.0}
    if args.task_types:
        overrides["task.task_types"] = args.task_types
    cpu = time.process_time()
    records, _, wall = run_config(overrides, out / f"row-by-row-{str(row_by_row).lower()}")
    records = [r for r in records if "update_time" in r]
    return {"row_by_row": row_by_row, "steps": len(records), "wall_s": wall, "cpu_s": time.process_time() - cpu,
            **{f"{k}_s": statistics.mean(r[k] for r in records)
               for k in ("step_time", "generation_time", "rescoring_time", "update_time")},
            "episode_tokens": statistics.mean(r["episode_tokens"] for r in records),
            "per_step": [{k: r[k] for k in SAME_STEP_KEYS} for r in records]}


def timed_sft(args) -> list[dict]:
    """Seconds per SFT step and the losses, padded then row by row, from the same model on the same batches."""
    options = {"games_root": args.games_root, "max_steps": 15, **({"task_types": args.task_types} if args.task_types
                                                                  else {})}
    task = get_task("alfworld", **options)
    tokenizer = load_tokenizer(args.model)
    demos = render_demonstrations(task, tokenizer, task.train[:32], ALFWORLD_DEFAULTS["rollout.max_episode_tokens"],
                                  seed=0, per_row=1)
    out = []
    for min_width in (ROW_BY_ROW_MIN_WIDTH, 0):
        torch.manual_seed(0)
        model = load_model(args.model)
        cpu, wall = time.process_time(), time.perf_counter()
        losses = sft_warmup(model, demos, tokenizer.pad_token_id, args.sft_steps, 2e-3, 8, seed=0,
                            row_by_row_min_width=min_width)
        out.append({"row_by_row": min_width > 0, "steps": args.sft_steps, "demonstrations": len(demos),
                    "demo_tokens": statistics.mean(len(g.prompt_ids) + len(g.responses[0].token_ids) for g in demos),
                    "step_wall_s": (time.perf_counter() - wall) / args.sft_steps,
                    "step_cpu_s": (time.process_time() - cpu) / args.sft_steps, "losses": losses})
        print(json.dumps(out[-1]), flush=True)
    return out


def same_steps(a: list[dict], b: list[dict]) -> bool:
    """Both settings took the same steps: equal rewards, and loss and gradient norm equal to float32 round-off."""
    return len(a) == len(b) and all(math.isclose(x[k], y[k], rel_tol=1e-3, abs_tol=1e-6)
                                    for x, y in zip(a, b, strict=True) for k in SAME_STEP_KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=ALFWORLD_DEFAULTS["model.name"])
    parser.add_argument("--games-root", default="", help="games (default: the task's generated set)")
    parser.add_argument("--task-types", default="", help="comma-separated subset of the six types ('' = all)")
    parser.add_argument("--algo", default="gmpo")
    parser.add_argument("--rl-steps", type=int, default=2)
    parser.add_argument("--sft-steps", type=int, default=5, help="SFT warm-up steps per setting (0: none)")
    parser.add_argument("--threads", type=int, default=1)
    add_out_arguments(parser, "scoring", summary=False)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()[0]]
    runs, ratios = [], {}
    for row_by_row in (True, False) if args.rl_steps > 0 else ():
        runs.append(timed_steps(args, row_by_row, out))
        load.append(os.getloadavg()[0])
        print(json.dumps(runs[-1]), flush=True)
    sft = timed_sft(args) if args.sft_steps > 0 else []
    load.append(os.getloadavg()[0])
    print(f"\nmodel {args.model}, {args.threads} thread(s), load average {', '.join(f'{x:.1f}' for x in load)}")
    if runs:
        d = ALFWORLD_DEFAULTS
        groups = f"{d['rollout.prompts_per_step']} games x {d['rollout.samples_per_prompt']}"
        print(f"\n{args.rl_steps} RL steps per setting ({args.algo}, {groups} episodes, 2 update epochs)\n")
        print("| scoring | step (s) | rollouts (s) | re-scoring (s) | update (s) | episode tokens |")
        print("|---|---|---|---|---|---|")
        for r in runs:
            print(f"| {'row by row' if r['row_by_row'] else 'padded batch'} | {r['step_time_s']:.1f} | "
                  f"{r['generation_time_s']:.1f} | {r['rescoring_time_s']:.1f} | {r['update_time_s']:.1f} | "
                  f"{r['episode_tokens']:.0f} |")
        row_by_row_run, padded_run = runs
        ratios.update({key: padded_run[f"{key}_s"] / row_by_row_run[f"{key}_s"]
                       for key in ("rescoring_time", "update_time", "step_time")})
        ratios["same_steps"] = same_steps(row_by_row_run["per_step"], padded_run["per_step"])
    if sft:
        print(f"\n{args.sft_steps} SFT warm-up steps per setting (8 of {sft[0]['demonstrations']} explorer "
              f"demonstrations per step, {sft[0]['demo_tokens']:.0f} tokens on average)\n")
        print("| scoring | SFT step wall (s) | SFT step CPU (s) |")
        print("|---|---|---|")
        for r in sft:
            print(f"| {'row by row' if r['row_by_row'] else 'padded batch'} | {r['step_wall_s']:.2f} | "
                  f"{r['step_cpu_s']:.2f} |")
        ratios["sft_step_cpu"] = sft[1]["step_cpu_s"] / sft[0]["step_cpu_s"]
        ratios["same_sft_losses"] = all(math.isclose(a, b, rel_tol=1e-3)
                                        for a, b in zip(sft[0]["losses"], sft[1]["losses"], strict=True))
    print()
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}" if isinstance(value, float) else f"{key}: {value}")
    (out / "scoring.json").write_text(json.dumps({"machine": platform.platform(), "load_average_1min": load,
                                                 "args": vars(args), "runs": runs, "sft": sft, "ratios": ratios},
                                                indent=1))
    print(f"wrote {out / 'scoring.json'}")


if __name__ == "__main__":
    main()
