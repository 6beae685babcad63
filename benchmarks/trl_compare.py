"""mmrl's local trainer against TRL's ``GRPOTrainer``: the same GRPO run, step by step, interleaved in one benchmark.

Both sides train the embedded default (``embedded:tiny-qwen2``, the same cached weights and tokenizer) on the bundled
arithmetic task with GRPO. Each side lives in its own worker process (so peak memory is each trainer's own), and the
coordinator runs them in lock-step: one TRL step, one mmrl step, one TRL step, ... (the side that goes first
alternates), so that whatever else loads the machine loads both alike. Per step it records wall time, generated
tokens (each response up to and including its EOS) and the mean reward.

Prints a table (steps/s, generated tokens/s, peak RSS, mean reward over the first and last steps) and writes
``trl_compare.json`` and ``trl_compare.png`` (reward curves side by side) into ``--out``.

    python benchmarks/trl_compare.py [--steps 100] [--seeds 0] [--threads 1]
    python benchmarks/trl_compare.py --report runs/bench/trl_compare/trl_compare.json   # re-print a run

The two runs are the same algorithm with the same settings; each equivalence, as read in TRL 1.16.0's
``trl/trainer/grpo_trainer.py`` and ``grpo_config.py``:

* Objective. TRL ``loss_type="grpo"``: ``((per_token_loss * mask).sum(-1) / mask.sum(-1)).mean()``, the per-response
  token mean averaged over responses = mmrl ``grpo`` with ``loss_agg=seq_mean_token_mean`` (its default). Token ratio
  clipped at 1 ± 0.2 on both (TRL ``epsilon=0.2``; mmrl ``clip_low = clip_high = 0.2``).
* Advantages. TRL ``scale_rewards="group"``: ``(r - group mean) / (group std + 1e-4)`` with the unbiased std
  (``trl.trainer.utils.nanstd``) = mmrl's ``grpo_advantages`` (unbiased std) with ``--algo.std_eps 1e-4``.
* No KL, no reference model: TRL ``beta=0.0``; mmrl ``kl_coef=0`` (its default).
* One update per rollout: TRL ``num_iterations=1``, ``per_device_train_batch_size`` = prompts × group,
  ``gradient_accumulation_steps=1`` (so ``steps_per_generation=1``: one generation batch, one optimizer step) = mmrl
  ``optim.epochs=1``, ``optim.minibatches=1``, whole batch in one forward (``micro_batch_size=0``).
* Sampling: temperature 1, top_p 1, top_k 0 (off), min_p off, repetition penalty 1 on both (TRL builds its own
  ``GenerationConfig`` with these; mmrl neutralises every other logits processor); the same EOS (``<|im_end|>``);
  ``max_completion_length`` = ``rollout.max_new_tokens``; truncated responses train on both
  (``mask_truncated_completions=False``). Log-probs of the tempered policy on both.
* Prompts: the same chat template applied to the same ``messages`` (TRL's conversational ``prompt`` column), from
  the task as mmrl builds it for the model (a checkpoint that is not embedded gets the pretrained-model chat: system
  prompt and one solved example); both sample prompts without replacement in shuffled epochs over the 80 training
  problems, with the run's seed.
* Optimiser: AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0, constant schedule, no warm-up, gradient
  clip 1.0 (TRL ``lr_scheduler_type="constant"``; its default is linear decay).
* Precision and memory settings: float32 on the CPU on both (TRL ``bf16=False``, ``gradient_checkpointing=False``: its
  defaults are True for both), dropout off on both (TRL ``disable_dropout=True``; mmrl always).
* Reward: the task's own reward (math-verify accuracy on ``<answer>N</answer>`` + 0.5 × the answer-tag format: one
  tag and nothing after it), called by TRL as a reward function.
* Seeds: the run seed goes to ``torch.manual_seed`` (mmrl) and ``GRPOConfig.seed`` (TRL); the two runs sample
  different tokens all the same, so reward curves are compared over several seeds, not step by step.

Tested, not only read: tests/test_trl_equivalence.py feeds one batch sampled by mmrl (the same prompts and token
ids, some ended by EOS, some cut at the cap) through TRL's ``GRPOTrainer`` built from these same settings
(:func:`mmrl_overrides`, :func:`trl_arguments`); the loss mask (EOS included, nothing after it), rewards,
advantages, loss and clipped gradient are TRL's own, and the gradients agree to float tolerance.

With accuracy alone as the reward (``--task.format_weight 0``), text after ``</answer>`` costs nothing: a response
that stops and one that runs on to the 12-token cap score alike, and runs can drift until every response runs to the cap
(``truncated`` in the JSON), losing held-out accuracy; TRL's trainer does not pull a drifted model back either.
That is the reward's property, not a trainer's; the format term is what teaches the model to stop.

What differs by design: mmrl re-scores the batch once without gradient for π_old (every mmrl objective may read
``old_logprobs``, e.g. CW-GRPO's weights), whereas TRL with ``num_iterations=1`` takes π_old = π_θ.detach() and skips
that forward. Both give the same gradient here (the ratio is exactly 1 at the single update).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import pyplot, smooth
from summary import add_out_arguments, command_line, result_row, write_summary

SIDES = ("trl", "mmrl")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# Settings a caller may leave out: the CPU comparison of the docstring. benchmarks/gpu_check.py passes a CUDA device,
# bfloat16 and another policy; bfloat16 means autocast on both sides, weights and AdamW state in float32.
DEFAULTS = {"model": "", "device": "cpu", "dtype": "float32"}


def peak_device_mb(device: str) -> float | None:
    """Peak CUDA memory this process allocated (None on the CPU, where peak RSS is the figure)."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None


