"""GRPO (Shao et al., 2024, DeepSeekMath §4.1) with DAPO's decoupled clip range as an option.

Paper: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
https://arxiv.org/abs/2402.03300; DAPO: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
https://arxiv.org/abs/2503.14476.

Objective (DeepSeekMath Eq. 3, written as a loss to minimise)::

    L = 1/G Σ_i 1/|o_i| Σ_t  -min(ρ_it Â_i, clip(ρ_it, 1-ε_low, 1+ε_high) Â_i) + β·KL_k3(π_θ || π_ref)_it
    ρ_it = π_θ(o_it | q, o_i,<t) / π_old(o_it | q, o_i,<t)
    Â_i  = (r_i - mean(r_group)) / (std(r_group) + eps)                                   (Eq. of §4.1.2)

Choices, written down:
* ``kl_coef`` defaults to 0, as in Dr.GRPO, DAPO and TRL since 2025; DeepSeekMath used 0.04. With 0 no reference
  model is kept. The KL uses the k3 estimator (DeepSeekMath Eq. 4).
* std is the unbiased group std (as TRL and verl); groups of one response get advantage 0.
* ``loss_agg`` = ``seq_mean_token_mean`` is the paper's; ``token_mean`` is DAPO's token-level loss.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrl.algos.base import (
    LOSS_AGGREGATIONS,
    Algorithm,
    Metrics,
    Tensor,
    aggregate,
    check_batch,
    check_loss_inputs,
    float_metrics,
    group_mean_std,
    kl_k3,
    masked_mean,
    policy_drift_metrics,
    register,
)
from mmrl.errors import UserError


def clipped_surrogate(logprobs: Tensor, old_logprobs: Tensor, token_adv: Tensor, clip_low: float,
                      clip_high: float) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's per-token clipped surrogate as a loss. Returns (token_loss, clipped?, ratio), all ``[N, T]``.

    ``clipped`` marks tokens whose gradient the clip removed (the pessimistic branch was the clipped one).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # exp never overflows; |log ρ| > 20 is clipped anyway
    ratio = torch.exp(log_ratio)
    unclipped = ratio * token_adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * token_adv
    token_loss = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).float()
    return token_loss, was_clipped, ratio


def grpo_advantages(rewards: Tensor, group_ids: Tensor, scale_by_std: bool, eps: float) -> Tensor:
    check_batch(rewards, group_ids)
    mean, std, _ = group_mean_std(rewards, group_ids)
    centred = rewards.to(torch.float64) - mean
    adv = centred / (std + eps) if scale_by_std else centred
    return adv.to(torch.float32)


def check_group_normalised(algo: Any) -> None:
    """The settings GRPO shares with the objectives built on its advantage and loss average (CISPO, SAPO, GSPO): a
    bad value is one line naming it."""
    if algo.kl_coef < 0:
        raise UserError(f"kl_coef must be >= 0, got {algo.kl_coef}")
    if algo.loss_agg not in LOSS_AGGREGATIONS:
        raise UserError(f"loss_agg must be one of {LOSS_AGGREGATIONS}, got {algo.loss_agg!r}")
    if algo.std_eps <= 0:
        raise UserError(f"std_eps must be > 0, got {algo.std_eps}")
    if algo.max_tokens is not None and algo.max_tokens <= 0:
        raise UserError(f"max_tokens must be > 0, got {algo.max_tokens}")


@register("grpo")
@dataclasses.dataclass(frozen=True)
class GRPO(Algorithm):
    clip_low: float = 0.2
    clip_high: float = 0.2  # DAPO's clip-higher: 0.28
    kl_coef: float = 0.0
    loss_agg: str = "seq_mean_token_mean"
    scale_by_std: bool = True
    std_eps: float = 1e-6
    max_tokens: int | None = None  # constant divisor of loss_agg=seq_mean_token_sum_norm (None: batch width T)

    def validate(self) -> None:
        if not 0 <= self.clip_low < 1:
            raise UserError(f"clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0:
            raise UserError(f"clip_high must be >= 0, got {self.clip_high}")
        check_group_normalised(self)

    def uses_reference(self) -> bool:
        return self.kl_coef > 0

    def reference_kl_coef(self) -> float:
        return self.kl_coef

    def with_length_budget(self, tokens: int) -> GRPO:
        """``max_tokens`` (the constant of ``loss_agg=seq_mean_token_sum_norm``) = ``tokens`` unless set explicitly."""
        algo = super().with_length_budget(tokens)
        return algo if self.max_tokens is not None else dataclasses.replace(algo, max_tokens=tokens)

    def advantages(self, rewards: Tensor, group_ids: Tensor) -> Tensor:
        return grpo_advantages(rewards, group_ids, self.scale_by_std, self.std_eps)

    def loss_mass(self, mask: Tensor, group_ids: Tensor) -> float:
        return float(mask.sum()) if self.loss_agg == "token_mean" else float(mask.shape[0])

    def token_average(self, values: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
        return aggregate(values, mask, self.loss_agg, max_tokens=self.max_tokens)

    def token_advantages(self, advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor, mask: Tensor,
                         group_ids: Tensor, stats: dict[str, Any] | None) -> tuple[Tensor, Metrics]:
        """Per-token advantage; CW-GRPO overrides this to reweight tokens."""
        return advantages[:, None].expand_as(logprobs), {}

    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    group_ids: Tensor, ref_logprobs: Tensor | None = None,
                    stats: dict[str, Any] | None = None) -> tuple[Tensor, Metrics]:
        check_loss_inputs(logprobs, old_logprobs, advantages, mask, group_ids, ref_logprobs)
        mask = mask.to(logprobs.dtype)
        token_adv, extra = self.token_advantages(advantages, logprobs, old_logprobs, mask, group_ids, stats)
        token_loss, was_clipped, ratio = clipped_surrogate(logprobs, old_logprobs, token_adv, self.clip_low,
                                                           self.clip_high)
        metrics = {}
        if self.kl_coef > 0:
            if ref_logprobs is None:
                raise ValueError(f"{self.name} with kl_coef > 0 needs ref_logprobs")
            kl = kl_k3(logprobs, ref_logprobs)
            token_loss = token_loss + self.kl_coef * kl
            metrics["kl_ref"] = masked_mean(kl.detach(), mask)
        loss = aggregate(token_loss, mask, self.loss_agg, max_tokens=self.max_tokens)
        metrics.update(
            clip_frac=masked_mean(was_clipped, mask),
            ratio_max=(ratio.detach() * mask).max() if mask.any() else 1.0,
            **policy_drift_metrics(logprobs, old_logprobs, mask),
        )
        metrics.update(extra)
        return loss, float_metrics(**metrics)
