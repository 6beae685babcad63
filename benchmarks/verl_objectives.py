"""verl's own implementation of the objectives that benchmarks/objectives.py times, paired with mmrl's.

verl is not an mmrl dependency: install it outside the repository, with only what ``verl.trainer.ppo.core_algos``
imports beyond mmrl's own environment (torch, numpy, ray, packaging, PyYAML and antlr4 are there already), and
name that folder with ``--verl-path``::

    pip download verl --no-deps -d /tmp/verl-wheel
    pip install --no-deps --target /tmp/verl /tmp/verl-wheel/verl-*.whl tensordict pyvers omegaconf codetiming orjson
    python benchmarks/objectives.py --against-verl --verl-path /tmp/verl --threads 1 --runs 5

A verl pass is what verl's trainer runs for an objective on a rollout batch: the advantage estimator on the token-level
rewards (the score on each response's last token) and the ``uid`` of each response's prompt, then the registered
policy loss with the actor's clip range and loss aggregation (``agg_loss``), then backward. :data:`PAIRS` says which
mmrl objective each verl pass is timed against, and whether the two compute the same loss: those pairs are checked
(loss and gradient, to float tolerance) before anything is timed, the others say why they differ.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

import mmrl.algos as algos
from mmrl.algos.gpg import gpg_alpha
from mmrl.errors import UserError

CORE_ALGOS = "verl.trainer.ppo.core_algos"
INSTALL = ("pip install --no-deps --target DIR verl tensordict pyvers omegaconf codetiming orjson "
           "(see benchmarks/verl_objectives.py)")


@dataclasses.dataclass(frozen=True)
class Batch:
    """One rollout batch in both layouts: mmrl's ``[N]`` rewards and group ids, verl's ``[N, T]`` token-level rewards
    (the score on the last response token) and ``uid`` strings; the per-token tensors are shared."""

    rewards: torch.Tensor
    groups: torch.Tensor
    old: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    token_rewards: torch.Tensor
    uids: np.ndarray


def make_batch(n: int, t: int, group: int, seed: int) -> Batch:
    """0/1 rewards in groups of ``group``, response lengths between t/4 and t, log-probs 0.05 away from π_old."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    groups = torch.arange(n) // group
    old = -torch.rand(n, t, generator=g) * 3
    logprobs = old + 0.05 * torch.randn(n, t, generator=g)
    lengths = torch.randint(t // 4, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    token_rewards = torch.zeros(n, t).index_put_((torch.arange(n), lengths - 1), rewards)
    uids = np.array([f"prompt-{int(i)}" for i in groups], dtype=object)
    return Batch(rewards, groups, old, logprobs, mask, token_rewards, uids)


@dataclasses.dataclass(frozen=True)
class VerlPass:
    """One verl objective: the advantage estimator and its arguments, the policy loss, its aggregation and clip."""

    estimator: str
    loss_mode: str
    agg: str
    clip: float = 0.2  # clip_ratio_low, and clip_ratio_high unless clip_high is set
    estimator_kwargs: tuple[tuple[str, Any], ...] = ()
    clip_high: float | None = None
    config_kwargs: tuple[tuple[str, Any], ...] = ()  # further ActorConfig fields (SAPO's temperatures)

    def describe(self) -> str:
        text = f"adv_estimator={self.estimator}, loss_mode={self.loss_mode}, loss_agg_mode={self.agg}"
        if self.clip_high is not None or self.clip != 0.2:
            text += f", clip_ratio_low={self.clip:g}, clip_ratio_high={self.high:g}"
        return text + "".join(f", {k}={v}" for k, v in self.config_kwargs)

    @property
    def high(self) -> float:
        return self.clip if self.clip_high is None else self.clip_high


VERL_PASSES = {
    "grpo": VerlPass("grpo", "vanilla", "seq-mean-token-mean", estimator_kwargs=(("norm_adv_by_std_in_grpo", True),)),
    "grpo_vectorized": VerlPass("grpo_vectorized", "vanilla", "seq-mean-token-mean",
                                estimator_kwargs=(("norm_adv_by_std_in_grpo", True),)),
    "grpo token-mean": VerlPass("grpo", "vanilla", "token-mean", estimator_kwargs=(("norm_adv_by_std_in_grpo", True),)),
    "dr_grpo": VerlPass("grpo", "vanilla", "seq-mean-token-sum-norm",
                        estimator_kwargs=(("norm_adv_by_std_in_grpo", False),)),
    "gpg": VerlPass("gpg", "gpg", "token-mean"),
    "geo_mean": VerlPass("grpo", "geo_mean", "seq-mean-token-mean", clip=0.4,
                         estimator_kwargs=(("norm_adv_by_std_in_grpo", True),)),
    "clip_cov": VerlPass("grpo", "clip_cov", "seq-mean-token-mean",
                         estimator_kwargs=(("norm_adv_by_std_in_grpo", True),)),
    "kl_cov": VerlPass("grpo", "kl_cov", "seq-mean-token-mean",
                       estimator_kwargs=(("norm_adv_by_std_in_grpo", True),)),
    # the papers' settings, which are mmrl's defaults: GSPO's clip range (3e-4, 4e-4) averaged per response; CISPO's
    # weight without a lower bound (1 - 1.0 = 0) and ScaleRL's ε_max 5.0, over tokens; SAPO's temperatures
    "gspo": VerlPass("grpo", "gspo", "seq-mean-token-mean", clip=3e-4, clip_high=4e-4,
                     estimator_kwargs=(("norm_adv_by_std_in_grpo", True),)),
    "cispo": VerlPass("grpo", "cispo", "token-mean", clip=1.0, clip_high=5.0,
                      estimator_kwargs=(("norm_adv_by_std_in_grpo", True),)),
    "sapo": VerlPass("grpo", "sapo", "seq-mean-token-mean", estimator_kwargs=(("norm_adv_by_std_in_grpo", True),),
                     config_kwargs=(("tau_pos", 1.0), ("tau_neg", 1.05))),
}

SAME = "same loss"
SAME_BUT_ALPHA = "same loss ÷ α"
DIFFERENT = "different objective"


@dataclasses.dataclass(frozen=True)
class Pair:
    """An mmrl objective (``mmrl`` with ``params``) timed against a verl pass; ``kind`` says whether their losses are
    the same (then checked) and ``why`` how they differ where they do."""

    label: str
    mmrl: str
    verl: str
    kind: str
    why: str = ""
    params: tuple[tuple[str, Any], ...] = ()


GPG_ALPHA = ("verl's GPG estimator sets α = B / (responses with a non-zero reward); the GPG paper's Eq. 7 (and mmrl) "
             "α = B / (B − responses of groups whose rewards are all equal): with 0/1 rewards these differ, so the "
             "losses agree once each is divided by its own α")
# Differences that these batches never reach (ratios stay far below 3, every group has 8 responses, every response
# has tokens): said in the case, so that "same" is not read as "same on every input".
VANILLA = ("they differ only where these batches never go: verl's dual-clip (ρ > 3 with Â < 0), a group of one "
           "(verl keeps its raw score, mmrl gives 0), a response with no token (verl's sequence mean skips it)")
GEO_MEAN = "verl's geo_mean takes sign(0) = 0 where mmrl takes +1: the same loss, since such a response has Â = 0"
GSPO = ("verl computes GSPO-token's ratio (one value per response, the same gradient with one advantage per "
        "response) and clamps its log above at 10 where mmrl clamps at 20: they differ only for a response with "
        "Â < 0 more than e^10 above π_old, which these batches never reach")
CISPO = "both write Eq. 4's value, sg(clip(ρ))·Â·log π, whose gradient is the paper's"
SAPO = "verl and mmrl both give Â = 0 the negative temperature (its loss is 0 either way)"
PAIRS = (
    Pair("grpo", "grpo", "grpo", SAME, VANILLA),
    Pair("grpo vs verl grpo_vectorized", "grpo", "grpo_vectorized", SAME, VANILLA),
    Pair("grpo token_mean", "grpo", "grpo token-mean", SAME, VANILLA, params=(("loss_agg", "token_mean"),)),
    Pair("dr_grpo", "dr_grpo", "dr_grpo", SAME, VANILLA),
    Pair("gpg", "gpg", "gpg", SAME_BUT_ALPHA, GPG_ALPHA),
    Pair("gmpo", "gmpo", "geo_mean", SAME, GEO_MEAN),
    Pair("gspo", "gspo", "gspo", SAME, GSPO),
    Pair("gspo variant=token", "gspo", "gspo", SAME, GSPO, params=(("variant", "token"),)),
    Pair("cispo", "cispo", "cispo", SAME, CISPO),
    Pair("sapo", "sapo", "sapo", SAME, SAPO),
    Pair("cw_grpo vs verl grpo", "cw_grpo", "grpo", DIFFERENT,
         "verl has no CW-GRPO: its plain GRPO pass is the cost CW-GRPO's covariance weights add to"),
    Pair("cw_grpo vs verl clip_cov", "cw_grpo", "clip_cov", DIFFERENT,
         "Clip-Cov drops the gradient of a few random tokens of high covariance; CW-GRPO reweights every token by a "
         "Gaussian kernel of its covariance, per group"),
    Pair("cw_grpo vs verl kl_cov", "cw_grpo", "kl_cov", DIFFERENT,
         "KL-Cov adds an abs(log ρ) penalty on the tokens of highest covariance; CW-GRPO reweights every token"),
    Pair("gvpo vs verl grpo", "gvpo", "grpo", DIFFERENT, "verl's core_algos has no GVPO: against its plain GRPO pass"),
    Pair("gigpo vs verl grpo", "gigpo", "grpo", DIFFERENT,
         "verl's core_algos has no GiGPO (verl-agent's): against its plain GRPO pass"),
)


class Mismatch(Exception):
    """mmrl and verl give different results on a pair that computes the same loss: timing it would mislead."""


class Verl:
    """verl's ``core_algos`` and actor config classes, imported from a folder (or from this environment)."""

    def __init__(self, core: ModuleType, config: ModuleType, version: str):
        self.core, self.config, self.version = core, config, version

    def has(self, vp: VerlPass) -> bool:
        """Whether this verl registers ``vp``'s estimator and policy loss (older releases lack some)."""
        try:
            self.core.get_adv_estimator_fn(vp.estimator)
            self.core.get_policy_loss_fn(vp.loss_mode)
        except ValueError:
            return False
        return True

    def actor_config(self, vp: VerlPass, batch: Batch) -> Any:
        """The actor config verl's trainer hands the policy loss: one mini-batch, one micro-batch, one rank."""
        n = len(batch.rewards)
        return self.config.ActorConfig(
            strategy="fsdp", rollout_n=int(torch.bincount(batch.groups).max()), ppo_mini_batch_size=n,
            ppo_micro_batch_size_per_gpu=n, clip_ratio=vp.clip, clip_ratio_low=vp.clip, clip_ratio_high=vp.high,
            loss_agg_mode=vp.agg, policy_loss=self.config.PolicyLossConfig(loss_mode=vp.loss_mode),
            use_torch_compile=False, **dict(vp.config_kwargs))

    def bind(self, vp: VerlPass, batch: Batch) -> VerlObjective:
        return VerlObjective(self.core.get_adv_estimator_fn(vp.estimator), dict(vp.estimator_kwargs),
                             self.core.get_policy_loss_fn(vp.loss_mode), vp.agg, self.actor_config(vp, batch))


@dataclasses.dataclass(frozen=True)
class VerlObjective:
    """A verl pass bound to its functions and config: ``loss(batch, logprobs)`` runs advantages and loss."""

    estimator: Any
    estimator_kwargs: dict[str, Any]
    policy_loss: Any
    agg: str
    config: Any

    def loss(self, batch: Batch, logprobs: torch.Tensor) -> torch.Tensor:
        adv, _ = self.estimator(token_level_rewards=batch.token_rewards, response_mask=batch.mask, index=batch.uids,
                                **self.estimator_kwargs)
        loss, _ = self.policy_loss(old_log_prob=batch.old, log_prob=logprobs, advantages=adv,
                                   response_mask=batch.mask, loss_agg_mode=self.agg, config=self.config)
        return loss


def load(path: str | None) -> Verl:
    """verl from the folder ``path`` (added at the end of ``sys.path``, so that it never shadows mmrl's own
    libraries), or from this environment when ``path`` is None; one line naming what is missing otherwise."""
    where = "this environment" if path is None else f"--verl-path {path}"
    if path is not None:
        folder = Path(path)
        if not (folder / Path(*CORE_ALGOS.split("."))).with_suffix(".py").is_file():
            raise UserError(f"{where}: no {CORE_ALGOS.replace('.', '/')}.py in that folder; install verl into it: "
                            f"{INSTALL}")
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    try:
        core = importlib.import_module(CORE_ALGOS)
        config = importlib.import_module("verl.workers.config")
    except ImportError as exc:
        raise UserError(f"{where}: cannot import {CORE_ALGOS} ({exc}); {INSTALL}") from None
    return Verl(core, config, str(getattr(sys.modules.get("verl"), "__version__", "unknown")))


def build_mmrl(pair: Pair) -> algos.Algorithm:
    return algos.get(pair.mmrl, **dict(pair.params))


def mmrl_loss(algo: algos.Algorithm, batch: Batch, logprobs: torch.Tensor) -> torch.Tensor:
    """What objectives.py times for mmrl: advantages, batch statistics, loss."""
    adv = algo.advantages(batch.rewards, batch.groups)
    stats = algo.batch_stats(batch.rewards, batch.groups, adv, batch.old, batch.mask)
    loss, _ = algo.policy_loss(logprobs=logprobs, old_logprobs=batch.old, advantages=adv, mask=batch.mask,
                               group_ids=batch.groups, stats=stats)
    return loss


def loss_and_grad(compute, batch: Batch) -> tuple[float, torch.Tensor]:
    lp = batch.logprobs.detach().requires_grad_(True)
    loss = compute(batch, lp)
    loss.backward()
    return float(loss.detach()), lp.grad


def verl_gpg_alpha(rewards: torch.Tensor) -> float:
    """α as verl's GPG estimator computes it (``bsz / count_nonzero(scores)``)."""
    return len(rewards) / max(int(torch.count_nonzero(rewards)), 1)


def check(pair: Pair, algo: algos.Algorithm, verl: VerlObjective, batch: Batch, rtol: float = 1e-5,
          atol: float = 1e-6) -> dict[str, str]:
    """Loss and gradient of both sides on ``batch``, as a case of the summary: ``outcome`` is ``same`` or
    ``DIFFERENT`` where ``pair.kind`` says they compute the same loss, ``not compared`` otherwise.

    The loss gets an absolute tolerance too: a group-centred loss sums terms of size |Â| ≈ 1 that cancel to a small
    total, so float32 rounding of the terms (about 1e-7 each) is large next to that total."""
    what = f"mmrl {pair.mmrl}{''.join(f' {k}={v}' for k, v in pair.params)} vs verl {VERL_PASSES[pair.verl].describe()}"
    mmrl_value, mmrl_grad = loss_and_grad(lambda b, lp: mmrl_loss(algo, b, lp), batch)
    verl_value, verl_grad = loss_and_grad(verl.loss, batch)
    if pair.kind == DIFFERENT:
        return {"case": pair.label, "what": what, "outcome": "not compared",
                "detail": f"{pair.why} (loss {mmrl_value:.6g} vs {verl_value:.6g})"}
    scale = gpg_alpha(batch.rewards, batch.groups)[0] / verl_gpg_alpha(batch.rewards) if pair.kind == SAME_BUT_ALPHA \
        else 1.0
    verl_value, verl_grad = verl_value * scale, verl_grad * scale
    grad_err = float((mmrl_grad - verl_grad).abs().max())
    grad_size = float(mmrl_grad.abs().max())
    same = abs(mmrl_value - verl_value) <= rtol * max(abs(mmrl_value), abs(verl_value)) + atol \
        and grad_err <= rtol * max(grad_size, 1e-12)
    detail = (f"loss {mmrl_value:.7g} vs {verl_value:.7g}{f' (verl × {scale:.4g})' if scale != 1.0 else ''}, "
              f"largest gradient difference {grad_err:.2g}, largest gradient {grad_size:.2g}")
    if pair.why:
        detail += f"; {pair.why}"
    return {"case": pair.label, "what": what, "outcome": "same" if same else "DIFFERENT", "detail": detail}
