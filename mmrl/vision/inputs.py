"""The image side of a rollout batch: per-row ``pixel_values`` / ``image_grid_thw``, and the model inputs built from
them for any set of rows (a generation chunk, a micro-batch, ``RolloutBatch.select``).

Bookkeeping rules of the Qwen-VL models in transformers 5 (see docs/vision.md):

* ``pixel_values`` of a batch are the rows' patch matrices concatenated **in row order**, ``image_grid_thw`` likewise;
  the model scatters image features into the ``<|image_pad|>`` positions in that order.
* Re-scoring a whole sequence needs ``mm_token_type_ids`` over the full width (1 on image-pad tokens, 2 on video-pad
  tokens, 0 elsewhere, including the completion), otherwise the model cannot build its 3-D (M-RoPE) positions and
  silently falls back to 1-D ones that differ from generation's.
* No ``position_ids`` are passed: the model derives them from ``mm_token_type_ids``, ``image_grid_thw`` and the
  attention mask (left padding is skipped), exactly as ``generate`` does at pre-fill.
* The policy never emits the vision placeholder tokens (``blocked_token_ids``): a sampled ``<|image_pad|>`` in a
  completion would be taken for an image slot when re-scored. Generation suppresses them and re-scoring masks the same
  logits, so the sampler and the scored policy stay the same distribution.

A row's ``VisionInputs`` is shared (not copied) by every response of its group.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import torch

IMAGE, VIDEO = 1, 2  # mm_token_type_ids values (transformers' convention; 0 = text)


@dataclasses.dataclass(frozen=True)
class VisionTokens:
    """The special token ids of a Qwen-VL tokenizer that the bookkeeping needs."""

    image: int
    video: int | None
    blocked: tuple[int, ...]  # never sampled: image/video pads and vision start/end markers
    merge_size: int = 2  # spatial_merge_size: merge_size² patches make one LLM token
    # Run the vision tower once per distinct prompt of a batch and hand the model its features (transformers'
    # ``mm_encoder_outputs``), instead of once per row: a group's responses share their prompt's images.
    encode_once: bool = True


@dataclasses.dataclass(frozen=True)
class VisionInputs:
    """The images of one prompt after the processor: patches ``[n_patches, C·T·P·P]`` and grids ``[n_images, 3]``."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    tokens: VisionTokens

    @property
    def n_images(self) -> int:
        return int(self.image_grid_thw.shape[0])


def mm_token_type_ids(input_ids: torch.Tensor, tokens: VisionTokens) -> torch.Tensor:
    """1 on image-pad tokens, 2 on video-pad tokens, 0 elsewhere (prompt text, padding and completions)."""
    types = (input_ids == tokens.image).to(torch.int32) * IMAGE
    if tokens.video is not None:
        types = types + (input_ids == tokens.video).to(torch.int32) * VIDEO
    return types


