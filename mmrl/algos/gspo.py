"""GSPO: Group Sequence Policy Optimization, and its token variant GSPO-token.

Paper: "Group Sequence Policy Optimization" (Zheng et al., 2025, Qwen), https://arxiv.org/abs/2507.18071, Eq. 5-7
(GSPO) and Eq. 13-14 (GSPO-token).

Objective (Eq. 5, written as a loss to minimise)::

    L = 1/G Σ_i  -min(s_i Â_i, clip(s_i, 1-ε_low, 1+ε_high) Â_i)
    s_i = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|) = exp( 1/|y_i| Σ_t log ρ_it )            (Eq. 7)
    Â_i = (r_i - mean(r_group)) / std(r_group)                                            (Eq. 6)

s_i is the geometric mean of the token ratios: one ratio per response, on the same scale whatever its length, and
the clip keeps or drops a whole response. Its gradient (Eq. 10) weights every token of a response equally,
s_i Â_i / |y_i| ∇log π_θ(y_it), where GRPO weights each token by its own ratio.

GSPO-token (``variant="token"``, Eq. 13-14) gives each token the ratio s_it = sg[s_i] · π_θ(y_it) / sg[π_θ(y_it)]:
its value is s_i, and its gradient is s_i ∇log π_θ(y_it), so with one advantage per response it is GSPO in value,
clip and gradient (§4.3); it differs once advantages differ per token (``token_advantages``, the hook that CW-GRPO
uses on GRPO), each token then carrying its own Â_it with the sequence's ratio.

Choices, written down:
* ``clip_low`` 3e-4 and ``clip_high`` 4e-4 are the paper's (§5.1, "the left and right clipping ranges in Eq. (5) to
  3e-4 and 4e-4"): the ratio of a length-normalised sequence moves far less than a token's.
* The loss is averaged over responses (1/G Σ_i, ``loss_agg`` ``seq_mean_token_mean``); ``token_mean`` weights each
  response by its length instead (verl's default aggregation for its ``gspo`` loss mode).
* log s_i is clamped to [-20, 20] so that ``exp`` never overflows (verl clamps it above at 10, which only changes
  ratios that the clip has removed already, or a negative-advantage response more than e^10 above π_old).
* ``kl_coef`` (default 0: Eq. 5 has no KL term) adds GRPO's k3 KL to a frozen reference, per token.
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
from mmrl.algos.grpo import GRPO
from mmrl.errors import UserError

VARIANTS = ("sequence", "token")


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``[N]`` log s_i = the mean over a response's trained tokens of log ρ_it (0 for a response with none)."""
    total = ((logprobs - old_logprobs) * mask).sum(1)
    return (total / mask.sum(1).clamp(min=1)).clamp(-20.0, 20.0)


def gspo_token_ratio(logprobs: Tensor, seq_log_ratio: Tensor) -> Tensor:
    """``[N, T]`` GSPO-token's s_it = sg[s_i] · π_θ(y_it) / sg[π_θ(y_it)] (Eq. 14): valued s_i, gradient s_i ∇log π."""
    return torch.exp(seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach())


def clipped_loss(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """(-min(ratio·Â, clip(ratio)·Â), whether the clip removed the gradient), element-wise on any shape."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped)


@register("gspo")
@dataclasses.dataclass(frozen=True)
class GSPO(GRPO):
    clip_low: float = 3e-4  # the paper's left clipping range (§5.1)
    clip_high: float = 4e-4  # the paper's right clipping range (§5.1)
    variant: str = "sequence"  # "sequence" (GSPO, Eq. 5) or "token" (GSPO-token, Eq. 13)

    def validate(self) -> None:
        super().validate()
        if self.variant not in VARIANTS:
            raise UserError(f"variant must be one of {VARIANTS}, got {self.variant!r}")

    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    group_ids: Tensor, ref_logprobs: Tensor | None = None,
                    stats: dict[str, Any] | None = None) -> tuple[Tensor, Metrics]:
        check_loss_inputs(logprobs, old_logprobs, advantages, mask, group_ids, ref_logprobs)
        mask = mask.to(logprobs.dtype)
        seq_log_ratio = sequence_log_ratio(logprobs, old_logprobs, mask)
        if self.variant == "sequence":
            # one ratio and one clip decision per response; spread over its tokens so that loss_agg averages it
            seq_loss, seq_clipped = clipped_loss(torch.exp(seq_log_ratio), advantages, self.clip_low, self.clip_high)
            token_loss = seq_loss[:, None].expand_as(logprobs)
            was_clipped = seq_clipped[:, None].expand_as(logprobs).to(mask.dtype)
            extra: Metrics = {}
        else:
            token_adv, extra = self.token_advantages(advantages, logprobs, old_logprobs, mask, group_ids, stats)
            token_loss, clipped = clipped_loss(gspo_token_ratio(logprobs, seq_log_ratio), token_adv, self.clip_low,
                                               self.clip_high)
            was_clipped = clipped.to(mask.dtype)
        metrics = {}
        if self.kl_coef > 0:
            if ref_logprobs is None:
                raise ValueError(f"{self.name} with kl_coef > 0 needs ref_logprobs")
            kl = kl_k3(logprobs, ref_logprobs)
            token_loss = token_loss + self.kl_coef * kl
            metrics["kl_ref"] = masked_mean(kl.detach(), mask)
        loss = aggregate(token_loss, mask, self.loss_agg, max_tokens=self.max_tokens)
        seq_ratio = torch.exp(seq_log_ratio.detach())
        has_tokens = mask.sum(1) > 0
        metrics.update(
            clip_frac=masked_mean(was_clipped, mask),
            seq_ratio_max=seq_ratio[has_tokens].max() if has_tokens.any() else 1.0,
            seq_ratio_min=seq_ratio[has_tokens].min() if has_tokens.any() else 1.0,
            **policy_drift_metrics(logprobs, old_logprobs, mask),
        )
        metrics.update(extra)
        return loss, float_metrics(**metrics)
