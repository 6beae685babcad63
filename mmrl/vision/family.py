"""Qwen-VL model families, detected from a checkpoint's ``config.json``, and what differs between them.

=============  =================  ==========  ============================================================
family         ``model_type``     patch (px)  boxes the model writes (``coord_frame``)
=============  =================  ==========  ============================================================
Qwen2-VL       ``qwen2_vl``       14          ``norm1000``: both axes on a 0..1000 grid (Qwen2-VL report)
Qwen2.5-VL     ``qwen2_5_vl``     14          ``pixels``: absolute pixels of the resized image the model saw
Qwen3-VL       ``qwen3_vl``       16          ``norm1000``: Qwen3-VL went back to relative 0..1000 coordinates
Qwen3-VL-MoE   ``qwen3_vl_moe``   16          ``norm1000``
=============  =================  ==========  ============================================================

Every family merges 2×2 patches into one LLM token (``spatial_merge_size``), so an image resized to H×W (multiples of
``patch × merge``) costs ``H·W / (patch · merge)²`` tokens. Qwen3-VL went back to relative 0..1000 coordinates (what
its model card documents), not Qwen2.5-VL's resized pixels; rewards read the frame from each sample, so the value is
all that changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrl.errors import UserError


@dataclasses.dataclass(frozen=True)
class VisionFamily:
    name: str  # human name, e.g. "Qwen2.5-VL"
    model_type: str  # config.model_type
    coord_frame: str  # "norm1000" | "pixels" (see mmrl.vision.boxes)
    patch_size: int  # pixels per ViT patch side


FAMILIES = {f.model_type: f for f in (
    VisionFamily("Qwen2-VL", "qwen2_vl", "norm1000", 14),
    VisionFamily("Qwen2.5-VL", "qwen2_5_vl", "pixels", 14),
    VisionFamily("Qwen3-VL", "qwen3_vl", "norm1000", 16),
    VisionFamily("Qwen3-VL-MoE", "qwen3_vl_moe", "norm1000", 16),
)}


def detect_family(config: Any) -> VisionFamily | None:
    """The family of a transformers config (or its dict), None for a text-only model."""
    model_type = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    return FAMILIES.get(model_type)


def family_of(spec_dir: str) -> VisionFamily | None:
    """The family of a model directory or hub id (reads only its config; a hub id needs the local cache or network)."""
    from transformers import AutoConfig

    try:
        # the family is the config's model_type: reading it never needs the model's own code
        return detect_family(AutoConfig.from_pretrained(spec_dir, trust_remote_code=False))
    except (OSError, ValueError):  # not loadable as a config here: the model loader reports it with one line
        return None


def load_qwen_vl(where: str, loader: Any, what: str, trust_remote_code: bool = False) -> tuple[VisionFamily, Any]:
    """(family, ``loader.from_pretrained(where)``) of a Qwen-VL checkpoint, checked to be one first: a text model or
    an unloadable processor is one line naming ``where`` (``what``: the processor's name in that line)."""
    from transformers import AutoConfig

    family = detect_family(AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code))
    if family is None:
        raise UserError(f"model: {where!r} is not a Qwen-VL model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)")
    try:
        return family, loader.from_pretrained(where, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"model: cannot load the {what} of {where!r}: {exc}") from exc
