"""A row's reward context (``coord_frame``, ``resized_hw``, ``original_hw``) from image headers alone.

`VisionProcessor.annotate` adds these keys after encoding a row (pixels decoded, resized, patchified). Backends that
never encode on the driver (OpenRLHF: its VLM path resizes the images inside the actors with the model's own image
processor) still need them in the label so box rewards can map the model's frame back to original pixels. The sizes
follow from the image headers and the processor's pixel budget: Qwen-VL resizes with ``smart_resize`` (sides
multiples of ``patch_size · merge_size``, area within ``[min_pixels, max_pixels]``, aspect ratio kept; Qwen2-VL
report §2.1, qwen-vl-utils), so no pixel needs decoding.
"""

from __future__ import annotations

import functools
from typing import Any

from mmrl.errors import UserError
from mmrl.vision.boxes import resized_hw
from mmrl.vision.family import VisionFamily, load_qwen_vl
from mmrl.vision.images import ImageError, image_entries, open_image


@functools.lru_cache(maxsize=8)
def pixel_budget(model: str) -> tuple[VisionFamily, int, int, int]:
    """(family, factor = patch · merge, min_pixels, max_pixels) of ``model``'s own image processor, the budget
    OpenRLHF's VLM path resizes with (it passes no size of its own). Cached: one config/processor read per model."""
    from transformers import AutoImageProcessor

    family, processor = load_qwen_vl(model, AutoImageProcessor, "image processor")  # Qwen-VL: built in
    size = getattr(processor, "size", None) or {}
    get = size.get if hasattr(size, "get") else lambda key: getattr(size, key, None)
    # transformers >= 4.52 keeps the budget in ``size`` (shortest_edge/longest_edge are pixel counts, not edges);
    # older processors and configs use min_pixels/max_pixels attributes.
    min_pixels = get("shortest_edge") or getattr(processor, "min_pixels", None)
    max_pixels = get("longest_edge") or getattr(processor, "max_pixels", None)
    if not min_pixels or not max_pixels:
        raise UserError(f"model: the image processor of {model!r} has no pixel budget (size or min/max_pixels)")
    patch = getattr(processor, "patch_size", None) or family.patch_size
    merge = getattr(processor, "merge_size", None) or 2
    return family, int(patch) * int(merge), int(min_pixels), int(max_pixels)


def reward_context(row: dict[str, Any], model: str, where: str = "row") -> dict[str, Any]:
    """``{"coord_frame", "resized_hw", "original_hw"}`` for ``row`` as ``model`` will see its images (one [h, w] per
    image, prompt order), equal to what `VisionProcessor.annotate` adds under the processor's default budget.

    A row without images gets ``{}``; an unreadable image is an `ImageError` naming ``where``.
    """
    items = list(image_entries(row.get("messages") or []))
    if not items:
        return {}
    family, factor, min_pixels, max_pixels = pixel_budget(model)
    original, resized = [], []
    for item in items:
        if "image" not in item:
            raise ImageError(f"{where}: an image item has no 'image' key")
        width, height = open_image(item["image"], where, decode=False).size
        try:
            resized.append(list(resized_hw(height, width, min_pixels, max_pixels, factor)))
        except ValueError as exc:  # smart_resize refuses aspect ratios beyond qwen-vl-utils' MAX_RATIO
            raise ImageError(f"{where}: {exc}") from exc
        original.append([height, width])
    return {"coord_frame": family.coord_frame, "resized_hw": resized, "original_hw": original}
