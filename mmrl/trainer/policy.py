"""The policy a local run trains, as the set-up builds it (`mmrl.trainer.local._setup_prompts`, then
`_setup_policy`): the model and everything that turns samples into its tokens. The rollout part
(`mmrl.trainer.collect`) samples from it, the learner part (`mmrl.trainer.learner`) updates it."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrl.envs.episode import TurnRenderer
from mmrl.models.lora import LoraSettings


@dataclasses.dataclass
class Policy:
    """What the policy phase builds: the model to train and everything that turns samples into its tokens."""

    model: torch.nn.Module  # float32 master weights on ``device``, in train mode, LoRA-wrapped when asked
    tokenizer: Any
    device: torch.device
    compute_dtype: torch.dtype  # the forward passes' precision (``model.dtype``)
    vision: Any  # the VisionProcessor of a task with images, else None
    renderer: TurnRenderer | None  # multi-turn tasks: the chat-template pieces of an episode
    prompt_cache: dict[int, list[int]]  # text tasks: every training prompt's ids, encoded and checked at start
    routers: list[tuple[str, Any]]  # an MoE's router modules (empty for a dense model)
    lora: LoraSettings | None  # the adapters ``model`` trains (None: a full fine-tune)

    def autocast(self):
        """Mixed precision: weights and optimizer state stay float32, forward passes run in ``compute_dtype``."""
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32)

    @property
    def is_moe(self) -> bool:
        return bool(self.routers)

    @property
    def moe_experts(self) -> int:
        return max((r.num_experts for _, r in self.routers), default=0)

    @property
    def moe_top_k(self) -> int:
        return self.routers[0][1].top_k if self.routers else 0