def sync(device: str) -> None:
    """Wait for queued CUDA work, so that a step's wall time is the step's own."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def release_cache(device: str) -> None:
    """Hand the step's cached GPU memory back. Both trainers share one GPU, in turn: each caching allocator would
    otherwise keep its own peak reserved while the other steps, and two such peaks of a 0.5 B model's batch do not fit
    in 80 GB. Called outside the timed window; re-allocating inside the next step costs both sides alike."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------- mmrl worker


def mmrl_overrides(s: dict[str, Any], seed: int, out_dir: str) -> dict[str, Any]:
    """mmrl's config of the comparison (the equivalences to :func:`trl_arguments` are listed in the docstring)."""
    s = {**DEFAULTS, **s}
    return {
        **({"model.name": s["model"]} if s["model"] else {}), "model.device": s["device"], "model.dtype": s["dtype"],
        "run.progress": False, "run.plot": False, "run.checkpoint_every": 0, "run.overwrite": True,
        "run.out_dir": out_dir, "run.seed": seed, "run.steps": s["steps"],
        "algo.name": "grpo", "algo.std_eps": 1e-4, "algo.clip_low": 0.2, "algo.clip_high": 0.2,
        "rollout.prompts_per_step": s["prompts"], "rollout.samples_per_prompt": s["group"],
        "rollout.max_new_tokens": s["max_new_tokens"], "rollout.temperature": s["temperature"],
        "rollout.top_p": 1.0, "rollout.generation_batch_size": s["prompts"] * s["group"],
        "optim.lr": s["lr"], "optim.epochs": 1, "optim.minibatches": 1, "optim.micro_batch_size": 0,
        "optim.grad_clip": 1.0, "optim.weight_decay": 0.0, "optim.warmup_steps": 0, "optim.schedule": "constant",
    }


def comparison_task(settings: dict[str, Any], seed: int, out_dir: str):
    """The task exactly as mmrl's side builds it from :func:`mmrl_overrides`: a model that is not embedded gets the
    task's chat for pretrained models (system prompt, one solved example), so TRL must be given the same prompts."""
    from mmrl.trainer.build import build_task
    from mmrl.trainer.config import resolve_config

    return build_task(resolve_config([(mmrl_overrides(settings, seed, out_dir), "trl_compare")]))


