"""Dr.GRPO (Liu et al., 2025, Eq. 3 / §3.1): GRPO done right.

Paper: "Understanding R1-Zero-Like Training: A Critical Perspective", https://arxiv.org/abs/2503.20783.

Two changes to GRPO remove its biases:
* no std normalisation of the advantage:  Â_i = r_i - mean(r_group);
* no per-response length normalisation: token losses are summed and divided by a constant,
  ``N * max_tokens`` (the generation budget), not by |o_i|.

Everything else (token ratio clip, optional k3 KL) is GRPO's, so this is GRPO with other defaults.
Choice: ``max_tokens`` defaults to ``None``, meaning the padded response width T of the batch the loss sees; both
backends build the objective through ``with_length_budget`` (mmrl/run/build.py), which sets it to the generation
budget of one response (``rollout.max_new_tokens``; a whole episode's ``rollout.max_episode_tokens`` for multi-turn
tasks), so that the constant is the same for every mini-batch.
"""

from __future__ import annotations

import dataclasses

from mmrl.algos.base import register
from mmrl.algos.grpo import GRPO


@register("dr_grpo")
@dataclasses.dataclass(frozen=True)
class DrGRPO(GRPO):
    scale_by_std: bool = False
    loss_agg: str = "seq_mean_token_sum_norm"
