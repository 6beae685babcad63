"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1).

Paper: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention" (MiniMax, 2025),
https://arxiv.org/abs/2506.13585, §3.1, Eq. 4-5.

Objective (Eq. 4, written as a loss to minimise)::

    L = -1/Σ_i|o_i| Σ_i Σ_t  sg(r̂_it) · Â_i · log π_θ(o_it | q, o_i,<t)
    r̂_it = clip(ρ_it, 1-ε_low, 1+ε_high)            (Eq. 5),  ρ_it = π_θ(o_it) / π_old(o_it)
    Â_i  = (r_i - mean(r_group)) / std(r_group)       (GRPO's group-relative advantage)

PPO and GRPO drop a token's gradient once its ratio leaves the clip range; the paper finds that these are often rare
"fork" tokens (However, Recheck, Wait) that matter for long reasoning. CISPO clips the importance weight instead and
stops its gradient, so every token keeps the REINFORCE gradient -sg(r̂_it) Â_i ∇log π_θ(o_it): a token whose ratio
left the range is weighted by the bound rather than silenced.

Choices, written down:
* ``loss_agg`` ``token_mean`` is Eq. 4's token-level normalisation (1/Σ|o_i|: long responses weigh by their length).
* No lower bound on the weight, as the paper ("we did not impose a lower bound on the IS weight by setting ε_low^IS to
  a large value"): ``clip_low`` 1.0 makes 1-ε_low = 0, below every ratio. A smaller ``clip_low`` sets one.
* ``clip_high`` 5.0: the paper tunes ε_high^IS without printing its value; 5.0 is the ε_max that ScaleRL
  ("The Art of Scaling Reinforcement Learning Compute for LLMs", https://arxiv.org/abs/2510.13786) trains CISPO with,
  and TRL's recommended ``epsilon_high`` for its ``cispo`` loss.
* No KL term (the paper has none); ``kl_coef`` > 0 adds GRPO's k3 KL to a frozen reference, per token.
* The loss value is the one of Eq. 4 (it holds log π_θ itself, not a ratio), as verl's ``cispo`` loss mode: its
  gradient is the paper's; its value is not comparable with a ratio objective's.
* ``clip_frac`` counts the response tokens whose weight the clip changed (they still train, with the bound).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrl.algos.base import (
    Metrics,
    Tensor,
    aggregate,
    check_loss_inputs,
    float_metrics,
    kl_k3,
    masked_mean,
    policy_drift_metrics,
    register,
)
from mmrl.algos.grpo import GRPO, check_group_normalised
from mmrl.errors import UserError


def cispo_weights(logprobs: Tensor, old_logprobs: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """(the clipped importance weight sg(r̂_it) ``[N, T]``, no gradient; whether the clip changed it ``[N, T]``)."""
    ratio = torch.exp((logprobs.detach() - old_logprobs).clamp(-20.0, 20.0))
    weight = ratio.clamp(max(1.0 - clip_low, 0.0), 1.0 + clip_high)
    return weight, weight != ratio


@register("cispo")
@dataclasses.dataclass(frozen=True)
class CISPO(GRPO):
    clip_low: float = 1.0  # 1-ε_low = 0: no lower bound on the weight, as the paper
    clip_high: float = 5.0  # ScaleRL's ε_max (the paper does not print its value)
    loss_agg: str = "token_mean"  # Eq. 4: 1/Σ|o_i|

    def validate(self) -> None:
        if self.clip_low < 0 or self.clip_high < 0:
            raise UserError(f"clip_low and clip_high must be >= 0, got {self.clip_low}, {self.clip_high}")
        check_group_normalised(self)

    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    group_ids: Tensor, ref_logprobs: Tensor | None = None,
                    stats: dict[str, Any] | None = None) -> tuple[Tensor, Metrics]:
        check_loss_inputs(logprobs, old_logprobs, advantages, mask, group_ids, ref_logprobs)
        mask = mask.to(logprobs.dtype)
        token_adv, extra = self.token_advantages(advantages, logprobs, old_logprobs, mask, group_ids, stats)
        weight, changed = cispo_weights(logprobs, old_logprobs, self.clip_low, self.clip_high)
        token_loss = -weight * token_adv * logprobs
        metrics = {}
        if self.kl_coef > 0:
            if ref_logprobs is None:
                raise ValueError(f"{self.name} with kl_coef > 0 needs ref_logprobs")
            kl = kl_k3(logprobs, ref_logprobs)
            token_loss = token_loss + self.kl_coef * kl
            metrics["kl_ref"] = masked_mean(kl.detach(), mask)
        loss = aggregate(token_loss, mask, self.loss_agg, max_tokens=self.max_tokens)
        metrics.update(
            clip_frac=masked_mean(changed.to(mask.dtype), mask),
            weight_max=(weight * mask).max() if mask.any() else 1.0,
            **policy_drift_metrics(logprobs, old_logprobs, mask),
        )
        metrics.update(extra)
        return loss, float_metrics(**metrics)