def trl_arguments(s: dict[str, Any], seed: int, out_dir: str) -> dict[str, Any]:
    """TRL's ``GRPOConfig`` arguments of the comparison."""
    s = {**DEFAULTS, **s}
    return dict(
        output_dir=out_dir, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        use_cpu=s["device"] == "cpu", bf16=s["dtype"] == "bfloat16", gradient_checkpointing=False,
        disable_dropout=True, seed=seed,
        max_steps=s["steps"], per_device_train_batch_size=s["prompts"] * s["group"], gradient_accumulation_steps=1,
        num_generations=s["group"], max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"], top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        loss_type="grpo", scale_rewards="group", beta=0.0, num_iterations=1, epsilon=0.2,
        mask_truncated_completions=False, shuffle_dataset=True, dataloader_num_workers=0,
    )


def task_reward(task, stop: set[int], step_log: dict[str, float]):
    """The task's own reward as a TRL reward function, on TRL's decoded completions; it also records the step's tokens,
    reward, accuracy and the fraction of responses that ran to the length cap (no stop token: TRL cuts each one after
    its first) into ``step_log``."""

    def reward(completions, completion_ids, answer, problem, **kwargs) -> list[float]:
        texts = [c[0]["content"] for c in completions]
        results = task.reward(texts, [{"answer": a, "problem": p} for a, p in zip(answer, problem, strict=True)])
        scores = [r.score for r in results]
        step_log.update(tokens=float(sum(len(ids) for ids in completion_ids)), reward=statistics.mean(scores),
                        accuracy=statistics.mean(r.components.get(task.accuracy_key, 0.0) >= 1.0 for r in results),
                        truncated=statistics.mean(not stop.intersection(ids) for ids in completion_ids))
        return scores

    reward.__name__ = task.name  # TRL names the reward's metrics after the function
    return reward


def trl_rows(task) -> list[dict[str, Any]]:
    """The task's training split as TRL's conversational dataset rows."""
    return [{"prompt": row["messages"], "answer": row["answer"], "problem": row["problem"]} for row in task.train]


def mmrl_worker(conn, settings: dict[str, Any], seed: int, threads: int, out_dir: str) -> None:
    import torch

    from mmrl.trainer.config import resolve_config
    from mmrl.trainer.local import build_trainer

    torch.set_num_threads(threads)
    s = {**DEFAULTS, **settings}
    cfg = resolve_config([(mmrl_overrides(s, seed, out_dir), "trl_compare")])
    t0 = time.perf_counter()
    trainer = build_trainer(cfg)
    conn.send({"ready": True, "build_s": time.perf_counter() - t0, "rss_mb": current_rss_mb()})
    while conn.recv() == "step":
        sync(s["device"])
        start = time.perf_counter()
        record = trainer.train_step()
        trainer.step += 1
        sync(s["device"])
        wall = time.perf_counter() - start
        release_cache(s["device"])
        n = s["prompts"] * s["group"]
        conn.send({"wall_s": wall, "tokens": record["response_length"] * n, "reward": record["reward"],
                   "accuracy": record["accuracy"], "truncated": record["truncated_frac"],
                   "generation_s": record["generation_time"], "update_s": record["update_time"],
                   "batch_tokens": record["batch_tokens"]})
    conn.send({"peak_rss_mb": peak_rss_mb(), "peak_device_mb": peak_device_mb(s["device"])})


# ----------------------------------------------------------------------------------------------- TRL worker