@dataclasses.dataclass
class VisionBatch:
    """One entry per batch row (None for a row without images)."""

    rows: list[VisionInputs | None]

    def __post_init__(self) -> None:
        found = next((r for r in self.rows if r is not None), None)
        if found is None:
            raise ValueError("VisionBatch: no row has images")
        self.tokens = found.tokens

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, rows: torch.Tensor | Sequence[int]) -> VisionBatch:
        index = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
        return VisionBatch([self.rows[i] for i in index]) if any(self.rows[i] is not None for i in index) \
            else _EmptyVision(self.tokens, len(index))

    def model_inputs(self, input_ids: torch.Tensor, device: torch.device | str,
                     model: torch.nn.Module | None = None) -> dict[str, Any]:
        """``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` for ``input_ids`` (these rows, any width).

        With ``model`` (a Qwen-VL model whose forward takes ``mm_encoder_outputs``, `takes_encoder_outputs`) and
        ``tokens.encode_once``, ``pixel_values`` is replaced by the image features of each distinct prompt, computed
        once by ``model.get_image_features`` and repeated for every row that shares that prompt's `VisionInputs`
        (`shared_image_features`); the model output is the same.

        Raises ValueError when a row's image-pad tokens do not match its grids (a truncated or edited prompt), which
        would otherwise surface as a shape error inside the model.
        """
        if input_ids.shape[0] != len(self.rows):
            raise ValueError(f"VisionBatch: {len(self.rows)} rows of images for {input_ids.shape[0]} sequences")
        types = mm_token_type_ids(input_ids, self.tokens)
        for i, row in enumerate(self.rows):
            slots = int((types[i] == IMAGE).sum())
            if row is None:
                if slots:
                    raise ValueError(f"VisionBatch: row {i} has {slots} image tokens but no images")
                continue
            expected = int(row.image_grid_thw.prod(-1).sum()) // self.tokens.merge_size**2
            if slots != expected:
                raise ValueError(f"VisionBatch: row {i} has {slots} image tokens, its image_grid_thw needs {expected}")
        present = [r for r in self.rows if r is not None]
        inputs: dict[str, Any] = {"image_grid_thw": torch.cat([r.image_grid_thw for r in present]).to(device),
                                  "mm_token_type_ids": types.to(device)}
        if model is not None and self.tokens.encode_once and takes_encoder_outputs(model):
            inputs["mm_encoder_outputs"] = {"image": shared_image_features(present, model, device)}
        else:
            inputs["pixel_values"] = torch.cat([r.pixel_values for r in present]).to(device)
        return inputs

    def mask_blocked(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits with the never-sampled vision tokens at the dtype's lowest value: probability exactly 0, as under
        generation's suppression (-inf), while ``probs * logits`` in the entropy stays finite."""
        return mask_tokens(logits, self.tokens.blocked)


def takes_encoder_outputs(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes precomputed image features (``mm_encoder_outputs``).

    transformers 5.17's Qwen-VL forward has no such argument and swallows it in ``**kwargs``: the image slots would
    then get no features at all. Such a model is given every row's own pixels instead (the same output, one tower pass
    per response). A LoRA wrapper's forward takes anything, so the first transformers model inside it is asked.
    """
    from transformers import PreTrainedModel

    core = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), model)
    return "mm_encoder_outputs" in inspect.signature(core.forward).parameters


def shared_image_features(rows: list[VisionInputs], model: torch.nn.Module, device: torch.device | str):
    """The vision tower's output for ``rows`` in row order, computed once per distinct `VisionInputs` object.

    ``model.get_image_features`` returns per-image tuples (``pooler_output``; Qwen3-VL also a list of them,
    ``deepstack_features``); every such tuple is re-indexed from the distinct prompts' images to the rows' images.
    Under autograd, a prompt's features feed all its rows, so their gradients add up in the one tower pass.
    """
    distinct = list({id(r): r for r in rows}.values())
    first_image, at = {}, 0
    for r in distinct:
        first_image[id(r)] = at
        at += r.n_images
    out = model.get_image_features(pixel_values=torch.cat([r.pixel_values for r in distinct]).to(device),
                                   image_grid_thw=torch.cat([r.image_grid_thw for r in distinct]).to(device),
                                   return_dict=True)
    order = [first_image[id(r)] + k for r in rows for k in range(r.n_images)]

    def per_image(value: Any) -> bool:
        return isinstance(value, (tuple, list)) and len(value) == at and all(isinstance(v, torch.Tensor)
                                                                             for v in value)

    for key, value in list(out.items()):
        if per_image(value):
            out[key] = tuple(value[i] for i in order)
        elif isinstance(value, list) and value and all(per_image(v) for v in value):
            out[key] = [tuple(v[i] for i in order) for v in value]
    return out


class _EmptyVision(VisionBatch):
    """Rows of a vision batch that hold no image: plain text inputs, but the same blocked tokens."""

    def __init__(self, tokens: VisionTokens, n: int):  # noqa: D107 -- no __post_init__: there is no image row
        self.rows = [None] * n
        self.tokens = tokens

    def model_inputs(self, input_ids: torch.Tensor, device: torch.device | str,
                     model: torch.nn.Module | None = None) -> dict[str, Any]:
        return {}


def mask_tokens(logits: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
    if not token_ids:
        return logits
    blocked = torch.tensor(list(token_ids), device=logits.device)
    return logits.index_fill(-1, blocked, torch.finfo(logits.dtype).min)
