"""``MmrlPolicyLoss``: OpenRLHF's ``PolicyLoss`` call and 5-tuple contract around mmrl's ``Algorithm.policy_loss``.

OpenRLHF 0.11.2's ``ActorPPOTrainer.training_step`` calls
``actor_loss_fn(log_probs, old_log_probs, advantages, action_mask=..., rollout_log_probs=..., **loss_batch_info)`` and
unpacks ``(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)``. That call carries no group ids, reference log-probs
or whole-batch statistics, so mmrl's actor binds them per micro-batch (:class:`MicroBatch`) just before it; the loss
refuses to run without one. ``advantages`` arrive per token (OpenRLHF's layout); mmrl's objectives take one per
response, which is the advantage on any trained token (they are constant over a response). A non-finite objective
value is replaced by a zero loss (no gradient from that micro-batch) and counted in ``nonfinite_loss``: DeepSpeed in
bf16 has no overflow check that would skip the step. With ``algo.rollout_correction`` the objective reads the
log-probs with each token's gradient weighted by its trainer/vLLM ratio (`mmrl.algos.rollout_correction`), from the
``rollout_log_probs`` OpenRLHF passes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from openrlhf.models.loss import PolicyLoss

from mmrl.algos import Algorithm
from mmrl.algos.base import Metrics, kl_to_old, masked_mean
from mmrl.algos.rollout_correction import RolloutCorrection


@dataclasses.dataclass
class MicroBatch:
    """What the loss needs beside OpenRLHF's arguments, for one micro-batch."""

    group_ids: torch.Tensor  # [B]
    stats: dict[str, Any]  # the objective's whole-batch statistics (Algorithm.batch_stats)
    scale: float  # loss weight from mmrl.openrlhf.grouping.loss_scale
    ref_logprobs: torch.Tensor | None = None  # [B, A] when the objective reads them


def sequence_advantages(token_advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` per-response advantage from the ``[B, A]`` per-token layout (constant over a response's tokens)."""
    mask = mask.to(token_advantages.dtype)
    return (token_advantages * mask).sum(1) / mask.sum(1).clamp(min=1)


class MmrlPolicyLoss(PolicyLoss):
    """An mmrl objective as an OpenRLHF policy loss (same call, same 5-tuple)."""

    def __init__(self, algo: Algorithm, correction: RolloutCorrection | None = None) -> None:
        super().__init__()
        self.algo = algo
        self.correction = correction or RolloutCorrection()  # algo.rollout_correction: none unless asked for
        self.micro: MicroBatch | None = None
        self.last_loss: torch.Tensor | None = None  # unscaled objective value of the last call (for logging)
        self.last_metrics: Metrics = {}
        self.last_kl_max = 0.0  # the largest per-token k3 KL to π_old of the last call (a mean hides a few tokens)

    def bind(self, micro: MicroBatch) -> None:
        self.micro = micro

    def forward(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                action_mask: torch.Tensor | None = None, rollout_log_probs: torch.Tensor | None = None,
                dp_size: int = 1, batch_num_tokens: float | None = None, global_batch_size: float | None = None):
        """(scaled loss, clip ratio, k1 KL to π_old, None, None); OpenRLHF's token normalisers are not used: the
        objective's own ``loss_mass`` normalisation is in ``MicroBatch.scale``."""
        micro, self.micro = self.micro, None  # one binding serves exactly one call
        if micro is None:
            raise RuntimeError("MmrlPolicyLoss needs bind(MicroBatch) before each call (mmrl's actor does it)")
        mask = (action_mask if action_mask is not None else torch.ones_like(log_probs)).to(log_probs.dtype)
        # the rollout correction on vLLM's log-probs of the same tokens (OpenRLHF's rollout_log_probs)
        corrected = self.correction.apply(log_probs, old_log_probs, rollout_log_probs, mask)
        loss, metrics = self.algo.policy_loss(
            logprobs=corrected, old_logprobs=old_log_probs, advantages=sequence_advantages(advantages, mask),
            mask=mask, group_ids=micro.group_ids.to(log_probs.device), ref_logprobs=micro.ref_logprobs,
            stats=micro.stats)
        finite = bool(torch.isfinite(loss))
        # always the same metric keys on every rank: the actor all-reduces them as one vector
        metrics = {**metrics, "nonfinite_loss": 0.0 if finite else 1.0}
        if not finite:  # NaN/inf never reach DeepSpeed: this micro-batch contributes no gradient
            loss = (log_probs * 0.0).sum()
        self.last_loss, self.last_metrics = loss.detach(), metrics
        self.last_kl_max = kl_to_old(log_probs, old_log_probs, mask)[1]
        clip_ratio = torch.tensor(metrics.get("clip_frac", 0.0), device=log_probs.device)
        ppo_kl = masked_mean(-(log_probs - old_log_probs).detach(), mask)  # OpenRLHF's ppo_kl definition
        return loss * micro.scale, clip_ratio, ppo_kl, None, None
