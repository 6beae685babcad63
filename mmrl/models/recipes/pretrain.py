"""Supervised pre-training of the embedded models: one loop for text, MoE and vision-language models.

Each step draws ``batch_size`` examples from ``draw(rng)`` (a prompt, its target completion and, for a vision row,
the prompt's `mmrl.vision.inputs.VisionInputs`), pads them on the right and takes one AdamW step on the
cross-entropy of the completion tokens only. An MoE adds its router load-balancing loss (``output_router_logits``),
as MoE pre-training does; rows with images get their patches, grids and image-token types through
`mmrl.vision.inputs.VisionBatch`, exactly as re-scoring builds them.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import torch


@dataclasses.dataclass
class Example:
    prompt_ids: list[int]
    completion_ids: list[int]  # the supervised tokens (end-of-turn included)
    vision: Any = None  # mmrl.vision.inputs.VisionInputs of the prompt's images, None for a text row


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` / ``attention_mask`` / ``labels`` (-100 outside the completions), plus the vision
    inputs when any row has images."""
    seqs = [e.prompt_ids + e.completion_ids for e in examples]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (e, s) in enumerate(zip(examples, seqs, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        labels[i, len(e.prompt_ids) : len(s)] = torch.tensor(e.completion_ids)
    batch = {"input_ids": ids, "attention_mask": attn, "labels": labels}
    if any(e.vision is not None for e in examples):
        from mmrl.vision.inputs import VisionBatch

        batch.update(VisionBatch([e.vision for e in examples]).model_inputs(ids, "cpu"))
    return batch


def pretrain(model, draw: Callable[[random.Random], Example], pad_id: int, steps: int, batch_size: int,
             lr: float = 3e-3, seed: int = 0) -> float:
    """``steps`` AdamW steps on batches drawn by ``draw(rng)``; returns the last loss."""
    from mmrl.moe import is_moe

    moe = {"output_router_logits": True} if is_moe(model) else {}
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        batch = collate([draw(rng) for _ in range(batch_size)], pad_id)
        loss = model(**batch, **moe).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value