def trl_worker(conn, settings: dict[str, Any], seed: int, threads: int, out_dir: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmrl.models import EMBEDDED_NAME, load_model, load_tokenizer
    from mmrl.trainer.rollout import eos_ids

    torch.set_num_threads(threads)
    s = {**DEFAULTS, **settings}
    policy = s["model"] or EMBEDDED_NAME
    task = comparison_task(s, seed, out_dir)
    step_log: dict[str, float] = {}

    class LockStep(TrainerCallback):
        """Waits for the coordinator before every step and reports each step's wall time (TRL's whole step: data,
        generation, reward, loss, optimizer, logging)."""

        def __init__(self):
            self.start = 0.0

        def _wait(self) -> bool:
            if conn.recv() != "step":
                return False
            sync(s["device"])
            self.start = time.perf_counter()
            return True

        def on_train_begin(self, args, state, control, **kwargs):
            if not self._wait():
                control.should_training_stop = True

        def on_step_end(self, args, state, control, **kwargs):
            sync(s["device"])
            wall = time.perf_counter() - self.start
            release_cache(s["device"])
            conn.send({"wall_s": wall, **step_log})
            if not self._wait():
                control.should_training_stop = True

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = load_model(policy, dtype=torch.float32, device=torch.device(s["device"]))
    tokenizer = load_tokenizer(policy)
    reward = task_reward(task, set(eos_ids(tokenizer, model)), step_log)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=reward,
                          train_dataset=Dataset.from_list(trl_rows(task)),
                          args=GRPOConfig(**trl_arguments(s, seed, out_dir)), callbacks=[LockStep()])
    trainer.remove_callback(PrinterCallback)  # its per-step log lines would drown the table
    conn.send({"ready": True, "build_s": time.perf_counter() - t0, "rss_mb": current_rss_mb()})
    trainer.train()  # the coordinator's "stop" after the last step ends it (and max_steps would)
    conn.send({"peak_rss_mb": peak_rss_mb(), "peak_device_mb": peak_device_mb(s["device"])})


WORKERS = {"trl": trl_worker, "mmrl": mmrl_worker}


# ----------------------------------------------------------------------------------------------- coordinator


def run_seed(settings: dict[str, Any], seed: int, threads: int, out_root: Path) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    conns, procs, ready = {}, {}, {}
    for side in SIDES:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=WORKERS[side], args=(child, settings, seed, threads,
                                                       str(out_root / f"{side}-seed{seed}")), daemon=True)
        proc.start()
        child.close()  # the worker holds the only other end: if it dies, recv() raises EOFError instead of waiting
        conns[side], procs[side] = parent, proc
    try:
        for side in SIDES:  # built one after the other would be fairer, but building is not measured
            ready[side] = conns[side].recv()
        steps: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for step in range(settings["steps"]):
            order = SIDES if step % 2 == 0 else SIDES[::-1]
            for side in order:
                conns[side].send("step")
                steps[side].append(conns[side].recv())
            if step % 10 == 9 or step == settings["steps"] - 1:
                print(f"  seed {seed} step {step + 1}: " + ", ".join(
                    f"{side} {statistics.mean(r['wall_s'] for r in steps[side][-10:]):.3f} s/step "
                    f"reward {statistics.mean(r['reward'] for r in steps[side][-10:]):.3f}" for side in SIDES),
                    flush=True)
        peaks = {}
        for side in SIDES:
            conns[side].send("stop")
            peaks[side] = conns[side].recv()
    finally:
        for side in SIDES:  # a worker still waiting for its next order reads EOF and ends
            conns[side].close()
        for side in SIDES:
            procs[side].join(timeout=60)
            if procs[side].is_alive():
                procs[side].terminate()
    return {"seed": seed, "sides": {side: {"build_s": ready[side]["build_s"],
                                           "rss_after_build_mb": ready[side]["rss_mb"], **peaks[side],
                                           "steps": steps[side]} for side in SIDES}}


def summarise(side_runs: list[dict[str, Any]], head: int, tail: int) -> dict[str, float]:
    walls = [r["wall_s"] for run in side_runs for r in run["steps"]]
    tokens = [r["tokens"] for run in side_runs for r in run["steps"]]
    last = [r for run in side_runs for r in run["steps"][-tail:]]
    return {
        "steps_per_s": len(walls) / sum(walls),
        "median_step_s": statistics.median(walls),
        "tokens_per_s": sum(tokens) / sum(walls),
        "peak_rss_mb": max(run["peak_rss_mb"] for run in side_runs),
        "rss_after_build_mb": max(run["rss_after_build_mb"] for run in side_runs),
        "reward_first": statistics.mean(r["reward"] for run in side_runs for r in run["steps"][:head]),
        "reward_last": statistics.mean(r["reward"] for r in last),
        "accuracy_last": statistics.mean(r["accuracy"] for r in last),
        # runs saved before truncation was recorded have none
        "truncated_last": statistics.mean(r.get("truncated", float("nan")) for r in last),
        "tokens_per_step_last": statistics.mean(r["tokens"] for r in last),
    }


