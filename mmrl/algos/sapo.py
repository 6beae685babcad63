"""SAPO: Soft Adaptive Policy Optimization.

Paper: "Soft Adaptive Policy Optimization" (Qwen team, 2025), https://arxiv.org/abs/2511.20347, §3.

Objective (written as a loss to minimise)::

    L = 1/G Σ_i 1/|y_i| Σ_t  -f_it(ρ_it) Â_i
    f_it(x) = σ(τ_it (x - 1)) · 4/τ_it,   τ_it = τ_pos if Â_i > 0 else τ_neg
    Â_i = (r_i - mean(r_group)) / std(r_group)

A soft, temperature-controlled gate in place of PPO's hard clip. The gradient of a token is
-w_it ρ_it Â_i ∇log π_θ(y_it) with w_it = 4 σ(τ(ρ-1)) (1 - σ(τ(ρ-1))): w = 1 at ρ = 1 for every τ (the 4/τ factor),
so an on-policy step is GRPO's; it then falls smoothly, never to exactly 0, as the token moves off-policy, so a few
off-policy tokens are damped alone where GSPO's sequence clip would silence their whole response (token-adaptive),
and when a response's token ratios are close together the average gate is a smooth function of the sequence's
geometric-mean ratio, a soft GSPO (sequence-coherent). τ_neg > τ_pos damps negative-advantage tokens faster: their
gradient raises the logits of many unsampled tokens, which the paper finds less stable.

Choices, written down:
* ``tau_pos`` 1.0 and ``tau_neg`` 1.05 are the paper's.
* Â = 0 takes τ_neg, as verl's ``sapo`` loss mode; the token's loss is 0 either way.
* ``loss_agg`` ``seq_mean_token_mean`` is the paper's average (verl's ``sapo`` fixes the same one); ``token_mean``
  is an option.
* ρ is computed from a log-ratio clamped to [-20, 20], so that ``exp`` never overflows (as verl).
* ``kl_coef`` (default 0: the paper has no KL term) adds GRPO's k3 KL to a frozen reference, per token.
* ``gate_weight`` logs the mean of w over trained tokens: 1 on-policy, lower as the update drifts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrl.algos.base import (
    Algorithm,
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
from mmrl.algos.grpo import check_group_normalised, grpo_advantages
from mmrl.errors import UserError


def soft_gate(ratio: Tensor, tau: Tensor) -> Tensor:
    """f(ρ) = σ(τ(ρ - 1)) · 4/τ, element-wise."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def gate_weight(ratio: Tensor, tau: Tensor) -> Tensor:
    """w = 4 σ(τ(ρ-1)) (1 - σ(τ(ρ-1))): the factor SAPO puts on the unclipped token gradient ρ Â ∇log π."""
    p = torch.sigmoid(tau * (ratio - 1.0))
    return 4.0 * p * (1.0 - p)


@register("sapo")
@dataclasses.dataclass(frozen=True)
class SAPO(Algorithm):
    tau_pos: float = 1.0  # gate temperature of tokens with a positive advantage
    tau_neg: float = 1.05  # of the others: > tau_pos damps negative updates faster
    kl_coef: float = 0.0
    loss_agg: str = "seq_mean_token_mean"
    scale_by_std: bool = True
    std_eps: float = 1e-6
    max_tokens: int | None = None  # constant divisor of loss_agg=seq_mean_token_sum_norm (None: batch width T)

    def validate(self) -> None:
        if self.tau_pos <= 0 or self.tau_neg <= 0:
            raise UserError(f"tau_pos and tau_neg must be > 0, got {self.tau_pos}, {self.tau_neg}")
        check_group_normalised(self)

    def uses_reference(self) -> bool:
        return self.kl_coef > 0

    def reference_kl_coef(self) -> float:
        return self.kl_coef

    def with_length_budget(self, tokens: int) -> SAPO:
        """``max_tokens`` (the constant of ``loss_agg=seq_mean_token_sum_norm``) = ``tokens`` unless set explicitly."""
        algo = super().with_length_budget(tokens)
        return algo if self.max_tokens is not None else dataclasses.replace(algo, max_tokens=tokens)

    def advantages(self, rewards: Tensor, group_ids: Tensor) -> Tensor:
        return grpo_advantages(rewards, group_ids, self.scale_by_std, self.std_eps)

    def loss_mass(self, mask: Tensor, group_ids: Tensor) -> float:
        return float(mask.sum()) if self.loss_agg == "token_mean" else float(mask.shape[0])

    def token_average(self, values: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
        return aggregate(values, mask, self.loss_agg, max_tokens=self.max_tokens)

    def temperatures(self, advantages: Tensor, like: Tensor) -> Tensor:
        """``[N, 1]`` τ of each response: τ_pos where Â > 0, τ_neg elsewhere."""
        pos = torch.tensor(self.tau_pos, dtype=like.dtype, device=like.device)
        neg = torch.tensor(self.tau_neg, dtype=like.dtype, device=like.device)
        return torch.where(advantages > 0, pos, neg)[:, None]

    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    group_ids: Tensor, ref_logprobs: Tensor | None = None,
                    stats: dict[str, Any] | None = None) -> tuple[Tensor, Metrics]:
        check_loss_inputs(logprobs, old_logprobs, advantages, mask, group_ids, ref_logprobs)
        mask = mask.to(logprobs.dtype)
        ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
        tau = self.temperatures(advantages, logprobs)
        token_loss = -soft_gate(ratio, tau) * advantages[:, None].to(logprobs.dtype)
        metrics = {}
        if self.kl_coef > 0:
            if ref_logprobs is None:
                raise ValueError(f"{self.name} with kl_coef > 0 needs ref_logprobs")
            kl = kl_k3(logprobs, ref_logprobs)
            token_loss = token_loss + self.kl_coef * kl
            metrics["kl_ref"] = masked_mean(kl.detach(), mask)
        loss = aggregate(token_loss, mask, self.loss_agg, max_tokens=self.max_tokens)
        metrics.update(
            gate_weight=masked_mean(gate_weight(ratio.detach(), tau), mask),
            ratio_max=(ratio.detach() * mask).max() if mask.any() else 1.0,
            **policy_drift_metrics(logprobs, old_logprobs, mask),
        )
        return loss, float_metrics(**metrics)
