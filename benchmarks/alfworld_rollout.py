"""ALFWorld multi-turn rollouts with and without the KV cache carried across turns, side by side in one run.

1. Generation per 15-turn episode: the same ``--episodes`` episodes (4 per game, the task's training games, 15 env
   steps, 40 tokens per turn, temperature 0.7) played with :class:`mmrl.trainer.turn_sampler.CachedTurnSampler`
   (``rollout.episode_kv_cache true``, the default) and by re-reading each episode every turn through ``generate``
   (``false``, the layout before the cache). Only the policy's calls are timed (CPU and wall); env time is reported
   apart. Both runs sample with the same torch seed.
2. RL step time: ``--rl-steps`` steps of the local trainer (``--task alfworld`` defaults: 4 games x 4 episodes) with
   each setting, same seed; the mean ``step_time`` and ``generation_time`` from metrics.jsonl.

The model is ``--model`` (default: the embedded agent model, untrained: its turns never stop early, so every episode
plays all 15 steps with 40-token turns, the longest episodes the budget allows). Prints a table and writes
``--out``/rollout.json.

    python benchmarks/alfworld_rollout.py [--episodes 16] [--rl-steps 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
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
from mmrl.trainer.episodes import Episode, TurnRenderer, model_policy, run_episodes  # noqa: E402

TURN_TOKENS = ALFWORLD_DEFAULTS["rollout.max_new_tokens"]
EPISODE_TOKENS = ALFWORLD_DEFAULTS["rollout.max_episode_tokens"]


class TimedPolicy:
    """The policy with its CPU and wall time summed over calls (env steps run between calls and are not counted)."""

    def __init__(self, policy) -> None:
        self.policy, self.cpu, self.wall, self.calls = policy, 0.0, 0.0, 0

    def __call__(self, episodes):
        cpu, wall = time.process_time(), time.perf_counter()
        turns = self.policy(episodes)
        self.cpu += time.process_time() - cpu
        self.wall += time.perf_counter() - wall
        self.calls += 1
        return turns


def generation(model, tokenizer, task, n: int, kv_cache: bool, temperature: float) -> dict:
    renderer = TurnRenderer(tokenizer, task.system_prompt)
    episodes = [Episode(task.make_env(task.train[(i // 4) % len(task.train)]), seed=i // 4) for i in range(n)]
    policy = TimedPolicy(model_policy(model, tokenizer, TURN_TOKENS, temperature, 1.0, 64, kv_cache=kv_cache))
    torch.manual_seed(0)
    cpu, wall = time.process_time(), time.perf_counter()
    run_episodes(episodes, renderer, policy, EPISODE_TOKENS)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    turns = sum(len(ep.actions) for ep in episodes)
    return {"kv_cache": kv_cache, "episodes": n, "turns_per_episode": turns / n,
            "model_tokens_per_episode": sum(sum(ep.loss_mask) for ep in episodes) / n,
            "episode_tokens": statistics.mean(len(ep.context) for ep in episodes),
            "generation_cpu_s_per_episode": policy.cpu / n, "generation_wall_s_per_episode": policy.wall / n,
            "other_cpu_s_per_episode": (cpu - policy.cpu) / n, "outcomes": sorted({ep.outcome for ep in episodes})}


def rl_steps(args, games_root: str, kv_cache: bool, out: Path) -> dict:
    overrides = {**ALFWORLD_DEFAULTS, "task.name": "alfworld", "algo.name": "gmpo", "model.name": args.model,
                 "model.threads": args.threads, "run.steps": args.rl_steps, "run.seed": 0,
                 "rollout.temperature": args.temperature, "rollout.episode_kv_cache": kv_cache,
                 "task.games_root": games_root, "task.max_eval_games": 1, "run.eval_samples": 1,
                 "run.eval_temperature": 0.0, "rollout.prompts_per_step": args.games_per_step}
    records, _, _ = run_config(overrides, out / f"rl-kv-{str(kv_cache).lower()}")
    print(json.dumps([{k: r[k] for k in ("step", "step_time", "generation_time")} for r in records]), flush=True)
    return {"kv_cache": kv_cache, "steps": len(records),
            "step_time_s": statistics.mean(r["step_time"] for r in records),
            "generation_time_s": statistics.mean(r["generation_time"] for r in records),
            "episode_length": statistics.mean(r["episode_length"] for r in records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=ALFWORLD_DEFAULTS["model.name"])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--rl-steps", type=int, default=2, help="RL steps per setting (0: generation only)")
    parser.add_argument("--games-per-step", type=int, default=4, help="RL groups per step (4 episodes each)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--games-root", default="", help="games (default: the task's generated set)")
    add_out_arguments(parser, "alfworld_rollout", summary=False)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task = get_task("alfworld", games_root=args.games_root, max_steps=15)
    model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    load = [os.getloadavg()[0]]
    gen = []
    for kv in (True, False):
        gen.append(generation(model, tokenizer, task, args.episodes, kv, args.temperature))
        print(json.dumps(gen[-1]), flush=True)  # partial results first: the RL runs below take long on a busy machine
    load.append(os.getloadavg()[0])
    rl = [rl_steps(args, args.games_root, kv, out) for kv in (True, False)] if args.rl_steps > 0 else []
    load.append(os.getloadavg()[0])

    print(f"\n{args.episodes} episodes of up to 15 turns, {TURN_TOKENS} tokens per turn, model {args.model}, "
          f"{args.threads} thread(s), load average {', '.join(f'{x:.1f}' for x in load)}\n")
    print("| KV cache across turns | turns / episode | episode tokens | generation CPU s / episode | "
          "generation wall s / episode | env + driver CPU s / episode |")
    print("|---|---|---|---|---|---|")
    for g in gen:
        print(f"| {'yes' if g['kv_cache'] else 'no (re-read)'} | {g['turns_per_episode']:.1f} | "
              f"{g['episode_tokens']:.0f} | {g['generation_cpu_s_per_episode']:.2f} | "
              f"{g['generation_wall_s_per_episode']:.2f} | {g['other_cpu_s_per_episode']:.2f} |")
    ratios = {"generation_cpu_speedup": gen[1]["generation_cpu_s_per_episode"] / gen[0]["generation_cpu_s_per_episode"],
              "generation_wall_speedup": gen[1]["generation_wall_s_per_episode"]
              / gen[0]["generation_wall_s_per_episode"]}
    if rl:
        print("\n| KV cache across turns | RL step time (s) | of which rollouts (s) | episode length |")
        print("|---|---|---|---|")
        for r in rl:
            print(f"| {'yes' if r['kv_cache'] else 'no (re-read)'} | {r['step_time_s']:.1f} | "
                  f"{r['generation_time_s']:.1f} | {r['episode_length']:.1f} |")
        ratios["rl_step_speedup"] = rl[1]["step_time_s"] / rl[0]["step_time_s"]
    print()
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    (out / "rollout.json").write_text(json.dumps({"machine": platform.platform(), "load_average_1min": load,
                                                  "args": vars(args), "generation": gen, "rl": rl,
                                                  "ratios": ratios}, indent=1))
    print(f"wrote {out / 'rollout.json'}")


if __name__ == "__main__":
    main()
