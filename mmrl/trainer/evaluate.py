"""Evaluation with the training rewards on a held-out split: pass@1, pass@k and avg@k.

* ``pass@k`` is the unbiased estimator of Chen et al. (2021) from n samples per problem: 1 - C(n-c, k) / C(n, k).
* ``avg@k`` is the mean accuracy over k samples per problem (what the papers report as avg@32 on AIME); it equals the
  unbiased pass@1 estimate from k samples, and both are printed because papers quote both names.
* A response is correct when its accuracy component (the task's ``accuracy_key``) is 1.

Multi-turn tasks (:func:`evaluate_episodes`): k episodes per held-out game; a game counts as solved by an episode that
wins, so pass@1 is the success rate; also success per task type, valid-action and format rates, episode length.

Evaluation draws from its own seeded RNG and restores the caller's, so evaluating inside a training run does not
change the run's random stream (a resumed run stays bit-identical).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from tqdm import tqdm

from mmrl.batch import Group
from mmrl.envs.episode import TurnRenderer
from mmrl.run.prompts import encode_prompt
from mmrl.run.scoring import pass_at_k
from mmrl.tasks.base import EnvTask, Task
from mmrl.trainer.episodes import Episode, episode_metrics, model_policy, run_episodes
from mmrl.trainer.rollout import generate, score_groups


def evaluate(model, tokenizer, task: Task, **kwargs: Any) -> dict[str, Any]:
    """The metrics of :func:`evaluate_groups` (same arguments)."""
    return evaluate_groups(model, tokenizer, task, **kwargs)[0]


@torch.no_grad()
def evaluate_groups(model, tokenizer, task: Task, k: int = 4, temperature: float = 1.0, max_new_tokens: int = 64,
                    max_prompt_tokens: int = 512, seed: int = 0, max_problems: int = 0, batch_size: int = 128,
                    progress: bool = False, vision=None, top_p: float = 1.0, sampler: str = "mmrl",
                    repetition_penalty: float = 1.0) -> tuple[dict[str, Any], list[Group]]:
    """(metrics, the scored groups: one per held-out problem, for `mmrl.samples`).
    ``vision``: the `mmrl.vision.processor.VisionProcessor` of a task with images (None for text).
    ``temperature`` 0 is greedy decoding (one response per problem).
    ``sampler``, ``repetition_penalty``: see `mmrl.trainer.rollout.generate`."""
    rows = task.eval[:max_problems] if max_problems else task.eval
    if not rows:
        return {}, []
    n = 1 if temperature == 0 else k
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        if vision is not None:
            from mmrl.trainer.vision_prompts import generate_groups

            groups = generate_groups(model, tokenizer, vision, rows, n, max_new_tokens, temperature, max_prompt_tokens,
                                     batch_size, progress, top_p=top_p, repetition_penalty=repetition_penalty)
        else:
            groups = [Group(i, row, encode_prompt(tokenizer, row["messages"], max_prompt_tokens), []) for i, row in
                      enumerate(rows)]
            responses = generate(model, tokenizer, [g.prompt_ids for g in groups for _ in range(n)], max_new_tokens,
                                 temperature, top_p, batch_size, progress="eval" if progress else None,
                                 sampler=sampler, repetition_penalty=repetition_penalty)
            for i, g in enumerate(groups):
                g.responses = responses[i * n : (i + 1) * n]
    score_groups(groups, task.reward)
    correct = [sum(r.reward.components.get(task.accuracy_key, 0.0) >= 1.0 for r in g.responses) for g in groups]
    result: dict[str, Any] = {
        "problems": len(groups), "samples_per_problem": n,
        "pass@1": sum(pass_at_k(n, c, 1) for c in correct) / len(groups),
        f"pass@{n}": sum(pass_at_k(n, c, n) for c in correct) / len(groups),
        f"avg@{n}": sum(c / n for c in correct) / len(groups),
        "mean_reward": sum(r.reward.score for g in groups for r in g.responses) / (len(groups) * n),
    }
    if task.metrics is not None:  # task-specific metrics over every scored response (mIoU for grounding, ...)
        result.update(task.metrics([r.text for g in groups for r in g.responses],
                                   [g.sample for g in groups for _ in g.responses]))
    if task.format_key:
        result["format_rate"] = sum(r.reward.components.get(task.format_key, 0.0) >= 1.0 for g in groups
                                    for r in g.responses) / (len(groups) * n)
    return result, groups


def evaluate_episodes(model, tokenizer, task: EnvTask, **kwargs: Any) -> dict[str, Any]:
    """The metrics of :func:`evaluate_episode_groups` (same arguments)."""
    return evaluate_episode_groups(model, tokenizer, task, **kwargs)[0]


@torch.no_grad()
def evaluate_episode_groups(model, tokenizer, task: EnvTask, k: int = 4, temperature: float = 1.0,
                            max_new_tokens: int = 48, max_episode_tokens: int = 2048, seed: int = 0,
                            max_problems: int = 0, batch_size: int = 128, concurrent: int = 32,
                            env_factory=None, top_p: float = 1.0, progress: bool = False,
                            kv_cache: bool = True, layout: str = "episode") -> tuple[dict[str, Any], list[Group]]:
    """(metrics, one group of k episodes per held-out game: each response is an episode's actions and summary).
    ``concurrent`` envs are alive at a time, as each holds an engine.
    ``kv_cache``: carry each episode's KV cache across turns (see :func:`~mmrl.trainer.episodes.model_policy`; not in
    the turn layout).
    ``env_factory(row)``: a zero-argument env builder (default: in this process, ``task.make_env(row, layout)``).
    ``layout``: the agent layout the policy plays in (``turn``: re-prompted every turn, as it trained)."""
    env_factory = env_factory or (lambda row: partial(task.make_env, row, layout))
    # a turn-layout prompt is rebuilt every turn (window of recent turns), so no episode's context only grows: there
    # is no cache to carry across turns
    kv_cache = kv_cache and layout != "turn"
    rows = task.eval[:max_problems] if max_problems else task.eval
    if not rows:
        return {}, []
    n = 1 if temperature == 0 else k
    renderer = TurnRenderer(tokenizer, task.system_prompt)
    policy = model_policy(model, tokenizer, max_new_tokens, temperature, top_p, batch_size, kv_cache=kv_cache)
    plan = [(i, row) for i, row in enumerate(rows) for _ in range(n)]
    played: list[Episode] = []
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        bar = tqdm(total=len(plan), desc="eval", unit="episode", dynamic_ncols=True, disable=not progress)
        for start in range(0, len(plan), concurrent):
            chunk = plan[start : start + concurrent]
            episodes = [Episode(env_factory(row), seed=seed * 1_000_003 + i, layout=layout) for i, row in chunk]
            played += run_episodes(episodes, renderer, policy, max_episode_tokens)
            bar.update(len(chunk))
        bar.close()
    summaries = [ep.summary() for ep in played]
    wins = [sum(s["won"] for s in summaries[g * n:(g + 1) * n]) for g in range(len(rows))]
    result: dict[str, Any] = {"games": len(rows), "episodes_per_game": n,
                              "pass@1": sum(pass_at_k(n, c, 1) for c in wins) / len(rows),
                              f"pass@{n}": sum(pass_at_k(n, c, n) for c in wins) / len(rows),
                              "mean_return": sum(s["return"] for s in summaries) / len(summaries)}
    result.update(episode_metrics(summaries))
    groups = [Group(g, row, played[g * n].turns[0].prompt_ids if layout == "turn" and played[g * n].turns
                    else played[g * n].prompt_ids, [ep.response() for ep in played[g * n:(g + 1) * n]])
              for g, row in enumerate(rows)]
    return result, groups