def learning_by_seed(runs: list[dict[str, Any]], tail: int) -> dict[str, Any]:
    """Per seed, each side's mean reward, truncated fraction and tokens per step over the last ``tail`` steps; and the
    paired mmrl - TRL reward difference over seeds with its standard error (the seeds are the independent units: the
    two sides draw different tokens, so single steps are not comparable)."""
    per_seed = {}
    for run in runs:
        m = {side: summarise([run["sides"][side]], 1, tail) for side in SIDES}
        per_seed[str(run["seed"])] = {side: {k: m[side][k] for k in ("reward_last", "truncated_last",
                                                                      "tokens_per_step_last")} for side in SIDES}
    diffs = [v["mmrl"]["reward_last"] - v["trl"]["reward_last"] for v in per_seed.values()]
    trunc = [v["mmrl"]["truncated_last"] - v["trl"]["truncated_last"] for v in per_seed.values()]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {"tail_steps": tail, "per_seed": per_seed, "reward_diff_mean": statistics.mean(diffs),
            "reward_diff_se": se, "truncated_diff_mean": statistics.mean(trunc)}


def paired_ratios(runs: list[dict[str, Any]]) -> list[float]:
    """TRL's step time over mmrl's for each interleaved pair of steps: both saw the same load, so the median of these
    is the comparison a load spike moves least."""
    return [t["wall_s"] / m["wall_s"] for run in runs
            for t, m in zip(run["sides"]["trl"]["steps"], run["sides"]["mmrl"]["steps"], strict=True)]


def write_trl_summary(result: dict[str, Any], ratios: dict[int, float], out_root: Path) -> None:
    """``<out>.json`` for docs/results.md: per seed, the paired reward and truncation differences over the last
    steps, each side's reward, and the step-throughput ratio of the interleaved pairs."""
    learning, s = result["learning"], result["settings"]
    tail, seeds = learning["tail_steps"], learning["per_seed"]
    rows = [
        result_row("mmrl − TRL", f"mean reward, last {tail} of {s['steps']} steps (paired by seed)",
                   {k: v["mmrl"]["reward_last"] - v["trl"]["reward_last"] for k, v in seeds.items()}),
        result_row("mmrl", f"mean reward, last {tail} steps", {k: v["mmrl"]["reward_last"] for k, v in seeds.items()}),
        result_row("TRL", f"mean reward, last {tail} steps", {k: v["trl"]["reward_last"] for k, v in seeds.items()}),
        result_row("mmrl − TRL", f"truncated fraction, last {tail} steps",
                   {k: v["mmrl"]["truncated_last"] - v["trl"]["truncated_last"] for k, v in seeds.items()}),
        result_row("mmrl ÷ TRL", "step throughput, median of the interleaved step pairs", ratios, unit="×"),
    ]
    write_summary(out_root, f"GRPO in mmrl and in TRL {result['trl']}: same weights, task and settings", rows,
                  seeds=[int(k) for k in seeds], command=result.get("command"),
                  notes=f"Embedded text default on arithmetic, {s['prompts']} prompts × {s['group']} samples, "
                        f"{s['max_new_tokens']} new tokens, lr {s['lr']}; the two trainers step in turn in one "
                        "process pair, so load changes hit both alike. 1-minute load average "
                        f"{result['load_average_before'][0]:.1f} at the start, {result['load_average_after'][0]:.1f} "
                        "at the end.")


