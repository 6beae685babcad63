"""The record a local training step logs (one line of metrics.jsonl): the rollouts' rewards, accuracy, lengths and
episode outcomes, the step's timings, the objective's batch statistics, KL to the initial policy, an MoE's expert load,
and the update's metrics.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

import mmrl.algos as algos
from mmrl import moe
from mmrl.algos.base import advantage_spread
from mmrl.batch import Group, Response, RolloutBatch
from mmrl.tasks import Task
from mmrl.tasks.base import EnvTask
from mmrl.trainer.episodes import episode_metrics


def episode_responses(responses: list[Response], turn_layout: bool) -> list[Response]:
    """The responses that each stand for one episode, for per-episode metrics (reward, success, format): all of them,
    or in the turn layout each episode's first turn. Every turn carries its episode's return, so averaged over turns
    long (mostly lost) episodes would weigh more."""
    return [r for r in responses if r.episode or not turn_layout]


def step_record(step: int, task: Task | EnvTask, groups: list[Group], batch: RolloutBatch, stats: dict[str, Any],
                failed: list[dict[str, Any]], times: dict[str, float], lr: float, turn_layout: bool,
                moe_experts: int, rollout_info: dict[str, float], update_metrics: dict[str, float]) -> dict[str, Any]:
    """The record of step ``step`` (0-based: the steps done before it). ``times``: seconds of the whole ``step``, the
    ``generation`` (rollouts and rewards), the ``rescoring`` and the ``update``; ``lr``: the next update's rate, which
    the update metrics' mean replaces; ``failed``: the summaries of the episodes whose env failed since the last
    record."""
    responses = [r for g in groups for r in g.responses]
    episodes = episode_responses(responses, turn_layout)
    components = [r.reward.components for r in episodes]
    returns = torch.tensor([r.reward.score for r in episodes], dtype=torch.float32)  # as collate holds them
    lengths = [len(r.token_ids) for r in responses]
    reasons = Counter(r.reward.reason for r in episodes if r.reward.reason)
    record: dict[str, Any] = {
        "step": step + 1,  # the update this step makes: a record is labelled with the updates done after it
        "reward": float(returns.mean()),
        "reward_std": float(returns.std()) if len(returns) > 1 else 0.0,  # whole batch, ddof 1, not per group
        "accuracy": float(np.mean([c.get(task.accuracy_key, 0.0) >= 1.0 for c in components])),
        "response_length": float(np.mean(lengths)),  # generated tokens, the stop token counted
        "truncated_frac": float(np.mean([r.truncated for r in responses])),
        "lr": lr,  # the next update's; the update metrics' mean replaces it
        "step_time": times["step"],
        "generation_time": times["generation"],  # rollouts and rewards (with GPG's resampling rounds)
        "rescoring_time": times["rescoring"],  # old (and reference) log-probs of the batch
        "update_time": times["update"],  # forward, backward and optimizer steps
        "batch_tokens": float(batch.attention_mask.sum()),  # prompt + response tokens the update reads, no padding
        "tokens_per_s": sum(lengths) / max(times["step"], 1e-9),  # response tokens over the whole step's time
        "top_zero_reason": reasons.most_common(1)[0][0] if reasons else None,
    }
    if task.format_key:
        record["format_rate"] = float(np.mean([c.get(task.format_key, 0.0) >= 1.0 for c in components]))
    record.update({k: float(v) for k, v in stats.items() if isinstance(v, (int, float))})
    record.update(advantage_spread(batch.advantages, batch.group_ids))
    if batch.ref_logprobs is not None:
        kl = algos.base.kl_k3(batch.old_logprobs, batch.ref_logprobs)
        record["kl_init"] = float((kl * batch.response_mask).sum() / batch.response_mask.sum().clamp(min=1))
    if batch.routing is not None:
        load = moe.expert_load(batch.routing, moe_experts, batch.attention_mask)
        record["moe/expert_load"] = [[round(x, 4) for x in layer] for layer in load.tolist()]
        record.update({f"rollout_{k.split('/')[1]}": v for k, v in moe.load_metrics(load).items()})
    if task.multi_turn:  # success (overall, per task type), valid-action and format rates, lengths
        record.update(episode_metrics([r.episode for r in responses if r.episode] + failed))
    record.update(rollout_info)
    record.update(update_metrics)
    return record
