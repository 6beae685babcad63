"""Rollout importance-sampling correction: the sampler's and the trainer's log-probs of the same tokens differ.

Responses are sampled by one engine (vLLM on the openrlhf backend; mmrl's sampler or transformers' ``generate`` on the
local one) and the loss reads the trainer's own log-probs of the same tokens at the same weights, π_old. Different
kernels, bfloat16, top-p/top-k truncation and a late weight sync make the two differ, so the sampled tokens are
slightly off-policy for the trainer. Per trained token t of response i (no gradient)::

    ρ_it = π_train(o_it | θ_old) / π_sampler(o_it | θ_old) = exp(old_logprobs - rollout_logprobs)

Each method turns ρ into a weight w_it of the token's loss:

* ``tis``, truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy
  RL Training", https://fengyao.notion.site/off-policy-rl, its TIS-corrected PPO gradient)::

      w_it = min(ρ_it, C)                                                      (C = ``cap``, default 2)

* ``icepop`` (Ling Team 2025, "Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale Thinking Model",
  arXiv 2510.18855, the IcePop objective's masking function M(k) = k on [α, β], 0 outside)::

      w_it = ρ_it  if α <= ρ_it <= β  else 0                          (α, β = ``low``, ``high``: default 0.5, 5)

* ``seq_mask`` (OpenRLHF 0.11's ``is_correction_level seq``, verl's sequence-level rejection): a response is dropped
  when the geometric mean of its tokens' ratios leaves the band, the kept ones keep their tokens' ratios::

      g_i = exp(mean_t log ρ_it);   w_it = ρ_it  if α <= g_i <= β  else 0

Written down where the paper and a peer differ: OpenRLHF's ``clip`` mode (its TIS) clamps ρ into [low, high] (0.5 by
default from below too); the paper truncates from above only, and so does ``tis`` here. A masked token still counts
in its response's length, the objective's denominator, as in IcePop's 1/|y| outside the sum and in OpenRLHF.

The weight is applied to any objective through the gradient (:func:`weighted_gradient`): each token's log-prob keeps
its value and carries ``w`` times its gradient, which is exactly the gradient of Σ_t w_t ℓ_t for a loss ℓ_t per token
(PPO-clip, CISPO, SAPO) and the per-token weighting verl applies to the sequence-ratio objectives (GSPO, GMPO). The
objective's KL-to-reference term, read from the same log-probs, is weighted too (its samples are off-policy alike); the
entropy bonus is not. Tokens whose sampler log-prob is unknown (NaN: a replayed older response) get weight 1 and are
left out of the metrics.
"""

from __future__ import annotations

import dataclasses

import torch

from mmrl.errors import UserError

Tensor = torch.Tensor

METHODS = ("none", "tis", "icepop", "seq_mask")


@dataclasses.dataclass(frozen=True)
class RolloutCorrection:
    """A correction method and its thresholds: ``cap`` (TIS's C), ``low`` and ``high`` (IcePop's and the sequence
    mask's band on the ratio)."""

    method: str = "none"
    cap: float = 2.0
    low: float = 0.5
    high: float = 5.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"algo.rollout_correction must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.cap <= 0:
            raise UserError(f"algo.rollout_is_cap must be > 0, got {self.cap}")
        if not 0 <= self.low < self.high:
            raise UserError(f"algo.rollout_mask_low and rollout_mask_high need 0 <= low < high, got {self.low}, "
                            f"{self.high}")

    @property
    def active(self) -> bool:
        return self.method != "none"

    def decide(self, old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(weights ``[N, T]`` float32 without gradient, masked ``[N, T]`` bool, truncated ``[N, T]`` bool). Weights are
        1 off the trained tokens and where the sampler's log-prob is unknown."""
        known = (mask > 0) & torch.isfinite(rollout_logprobs)
        log_ratio = token_log_ratio(old_logprobs, rollout_logprobs, known)
        ratio = log_ratio.exp()
        off = torch.zeros_like(known)
        if self.method == "tis":
            truncated = known & (ratio > self.cap)
            return torch.where(truncated, torch.full_like(ratio, self.cap), ratio), off, truncated
        if self.method == "icepop":
            masked = known & ((ratio < self.low) | (ratio > self.high))
        elif self.method == "seq_mask":
            counted = known.float()
            geo = ((log_ratio * counted).sum(1) / counted.sum(1).clamp(min=1)).exp()
            masked = known & ((geo < self.low) | (geo > self.high))[:, None]
        else:
            return torch.ones_like(ratio), off, off
        return torch.where(masked, torch.zeros_like(ratio), ratio), masked, off

    def weights(self, old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
        """``[N, T]`` per-token loss weights (:meth:`decide`'s first)."""
        return self.decide(old_logprobs, rollout_logprobs, mask)[0]

    def apply(self, logprobs: Tensor, old_logprobs: Tensor, rollout_logprobs: Tensor | None, mask: Tensor) -> Tensor:
        """``logprobs`` as the objective should read them: unchanged when off or without sampler log-probs, else
        with each token's gradient weighted (:func:`weighted_gradient`)."""
        if not self.active or rollout_logprobs is None:
            return logprobs
        w = self.weights(old_logprobs.detach(), rollout_logprobs.to(old_logprobs.device), mask)
        return weighted_gradient(logprobs, w.to(logprobs.dtype))

    def metrics(self, old_logprobs: Tensor, rollout_logprobs: Tensor | None, mask: Tensor) -> dict[str, float]:
        """The gap between sampler and trainer over the trained tokens with a known sampler log-prob:
        ``rollout/logprob_gap_mean`` and ``_max`` (|log π_train - log π_sampler|), ``rollout/kl`` (mean of
        log π_sampler - log π_train: the k1 estimate of KL(π_sampler || π_train), OpenRLHF's ``vllm_kl``), and what
        this correction does to them: ``rollout/is_weight_mean``, ``rollout/masked_fraction`` (weight 0) and
        ``rollout/truncated_fraction`` (TIS: weight at the cap). Empty without sampler log-probs."""
        if rollout_logprobs is None:
            return {}
        old, rollout = old_logprobs.detach().float().cpu(), rollout_logprobs.float().cpu()
        mask = mask.cpu()
        known = (mask > 0) & torch.isfinite(rollout)
        if not known.any():
            return {}
        diff = (old - torch.where(known, rollout, old))[known]
        w, masked, truncated = self.decide(old, rollout, mask)
        return {"rollout/logprob_gap_mean": float(diff.abs().mean()),
                "rollout/logprob_gap_max": float(diff.abs().max()),
                "rollout/kl": float(-diff.mean()),
                "rollout/is_weight_mean": float(w[known].mean()),
                "rollout/masked_fraction": float(masked[known].float().mean()),
                "rollout/truncated_fraction": float(truncated[known].float().mean())}


def token_log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor, known: Tensor) -> Tensor:
    """``[N, T]`` float32 log ρ = old - rollout on the ``known`` tokens, 0 elsewhere; clamped to [-20, 20] so that exp
    never overflows (such a token is truncated or masked either way)."""
    diff = old_logprobs.float() - torch.where(known, rollout_logprobs.float(), old_logprobs.float())
    return torch.where(known, diff, torch.zeros_like(diff)).clamp(-20.0, 20.0)


def weighted_gradient(logprobs: Tensor, weights: Tensor) -> Tensor:
    """``logprobs`` with the same values and ``weights`` × their gradient, token by token: sg(x) + w·(x - sg(x))."""
    base = logprobs.detach()
    return base + weights.detach() * (logprobs - base)