def report(result: dict[str, Any], out_root: Path) -> None:
    """Print the table and write the JSON and the PNG of a finished comparison."""
    s, runs = result["settings"], result["runs"]
    head, tail = 5, min(50, s["steps"])
    summary = {side: summarise([run["sides"][side] for run in runs], head, tail) for side in SIDES}
    ratio = summary["mmrl"]["steps_per_s"] / summary["trl"]["steps_per_s"]
    pairs = paired_ratios(runs)
    per_seed = {run["seed"]: statistics.median(paired_ratios([run])) for run in runs}
    learning = learning_by_seed(runs, tail)
    result.update(summary=summary, step_throughput_ratio=ratio, median_paired_ratio=statistics.median(pairs),
                  learning=learning)
    print(f"\nembedded tiny Qwen2, arithmetic, GRPO, {s['steps']} steps x {s['prompts']} prompts x {s['group']} "
          f"samples, max {s['max_new_tokens']} new tokens, {result['threads']} thread(s), seeds {result['seeds']}, "
          f"TRL {result['trl']}")
    print(f"load average before {result['load_average_before'][0]:.2f}, after {result['load_average_after'][0]:.2f} "
          f"(1 min); {result['wall_s']:.0f} s in all")
    print(f"{'trainer':7s} {'steps/s':>8s} {'median s/step':>13s} {'gen tok/s':>9s} {'peak RSS MB':>11s} "
          f"{'reward@first5':>13s} {'reward@last' + str(tail):>13s} {'acc@last' + str(tail):>10s} "
          f"{'trunc@last' + str(tail):>12s}")
    for side in SIDES:
        m = summary[side]
        print(f"{side:7s} {m['steps_per_s']:8.3f} {m['median_step_s']:13.3f} {m['tokens_per_s']:9.0f} "
              f"{m['peak_rss_mb']:11.0f} {m['reward_first']:13.3f} {m['reward_last']:13.3f} "
              f"{m['accuracy_last']:10.3f} {m['truncated_last']:12.3f}")
    quartiles = statistics.quantiles(pairs, n=4)
    print(f"mmrl / TRL step throughput: {ratio:.2f}x over the whole run; median of the interleaved pairs "
          f"{statistics.median(pairs):.2f}x (quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}); per seed "
          + ", ".join(f"{seed}: {r:.2f}x" for seed, r in per_seed.items()))
    print(f"last {tail} steps, per seed (mmrl / TRL): " + "; ".join(
        f"{seed}: reward {v['mmrl']['reward_last']:.3f} / {v['trl']['reward_last']:.3f}, truncated "
        f"{v['mmrl']['truncated_last']:.2f} / {v['trl']['truncated_last']:.2f}"
        for seed, v in learning["per_seed"].items()))
    print(f"mmrl - TRL reward, last {tail} steps, paired over seeds: {learning['reward_diff_mean']:+.3f} "
          f"(standard error {learning['reward_diff_se']:.3f}); truncated fraction "
          f"{learning['truncated_diff_mean']:+.3f}")
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / "trl_compare.json").write_text(json.dumps(result, indent=1))
    write_trl_summary(result, per_seed, out_root)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, side in enumerate(SIDES):
        for j, run in enumerate(runs):
            rewards = [r["reward"] for r in run["sides"][side]["steps"]]
            ax.plot(smooth(rewards, 10), color=f"C{i}", alpha=0.85, lw=1.3, label=side if j == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (10-step moving average)")
    ax.set_title(f"GRPO on arithmetic, embedded tiny Qwen2: mmrl vs TRL {result['trl']} (seeds {result['seeds']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_root / "trl_compare.png", dpi=90)
    print(f"wrote {out_root / 'trl_compare.json'} and {out_root / 'trl_compare.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker (they never run at once)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--temperature", type=float, default=1.0)
    add_out_arguments(parser, "trl_compare")
    parser.add_argument("--report", metavar="JSON", help="only re-print the table and PNG of a saved trl_compare.json")
    args = parser.parse_args()
    if args.report:
        report(json.loads(Path(args.report).read_text()), Path(args.out))
        return
    import trl

    settings = {"steps": args.steps, "prompts": args.prompts, "group": args.group,
                "max_new_tokens": args.max_new_tokens, "lr": args.lr, "temperature": args.temperature}
    load_before = os.getloadavg()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trl_compare-") as tmp:
        runs = [run_seed(settings, int(seed), args.threads, Path(tmp)) for seed in args.seeds.split(",")]
    report({"command": command_line(), "settings": settings, "seeds": args.seeds, "threads": args.threads,
            "trl": trl.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(), "load_average_before": load_before,
            "load_average_after": os.getloadavg(), "wall_s": time.perf_counter() - start, "runs": runs},
           Path(args.out))


if __name__ == "__main__":
    main()
