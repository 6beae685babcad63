"""GPG: Group Policy Gradient.

Paper: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning" (Chu et al., 2025),
https://arxiv.org/abs/2504.02546.

Loss (the GPG paper's Eq. 5 with Eq. 6-8 and Algorithm 1, line 3)::

    L = -α · 1/Σ|o_i| Σ_i Σ_t  log π_θ(o_it | q, o_i,<t) · Â_i
    Â_i = (r_i - mean(r_group)) / F_norm                  (Eq. 6; F_norm = 1 by default, or the group std)
    α   = B / (B - M)                                      (Eq. 7-8)

B is the number of responses in the rollout batch and M the number of responses whose group rewards are all equal
(those give exactly zero gradient). No importance ratio, no clip, no KL, no reference model (Table 2).

Choices, written down:
* α is folded into the advantage, computed once on the whole rollout batch (Eq. 8 says the objective is α·J, and
  a backend that splits the batch must not recompute it per mini-batch). The official trainer counts groups instead
  of responses; with equal group sizes the two ratios are identical.
* When every group is degenerate (B == M), α is set to 1: every advantage is 0, so the gradient is 0 either way and
  no division by zero happens.
* Token aggregation, ``loss_agg`` (the official trainers differ, so it is an option; base.aggregate):
  - ``token_mean`` (default): sum over all tokens of the batch / number of tokens, Eq. 5's 1/Σ|o_i| Σ_i Σ_t, and the
    official math trainers' (``open-r1/src/open_r1/gpg_trainer.py`` and ``open-rs/src/open_r1/trainer/gpg_trainer.py``
    in AMAP-ML/GPG: ``(per_token_loss * completion_mask).sum() / completion_mask.sum()``);
  - ``seq_mean_token_mean``: each response's token mean, then the mean over responses: the official GeoQA trainer's
    (``R1-V/src/r1-v/src/open_r1/trainer/grpo_trainer.py``, ``pg_name == 'gpg'``), which the GeoQA recipe sets;
  - ``seq_mean_token_sum_norm``: the token sum / (responses × ``max_tokens``), Dr.GRPO's constant normaliser.
  For a single group of equal-length responses the three agree up to the constant.
* The β_th threshold (Algorithm 1, line 1; §2.2 "Thresholding minimal partition of valid samples") is enforced by the
  rollout loop of either backend, following :meth:`GPG.resampling` (``valid_threshold``, ``max_resample``): while the
  fraction of valid responses is below β_th it keeps the valid groups and generates more prompts, at most
  ``max_resample`` extra rounds (20 as the official code), then trains on what it has instead of crashing. Default
  β_th = 0.6 as Table 1's best row and Appendix B (the official GeoQA script uses 0.4, ``--min_inverse_alpha``; 0
  turns it off).
* The loss has no ratio, so it is exact only on-policy (one update per rollout, as in the paper).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrl.algos.base import (
    LOSS_AGGREGATIONS,
    Algorithm,
    Metrics,
    Resampling,
    Tensor,
    aggregate,
    check_batch,
    check_loss_inputs,
    float_metrics,
    group_all_equal,
    group_mean_std,
    policy_drift_metrics,
    register,
)
from mmrl.errors import UserError


def gpg_alpha(rewards: Tensor, group_ids: Tensor) -> tuple[float, float]:
    """(α, valid fraction) of a rollout batch; Eq. 7."""
    invalid = group_all_equal(rewards, group_ids)
    b = rewards.numel()
    valid = b - int(invalid.sum().item())
    alpha = b / valid if valid > 0 else 1.0
    return alpha, (valid / b if b else 0.0)


@register("gpg")
@dataclasses.dataclass(frozen=True)
class GPG(Algorithm):
    f_norm: str = "none"  # "none" (F_norm = 1) or "std" (group std, as GRPO)
    adjust_alpha: bool = True  # α = B/(B-M); False gives α = 1 (Table 1 ablations)
    valid_threshold: float = 0.6  # β_th; 0 disables resampling
    max_resample: int = 20
    std_eps: float = 1e-4  # as the official code
    loss_agg: str = "token_mean"  # Eq. 5; "seq_mean_token_mean" for the official GeoQA trainer (see above)
    max_tokens: int | None = None  # constant divisor of loss_agg=seq_mean_token_sum_norm (None: batch width T)

    on_policy_only = True

    def validate(self) -> None:
        if self.f_norm not in ("none", "std"):
            raise UserError(f"f_norm must be 'none' or 'std', got {self.f_norm!r}")
        if not 0 <= self.valid_threshold <= 1:
            raise UserError(f"valid_threshold must be in [0, 1], got {self.valid_threshold}")
        if self.max_resample < 0:
            raise UserError(f"max_resample must be >= 0, got {self.max_resample}")
        if self.std_eps <= 0:
            raise UserError(f"std_eps must be > 0, got {self.std_eps}")
        if self.loss_agg not in LOSS_AGGREGATIONS:
            raise UserError(f"loss_agg must be one of {LOSS_AGGREGATIONS}, got {self.loss_agg!r}")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise UserError(f"max_tokens must be > 0, got {self.max_tokens}")

    def resampling(self) -> Resampling:
        """β_th's rule; DAPO's dynamic sampling instead when ``dynamic_sampling`` is set (every group valid)."""
        return super().resampling() if self.dynamic_sampling else Resampling(self.valid_threshold, self.max_resample)

    def with_length_budget(self, tokens: int) -> GPG:
        """``max_tokens`` (the constant of ``loss_agg=seq_mean_token_sum_norm``) = ``tokens`` unless set explicitly."""
        algo = super().with_length_budget(tokens)
        return algo if self.max_tokens is not None else dataclasses.replace(algo, max_tokens=tokens)

    def advantages(self, rewards: Tensor, group_ids: Tensor) -> Tensor:
        check_batch(rewards, group_ids)
        mean, std, _ = group_mean_std(rewards, group_ids)
        adv = rewards.to(torch.float64) - mean
        if self.f_norm == "std":
            adv = adv / (std + self.std_eps)
        adv = torch.where(group_all_equal(rewards, group_ids), torch.zeros_like(adv), adv)
        if self.adjust_alpha:
            adv = adv * gpg_alpha(rewards, group_ids)[0]
        return adv.to(torch.float32)

    def loss_mass(self, mask: Tensor, group_ids: Tensor) -> float:
        return float(mask.sum()) if self.loss_agg == "token_mean" else float(mask.shape[0])

    def token_average(self, values: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
        return aggregate(values, mask, self.loss_agg, max_tokens=self.max_tokens)

    def batch_stats(self, rewards: Tensor, group_ids: Tensor, advantages: Tensor, old_logprobs: Tensor,
                    mask: Tensor) -> dict[str, Any]:
        alpha, valid = gpg_alpha(rewards, group_ids)
        return {"alpha": alpha if self.adjust_alpha else 1.0, "valid_fraction": valid}

    def policy_loss(self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                    group_ids: Tensor, ref_logprobs: Tensor | None = None,
                    stats: dict[str, Any] | None = None) -> tuple[Tensor, Metrics]:
        check_loss_inputs(logprobs, old_logprobs, advantages, mask, group_ids, ref_logprobs)
        mask = mask.to(logprobs.dtype)
        loss = aggregate(-logprobs * advantages[:, None], mask, self.loss_agg, max_tokens=self.max_tokens)
        return loss, float_metrics(**policy_drift_metrics(logprobs, old_logprobs, mask))
