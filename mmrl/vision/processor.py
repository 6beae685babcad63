"""(images, text) chat rows -> Qwen-VL model inputs: the one place that does it, for training, evaluation and tests.

Pipeline for one row (``VisionProcessor.encode``):

1. every image item of the chat is opened (path, bytes, HF ``{"bytes", "path"}`` dict or PIL; a bad one is an
   :class:`~mmrl.vision.images.ImageError` naming the row) and its original (h, w) recorded;
2. ``qwen_vl_utils.process_vision_info`` resizes each image with ``min_pixels``/``max_pixels`` (``smart_resize``:
   sides multiples of patch × merge, aspect ratio kept), as Qwen's own inference code does;
3. the chat template renders one ``<|vision_start|><|image_pad|><|vision_end|>`` per image;
4. the HF processor expands each ``<|image_pad|>`` to ``t·h·w / merge²`` tokens and returns ``pixel_values`` /
   ``image_grid_thw``; the resized (h, w) the model really saw is read back from ``image_grid_thw``.

``annotate`` then adds ``coord_frame``, ``resized_hw`` and ``original_hw`` (lists of (h, w), one per image) to the
sample (docs/architecture.md), so that box rewards can convert the model's frame to original pixels.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mmrl.errors import UserError
from mmrl.vision.family import VisionFamily, load_qwen_vl
from mmrl.vision.images import image_entries, is_image_item, open_image
from mmrl.vision.inputs import VisionInputs, VisionTokens

DEFAULT_MIN_PIXELS = 3136  # 56 × 56: qwen-vl-utils' floor of 4 tokens at patch 14
DEFAULT_MAX_PIXELS = 401_408  # 512 tokens at patch 14 (R1-V / Visual-RFT training setting)


@dataclasses.dataclass
class VisionPrompt:
    prompt_ids: list[int]
    inputs: VisionInputs | None  # None when the row has no image
    resized_hw: list[tuple[int, int]]
    original_hw: list[tuple[int, int]]


def _smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    from qwen_vl_utils.vision_process import smart_resize

    return smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


class VisionProcessor:
    """A Qwen-VL HF processor (image processor + tokenizer + chat template) with the pixel budget of a run."""

    def __init__(self, processor: Any, family: VisionFamily, min_pixels: int = DEFAULT_MIN_PIXELS,
                 max_pixels: int = DEFAULT_MAX_PIXELS, encode_once: bool = True):
        if not 0 < min_pixels <= max_pixels:
            raise UserError(f"config: model.min_pixels ({min_pixels}) must be > 0 and <= model.max_pixels "
                             f"({max_pixels})")
        self.processor, self.family = processor, family
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        tok = processor.tokenizer
        self.tokenizer = tok
        ids = {name: tok.convert_tokens_to_ids(name) for name in
               ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
        if ids["<|image_pad|>"] in (None, tok.unk_token_id):
            raise UserError("model: the tokenizer has no <|image_pad|> token; it is not a Qwen-VL tokenizer")
        known = [i for i in ids.values() if i is not None and i != tok.unk_token_id]
        merge = getattr(processor.image_processor, "merge_size", 2)
        self.merge_size = merge
        self.tokens = VisionTokens(image=ids["<|image_pad|>"], video=ids["<|video_pad|>"], blocked=tuple(known),
                                   merge_size=merge, encode_once=encode_once)

    @classmethod
    def from_pretrained(cls, where: str, min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS,
                        encode_once: bool = True, trust_remote_code: bool = False) -> VisionProcessor:
        from transformers import AutoProcessor

        family, processor = load_qwen_vl(where, AutoProcessor, "processor", trust_remote_code)
        return cls(processor, family, min_pixels, max_pixels, encode_once)

    @property
    def factor(self) -> int:
        return self.family.patch_size * self.merge_size

    def image_tokens(self, height: int, width: int) -> int:
        """LLM tokens of an (h, w) image under this pixel budget, without processing it."""
        h, w = _smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return (h // self.factor) * (w // self.factor)

    def render(self, messages: list[dict[str, Any]]) -> str:
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def prompt_length(self, row: dict[str, Any], where: str) -> int:
        """Exact prompt length in tokens from image headers and the text alone (cheap: no pixel work)."""
        messages = row["messages"]
        sizes = [open_image(item.get("image"), where, decode=False).size for item in image_entries(messages)]
        text_ids = self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"]
        return len(text_ids) + sum(self.image_tokens(h, w) - 1 for w, h in sizes)  # each <|image_pad|> expands

    def encode(self, messages: list[dict[str, Any]], where: str, max_prompt_tokens: int = 0) -> VisionPrompt:
        from qwen_vl_utils import process_vision_info

        opened, original = [], []
        for message in messages:
            content = message.get("content")
            if not isinstance(content, list):
                opened.append(message)
                continue
            items = []
            for item in content:
                if is_image_item(item):
                    image = open_image(item.get("image"), where)
                    original.append((image.height, image.width))
                    item = {"type": "image", "image": image, "min_pixels": self.min_pixels,
                            "max_pixels": self.max_pixels}
                items.append(item)
            opened.append({**message, "content": items})
        images = None
        if original:
            try:
                images, _ = process_vision_info(opened, image_patch_size=self.family.patch_size)
            except TypeError:  # qwen-vl-utils < 0.0.12 has no image_patch_size (patch 14 only)
                images, _ = process_vision_info(opened)
            except ValueError as exc:  # e.g. an aspect ratio beyond qwen-vl-utils' MAX_RATIO
                raise UserError(f"{where}: {exc}") from exc
        text = self.render(opened)
        size = {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}
        out = self.processor(text=[text], images=images, return_tensors="pt", return_mm_token_type_ids=True,
                             **({"size": size} if images else {}))
        ids = out["input_ids"][0].tolist()
        if max_prompt_tokens and len(ids) > max_prompt_tokens:
            raise UserError(f"rollout.max_prompt_tokens: {where} has {len(ids)} prompt tokens (images included), "
                             f"more than {max_prompt_tokens}")
        if not original:
            return VisionPrompt(ids, None, [], [])
        grid = out["image_grid_thw"].to(torch.long)
        patch = self.family.patch_size
        resized = [(int(h) * patch, int(w) * patch) for _, h, w in grid.tolist()]
        inputs = VisionInputs(out["pixel_values"], grid, self.tokens)
        return VisionPrompt(ids, inputs, resized, original)

    def annotate(self, sample: dict[str, Any], prompt: VisionPrompt) -> dict[str, Any]:
        """A copy of ``sample`` with ``coord_frame``, ``resized_hw`` and ``original_hw`` (docs/architecture.md)."""
        return {**sample, "coord_frame": self.family.coord_frame, "resized_hw": [list(x) for x in prompt.resized_hw],
                "original_hw": [list(x) for x in prompt.original_hw]}

