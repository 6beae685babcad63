"""``MmrlExperienceMaker``: OpenRLHF's ``RemoteExperienceMaker`` with mmrl's advantages and whole-batch statistics.

OpenRLHF's maker runs in the PPO trainer actor and, for each rollout step, gathers every sample's reward (from the
vLLM actors' ``reward_func``) and its π_old log-probs (from the policy actors' forward) before it computes advantages
and hands experiences to the policy actors. That is the one place where the whole global batch is in one process,
so mmrl computes there, exactly as the local trainer does on the same batch:

* ``Algorithm.advantages(rewards, group_ids)`` over the whole step (GPG's batch-level α, GRPO's group statistics);
* ``Algorithm.batch_stats(...)`` over the whole step (GPG's α and valid fraction, CW-GRPO's covariance moments);
* the gap between vLLM's log-probs of the sampled tokens and π_old (``rollout/*``, `RolloutCorrection.metrics`).

Communication: none beyond OpenRLHF's own traffic (rewards and π_old log-probs already come to this actor). The
results travel inside the experiences OpenRLHF ships to the policy actors: the advantage in OpenRLHF's per-token
layout, the group id and each statistic as one number per sample in ``Experience.info`` (bytes per sample: 8 + 8 per
statistic; CW-GRPO: 4 statistics, each sample's own group's by default).

In the agent turn layout the rows are turns (mmrl/openrlhf/sampling.py): their groups and steps come with them, the
advantages are ``Algorithm.turn_advantages`` over the step's :class:`~mmrl.algos.TurnSteps` (each turn its episode's
advantage, or the objective's own step-level one when it declares ``needs_steps``), as the local trainer computes
them, and the rows go to the policy ranks as one experience per rank of near-equal contiguous shares
(:func:`~mmrl.openrlhf.grouping.rank_shares`), since their number varies from step to step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from openrlhf.trainer.ppo_utils.experience import (
    make_experience_batch,
    remove_padding_in_sequences,
    split_experience_batch,
)
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

import mmrl.algos as algos
from mmrl.algos.base import advantage_spread
from mmrl.algos.rollout_correction import RolloutCorrection
from mmrl.batch import TurnStep
from mmrl.openrlhf.grouping import GROUP_KEY, ROW_STATS_PREFIX, STATS_PREFIX, STEP_KEY, rank_shares, rollout_group_ids
from mmrl.openrlhf.spec import ActorSpec


def padded_cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate ``[B_i, A_i]`` tensors along the batch, right-padding the widths with zeros."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tensors])


def turn_steps(steps: list[TurnStep]) -> algos.TurnSteps:
    """The turn layout's per-row facts (episode, step, step reward, anchor state), row-aligned."""
    return algos.TurnSteps.of(steps)


def whole_batch_advantages(algo: algos.Algorithm, experiences: list, steps: algos.TurnSteps | None = None
                           ) -> tuple[torch.Tensor, dict[str, Any]]:
    """(``[N]`` advantages, whole-batch statistics) of a rollout step's experiences, in their concatenated order;
    ``steps``: the turn layout's facts of those rows, in the same order."""
    rewards = torch.cat([e.rewards.reshape(-1) for e in experiences]).to(torch.float32)
    group_ids = torch.cat([e.info[GROUP_KEY].reshape(-1) for e in experiences]).long()
    old_logprobs = padded_cat([e.action_log_probs.float() for e in experiences])
    mask = padded_cat([e.action_mask.float() for e in experiences])
    return algo.advantages_and_stats(rewards, group_ids, old_logprobs, mask, steps)


def rollout_gap(correction: RolloutCorrection, experiences: list) -> dict[str, float]:
    """The step's gap between vLLM's log-probs of the sampled tokens and the policy actors' π_old of them, over the
    whole step (`RolloutCorrection.metrics`); empty when vLLM returned none."""
    if any(e.rollout_log_probs is None for e in experiences):
        return {}
    return correction.metrics(padded_cat([e.action_log_probs.float() for e in experiences]),
                              padded_cat([e.rollout_log_probs.float() for e in experiences]),
                              padded_cat([e.action_mask.float() for e in experiences]))


