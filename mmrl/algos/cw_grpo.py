"""CW-GRPO: covariance-aware GRPO with Gaussian-kernel advantage reweighting.

Paper: "Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage Reweighting",
https://arxiv.org/abs/2605.11538 (§2.3).

Per response token (§2.3)::

    c_it = (log π_θ(o_it) - mean(log π)) · (Â_i - mean(Â))            token covariance
    w_it = exp(-c_it² / (2σ²)),  σ = std of {c_it}                        Gaussian kernel
    w̃_it = w_it · N / Σ w                                                 mean 1 over the N tokens
    ℓ̃_it = GRPO token loss with Â_i replaced by w̃_it Â_i

No public implementation exists; this one is the reference, so every choice is written down:

* **Which log π.** The paper writes log π_θ; its setting (TRL GRPO, one update per rollout) has π_θ = π_old at that
  moment. We compute c from ``old_logprobs`` (the rollout policy, detached), so the weights are constants of the
  rollout batch: they carry no gradient (a kernel of the current policy would add a gradient term the paper does not
  have) and they stay the same across mini-batches and epochs.
* **Over what the means, σ and the normalisation run** (``stats_scope``). ``group`` (the default) follows the
  paper's equation: w̃_it = w_it · N / Σ_{j=1..G} Σ_k w_jk with N = Σ_{j=1..G} |o_j| sums over the G responses of
  *one* prompt, and "computed over responses" is read the same way, so each group gets its own means of log π and Â,
  its own σ and its own normalisation (each group's weights average 1 over its tokens). This is also what the
  paper's code base computes: Open-RS trains with TRL's GRPOTrainer, whose loss call sees one prompt's group at a
  time in its layout (one prompt per device batch there). ``batch`` runs them over every response token of the
  rollout batch instead (N = all tokens of the step): the weights then also compare groups with each other, which
  the paper does not write. :meth:`batch_stats` computes the moments once per rollout batch: four numbers for
  ``batch`` (a distributed backend all-reduces token sums), four per response for ``group`` (each response carries
  its group's moments, so a micro-batch or rank holding part of a group still uses the whole group's). Means are
  token-weighted, as in Clip-Cov (Cui et al., 2025) whose covariance this paper builds on.
* **σ** is the population std (ddof 0) of c; if σ = 0 (e.g. every advantage equal), every weight is 1.
* **The GRPO token loss** keeps GRPO's ratio clip and optional KL (the paper's ℓ_it is GRPO's token loss); the KL term
  is not reweighted, as in the paper's ℓ̃_it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrl.algos.base import Metrics, Tensor, register
from mmrl.algos.grpo import GRPO
from mmrl.errors import UserError

STATS_SCOPES = ("group", "batch")
STAT_KEYS = ("cov_mean_logp", "cov_mean_adv", "cov_sigma", "cov_mean_weight")


def covariance_stats(old_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, float]:
    """Moments of §2.3 over every token of the rows given: token means of log π and Â, σ of c, the mean raw weight."""
    mask = mask.to(torch.float64)
    n = mask.sum().clamp(min=1)
    lp = old_logprobs.to(torch.float64)
    adv = advantages.to(torch.float64)[:, None].expand_as(lp)
    mean_logp = (lp * mask).sum() / n
    mean_adv = (adv * mask).sum() / n
    c = (lp - mean_logp) * (adv - mean_adv) * mask
    c_mean = c.sum() / n
    sigma = (((c - c_mean) ** 2 * mask).sum() / n).sqrt()
    w = _kernel(c, sigma)
    mean_w = (w * mask).sum() / n
    return {"cov_mean_logp": float(mean_logp), "cov_mean_adv": float(mean_adv), "cov_sigma": float(sigma),
            "cov_mean_weight": float(mean_w) if mask.sum() > 0 else 1.0}


def group_covariance_stats(old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                           group_ids: Tensor) -> dict[str, Tensor]:
    """The moments of :func:`covariance_stats` computed over each group's own tokens, as ``[N]`` float64 tensors:
    row i holds the moments of row i's group."""
    group_ids = group_ids.cpu()
    out = {k: torch.empty(len(group_ids), dtype=torch.float64) for k in STAT_KEYS}
    for gid in torch.unique(group_ids).tolist():
        rows = (group_ids == gid).nonzero().squeeze(1)
        on = rows.to(old_logprobs.device)
        for key, value in covariance_stats(old_logprobs[on], advantages[on], mask[on]).items():
            out[key][rows] = value
    return out