class MmrlExperienceMaker(RemoteExperienceMaker):
    """Group ids on the rollout samples, then mmrl's advantages and statistics instead of OpenRLHF's estimators."""

    replay = None  # GVPO's historical replay (mmrl.openrlhf.replay.SampleReplay): told each step's π_old

    def __init__(self, *args, mmrl_spec: ActorSpec, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.algo = algos.get(mmrl_spec.algo, **mmrl_spec.params)
        self.group_size = mmrl_spec.samples_per_prompt
        self.turn_steps: algos.TurnSteps | None = None  # the turn layout: the current step's row facts
        self.spread: dict[str, float] = {}  # the last step's advantage spread (mmrl.algos.base.advantage_spread)
        self.correction = RolloutCorrection(**mmrl_spec.rollout_correction)
        self.rollout_gap: dict[str, float] = {}  # the last step's sampler-trainer gap (RolloutCorrection.metrics)

    def split_rollout_samples(self, rollout_samples):
        steps = [s.info.pop(STEP_KEY)[0] for s in rollout_samples if STEP_KEY in s.info]
        self.turn_steps = None
        if not steps:  # one response per sample, groups in consecutive runs
            for sample, gid in zip(rollout_samples, rollout_group_ids(len(rollout_samples), self.group_size),
                                   strict=True):
                sample.info[GROUP_KEY] = gid.reshape(1)
            return super().split_rollout_samples(rollout_samples)
        if len(steps) != len(rollout_samples):
            raise RuntimeError("turn layout: a rollout step mixes turn rows with rows that are not turns")
        samples_list = super().split_rollout_samples(rollout_samples)
        # the rows' order after OpenRLHF's split (which may rebalance by length): the indices it numbered them with
        self.turn_steps = turn_steps([steps[i] for e in samples_list for i in e.index])
        return samples_list

    @torch.no_grad()
    def make_experience_batch(self, rollout_samples):
        experiences = super().make_experience_batch(rollout_samples)
        if self.replay is not None:
            self.replay.record_logprobs(rollout_samples, experiences)
        return experiences

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences):
        for e in experiences:
            e.rewards = e.rewards.to(torch.promote_types(e.rewards.dtype, torch.float32))
        apply_length_penalties(experiences, self.args)  # only when OpenRLHF's overlong/stop penalties are asked for
        advantages, stats = whole_batch_advantages(self.algo, experiences, self.turn_steps)
        group_ids = torch.cat([e.info[GROUP_KEY].reshape(-1) for e in experiences]).long()
        self.spread = advantage_spread(advantages, group_ids)
        self.rollout_gap = rollout_gap(self.correction, experiences)
        numeric = {k: float(v) for k, v in stats.items() if isinstance(v, (int, float))}
        rows = {k: v.reshape(-1).to(torch.float64) for k, v in stats.items() if isinstance(v, torch.Tensor)}
        at = 0
        for e in experiences:
            n = e.rewards.numel()
            adv = advantages[at:at + n].to(e.action_log_probs.dtype)
            at += n
            e.advantages = adv[:, None] * e.action_mask.to(adv.dtype)  # OpenRLHF's per-token layout
            e.returns = e.advantages.clone()
            e.info["return"] = e.rewards.clone()
            for key, value in numeric.items():
                e.info[STATS_PREFIX + key] = torch.full((n,), value, dtype=torch.float64)
            for key, value in rows.items():  # a row statistic travels with its sample
                e.info[ROW_STATS_PREFIX + key] = value[at - n:at].clone()
            e.kl = None
        if self.turn_steps is not None:
            experiences = self.one_per_rank(experiences)
        return experiences

    def one_per_rank(self, experiences: list) -> list:
        """The step's turn rows as one experience per policy rank, near-equal contiguous shares (OpenRLHF hands out
        experiences in ceil-sized chunks, which could leave a rank without rows when their number is not a multiple
        of the ranks)."""
        args = self.args
        ranks = (args.actor.num_nodes * args.actor.num_gpus_per_node // args.ds.ring_attn_size
                 // args.ds.tensor_parallel_size)
        rows = remove_padding_in_sequences([row for e in experiences for row in split_experience_batch(e)])
        shares = [make_experience_batch([rows[i] for i in share]) for share in rank_shares(len(rows), ranks)]
        for e in shares:  # OpenRLHF's batching keeps per-row tensors of `info` as lists; its consumers want [B]
            e.info = {k: torch.stack(v) if isinstance(v, list) else v for k, v in e.info.items()}
        return shares