def _kernel(c: Tensor, sigma: Tensor | float) -> Tensor:
    """exp(-c² / 2σ²); 1 wherever σ is 0 or not finite (every covariance equal)."""
    sigma = torch.as_tensor(sigma, dtype=c.dtype, device=c.device)
    usable = (sigma > 0) & torch.isfinite(sigma)
    safe = torch.where(usable, sigma, torch.ones_like(sigma))
    return torch.where(usable, torch.exp(-(c**2) / (2 * safe**2)), torch.ones_like(c))


def _column(value: float | Tensor, like: Tensor) -> Tensor:
    """A statistic as a number or as one value per row, shaped to broadcast over ``[B, T]``."""
    value = torch.as_tensor(value, dtype=torch.float64, device=like.device)
    return value[:, None] if value.dim() == 1 else value


def covariance_weights(old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                       stats: dict[str, float | Tensor] | None = None) -> Tensor:
    """w̃ of §2.3, ``[B, T]`` (detached). ``stats``: the moments of the rows' scope, numbers (one scope for every
    row, :func:`covariance_stats`) or ``[B]`` tensors (each row's group, :func:`group_covariance_stats`); None
    computes them over these rows."""
    stats = stats or covariance_stats(old_logprobs, advantages, mask)
    lp = old_logprobs.detach().to(torch.float64)
    adv = advantages.detach().to(torch.float64)[:, None].expand_as(lp)
    c = (lp - _column(stats["cov_mean_logp"], lp)) * (adv - _column(stats["cov_mean_adv"], lp))
    mean_w = _column(stats["cov_mean_weight"], lp).clamp(min=1e-12)
    w = _kernel(c, _column(stats["cov_sigma"], lp)) / mean_w
    return (w * mask).to(old_logprobs.dtype)


@register("cw_grpo")
@dataclasses.dataclass(frozen=True)
class CWGRPO(GRPO):
    batch_stats_reads_old_logprobs = True  # the covariance moments are of the rollout policy's log-probs
    stats_scope: str = "group"  # "group": the paper's equation (one prompt's responses); "batch": the rollout batch

    def validate(self) -> None:
        super().validate()
        if self.stats_scope not in STATS_SCOPES:
            raise UserError(f"stats_scope must be one of {', '.join(STATS_SCOPES)}, got {self.stats_scope!r}")

    def batch_stats(self, rewards: Tensor, group_ids: Tensor, advantages: Tensor, old_logprobs: Tensor,
                    mask: Tensor) -> dict[str, Any]:
        if self.stats_scope == "batch":
            return covariance_stats(old_logprobs, advantages, mask)
        return group_covariance_stats(old_logprobs, advantages, mask, group_ids)

    def token_advantages(self, advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor, mask: Tensor,
                         group_ids: Tensor, stats: dict[str, Any] | None) -> tuple[Tensor, Metrics]:
        if stats and all(k in stats for k in STAT_KEYS):
            moments = {k: stats[k] for k in STAT_KEYS}
        elif self.stats_scope == "batch":  # no whole-batch moments given: these rows are the batch
            moments = covariance_stats(old_logprobs, advantages, mask)
        else:
            moments = group_covariance_stats(old_logprobs, advantages, mask, group_ids)
        w = covariance_weights(old_logprobs, advantages, mask, moments)
        n = mask.sum().clamp(min=1)
        w_min = w.masked_fill(mask == 0, float("inf")).min() if mask.any() else torch.tensor(1.0)
        # the share of tokens the kernel at least halves: on short answers these are mostly the answer's own tokens
        # (low log-prob, so the largest |c|), which is how CW-GRPO can slow the learning of what the reward checks
        halved = ((w < 0.5) & (mask > 0)).sum() / n
        metrics = {"cw_weight_mean": float((w * mask).sum() / n), "cw_weight_min": float(w_min),
                   "cw_halved_frac": float(halved)}
        return w * advantages[:, None], metrics
