"""Bounding boxes: tolerant parsing from model text, coordinate frames, and IoU / GIoU / greedy matching.

Every box is ``[x1, y1, x2, y2]`` (top-left, bottom-right; corners given the other way round are swapped back).

**Parsing** (`parse_boxes`) never raises. It reads the last ``<answer>…</answer>`` when there is one (an unclosed
``<answer>`` runs to the end of the text: a truncated generation still counts), else the whole text, and accepts

* JSON (single quotes tolerated): ``[x1, y1, x2, y2]``, ``[[...], [...]]``, ``{"bbox_2d": [...], "label": ...}``
  (Qwen2.5-VL), ``[{"Position": [...], "Confidence": 0.9}, ...]`` (Visual-RFT detection), ``{"bbox": ...}``, ...;
* ``(x1,y1),(x2,y2)`` (Qwen2-VL / Visual-RFT LISA prompts);
* any bracketed group of exactly four numbers: ``[x1, y1, x2, y2]`` or ``(x1, y1, x2, y2)``.

Non-finite numbers (JSON ``NaN``/``Infinity``, overflowing literals) are dropped, never returned.

**Frames.** Ground truth is in ORIGINAL image pixels. A model states boxes in its own frame (``coord_frame``):

* ``"norm1000"`` -- Qwen2-VL: both axes on a 0..1000 grid, ``x_orig = x / 1000 · W_orig``;
* ``"pixels"`` -- Qwen2.5-VL and later: absolute pixels of the image the model saw after `smart_resize`,
  ``x_orig = x · W_orig / W_resized`` (``resized_hw`` from qwen-vl-utils for the processor's min/max pixels);
* ``"original"`` (or no frame) -- already original pixels.

**Overlap.** IoU and GIoU (Rezatofighi et al., 2019: ``GIoU = IoU - |C \\ (A ∪ B)| / |C|`` with C the smallest
enclosing box, in [-1, 1]). All-pairs matrices come from ``torchvision.ops`` (``box_iou``, ``generalized_box_iou``);
paired values (box i with box i) are one elementwise tensor pass, O(n), tested equal to the diagonal of
torchvision's matrices (the diagonal of an n x n matrix would cost O(n²)). Never a Python loop per pair. NaN (two
zero-area boxes) becomes the metric's floor.

**Matching** (`greedy_match`, Visual-RFT detection): predictions in descending confidence each take the unmatched
ground-truth box of highest IoU; the pair counts only when that IoU exceeds the threshold (0.5).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import torch

from mmrl.errors import UserError

FRAMES = ("original", "norm1000", "pixels")
NORM_GRID = 1000.0  # Qwen2-VL's relative grid
MAX_PARSE_CHARS = 20_000  # a longer answer is not a box list; bounds the regex and JSON work per completion
MAX_BOXES = 100  # more boxes than this in one answer is degenerate output; the rest is ignored
MAX_JSON_ATTEMPTS = 32  # failed JSON decodes per text: each costs O(length), so unbounded attempts would be O(length²)

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"  # unambiguous: no backtracking blow-up on digit runs
_SEP = r"\s*[,;]\s*"
_POINT = rf"\(\s*({_NUM}){_SEP}({_NUM})\s*\)"
_POINT_PAIR = re.compile(rf"{_POINT}\s*[,;]?\s*(?:to|-|and)?\s*{_POINT}")
_FOUR = re.compile(rf"[\[(]\s*({_NUM}){_SEP}({_NUM}){_SEP}({_NUM}){_SEP}({_NUM})\s*[\])]")
_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
BOX_KEYS = ("bbox_2d", "bbox", "box", "position", "bounding_box", "coordinates", "box_2d")
CONFIDENCE_KEYS = ("confidence", "score", "conf", "probability")
LABEL_KEYS = ("label", "category", "class", "name")


@dataclasses.dataclass(frozen=True)
class ParsedBox:
    """One box read from text: corners in the model's frame, and the confidence/label it gave, if any."""

    box: tuple[float, float, float, float]
    confidence: float | None = None
    label: str | None = None


def answer_span(text: str) -> str:
    """The content of the last ``<answer>`` (to ``</answer>`` or the end of the text), else the whole text."""
    opens = list(_ANSWER_OPEN.finditer(text))
    if not opens:
        return text
    start = opens[-1].end()
    close = _ANSWER_CLOSE.search(text, start)
    return text[start : close.start() if close else len(text)]


def normalise_box(values: Sequence[Any]) -> tuple[float, float, float, float] | None:
    """``(min x, min y, max x, max y)`` of four finite numbers, or None (wrong length, non-number, NaN/inf)."""
    if not isinstance(values, (list, tuple)) or len(values) != 4:  # concrete types: an ABC check costs ~1 ms
        return None
    out = []
    for v in values:
        if isinstance(v, bool):
            return None
        try:
            f = float(v)
        except (TypeError, ValueError, OverflowError):
            return None
        if not math.isfinite(f):
            return None
        out.append(f)
    x1, y1, x2, y2 = out
    return min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)


def _finite_confidence(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return min(max(f, 0.0), 1.0) if math.isfinite(f) else None


def _from_json(node: Any, out: list[ParsedBox], depth: int = 0) -> None:
    """Collect boxes from a decoded JSON value (lists of numbers, nested lists, dicts with a box key)."""
    if len(out) >= MAX_BOXES or depth > 6:
        return
    if isinstance(node, dict):
        lowered = {str(k).lower(): v for k, v in node.items()}
        key = next((k for k in BOX_KEYS if k in lowered), None)
        if key is not None:
            box = normalise_box(lowered[key])
            if box is None and isinstance(lowered[key], list) and lowered[key] and isinstance(lowered[key][0], list):
                # {"bbox_2d": [[x1, y1], [x2, y2]]} (two corner points)
                pts = lowered[key]
                box = normalise_box([*pts[0], *pts[1]]) if len(pts) == 2 else None
            if box is not None:
                conf = next((_finite_confidence(lowered[k]) for k in CONFIDENCE_KEYS if k in lowered), None)
                label = next((str(lowered[k]) for k in LABEL_KEYS if k in lowered), None)
                out.append(ParsedBox(box, conf, label))
            return
        for value in node.values():
            _from_json(value, out, depth + 1)
        return
    if isinstance(node, list):
        box = normalise_box(node)
        if box is not None:
            out.append(ParsedBox(box))
            return
        if len(node) == 2 and all(isinstance(p, list) and len(p) == 2 for p in node):  # [[x1, y1], [x2, y2]]
            box = normalise_box([*node[0], *node[1]])
            if box is not None:
                out.append(ParsedBox(box))
                return
        for item in node:
            _from_json(item, out, depth + 1)


def _json_candidates(span: str) -> list[Any]:
    """Decoded JSON values found in ``span``: the whole span, else each top-level bracketed value."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    for text in (span, span.replace("'", '"')):
        i, n, failures = 0, len(text), 0
        while i < n and len(found) < MAX_BOXES and failures < MAX_JSON_ATTEMPTS:
            j = min((k for k in (text.find("[", i), text.find("{", i)) if k >= 0), default=-1)
            if j < 0:
                break
            try:
                value, end = decoder.raw_decode(text, j)
            except (ValueError, RecursionError):
                i, failures = j + 1, failures + 1
                continue
            found.append(value)
            i = end
        if found:
            return found
    return found


def parse_boxes(text: str) -> list[ParsedBox]:
    """Every box in the answer part of ``text``, in order of appearance (see the module docstring). Never raises."""
    if not isinstance(text, str):
        return []
    span = answer_span(text)[:MAX_PARSE_CHARS]
    out: list[ParsedBox] = []
    try:
        for value in _json_candidates(span):
            _from_json(value, out)
    except RecursionError:
        out = []
    if out:
        return _dedupe(out)
    for m in _POINT_PAIR.finditer(span):
        box = normalise_box(m.groups())
        if box is not None:
            out.append(ParsedBox(box))
    if not out:
        for m in _FOUR.finditer(span):
            box = normalise_box(m.groups())
            if box is not None:
                out.append(ParsedBox(box))
    return _dedupe(out)


def _dedupe(boxes: list[ParsedBox]) -> list[ParsedBox]:
    """Drop exact repeats (a model that loops repeats its boxes; Visual-RFT removes duplicates too)."""
    seen, unique = set(), []
    for b in boxes[:MAX_BOXES]:
        if b.box not in seen:
            seen.add(b.box)
            unique.append(b)
    return unique


def parse_box(text: str) -> tuple[float, float, float, float] | None:
    """The first box of the answer (single-object grounding), or None."""
    boxes = parse_boxes(text)
    return boxes[0].box if boxes else None


# ---------------------------------------------------------------------------------------------------------- frames


def check_frame(frame: str | None) -> str:
    frame = frame or "original"
    if frame not in FRAMES:
        raise UserError(f"coord_frame must be one of {', '.join(FRAMES)}, got {frame!r}")
    return frame


def _scale(frame: str, original_hw: Sequence[float] | None, resized_hw: Sequence[float] | None) -> tuple[float, float]:
    """(sx, sy) with original = model-frame · s."""
    if frame == "original":
        return 1.0, 1.0
    if original_hw is None:
        raise UserError(f"coord_frame {frame!r} needs original_hw")
    oh, ow = float(original_hw[0]), float(original_hw[1])
    if frame == "norm1000":
        return ow / NORM_GRID, oh / NORM_GRID
    if resized_hw is None:
        raise UserError("coord_frame 'pixels' needs resized_hw")
    rh, rw = float(resized_hw[0]), float(resized_hw[1])
    if rh <= 0 or rw <= 0:
        raise UserError(f"resized_hw must be positive, got {resized_hw}")
    return ow / rw, oh / rh


def to_original(boxes: torch.Tensor, frame: str | None, original_hw: Sequence[float] | None = None,
                resized_hw: Sequence[float] | None = None) -> torch.Tensor:
    """Boxes ``[N, 4]`` from the model's ``frame`` to original-image pixels."""
    sx, sy = _scale(check_frame(frame), original_hw, resized_hw)
    return boxes * boxes.new_tensor([sx, sy, sx, sy])


def box_to_original(box: Sequence[float], frame: str | None, original_hw: Sequence[float] | None = None,
                    resized_hw: Sequence[float] | None = None, clip: bool = True) -> tuple[float, float, float, float]:
    """One box to original pixels in plain Python (no tensor per completion on the reward path), clipped to the image
    when ``clip`` and its size is known. Same arithmetic as `to_original` + `clip_to_image`."""
    sx, sy = _scale(check_frame(frame), original_hw, resized_hw)
    x1, y1, x2, y2 = box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy
    if clip and original_hw is not None:
        h, w = float(original_hw[0]), float(original_hw[1])
        x1, x2 = min(max(x1, 0.0), w), min(max(x2, 0.0), w)
        y1, y2 = min(max(y1, 0.0), h), min(max(y2, 0.0), h)
    return x1, y1, x2, y2


def from_original(boxes: torch.Tensor, frame: str | None, original_hw: Sequence[float] | None = None,
                  resized_hw: Sequence[float] | None = None) -> torch.Tensor:
    """Boxes ``[N, 4]`` from original-image pixels to the model's ``frame`` (the inverse of `to_original`)."""
    sx, sy = _scale(check_frame(frame), original_hw, resized_hw)
    return boxes / boxes.new_tensor([sx, sy, sx, sy])


def resized_hw(height: int, width: int, min_pixels: int | None = None, max_pixels: int | None = None,
               factor: int = 28) -> tuple[int, int]:
    """The (h, w) a Qwen-VL processor resizes an image to (qwen-vl-utils' ``smart_resize``; factor 28 = patch 14 ×
    merge 2 for Qwen2/2.5-VL, 32 for Qwen3-VL). The model's ``pixels`` frame is this image's pixels."""
    from qwen_vl_utils import smart_resize

    h, w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return int(h), int(w)


def clip_to_image(boxes: torch.Tensor, hw: Sequence[float]) -> torch.Tensor:
    """Clip ``[N, 4]`` boxes to the image ``(h, w)``: a region outside the picture is no region of it."""
    h, w = float(hw[0]), float(hw[1])
    limits = boxes.new_tensor([w, h, w, h])
    return torch.minimum(boxes.clamp(min=0), limits)


# --------------------------------------------------------------------------------------------------------- overlap


def as_boxes(boxes: Any) -> torch.Tensor:
    """A float64 ``[N, 4]`` tensor from a list of boxes / a tensor (an empty input gives ``[0, 4]``)."""
    t = torch.as_tensor(boxes, dtype=torch.float64)
    return t.reshape(-1, 4)


def pairwise_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every box of ``a [N, 4]`` with every box of ``b [M, 4]`` -> ``[N, M]`` (torchvision.ops.box_iou)."""
    from torchvision.ops import box_iou

    if a.numel() == 0 or b.numel() == 0:
        return a.new_zeros(a.shape[0], b.shape[0])
    return torch.nan_to_num(box_iou(a, b), nan=0.0)


def pairwise_giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Generalized IoU ``[N, M]`` (torchvision.ops.generalized_box_iou), in [-1, 1]."""
    from torchvision.ops import generalized_box_iou

    if a.numel() == 0 or b.numel() == 0:
        return a.new_zeros(a.shape[0], b.shape[0])
    return torch.nan_to_num(generalized_box_iou(a, b), nan=-1.0).clamp(-1.0, 1.0)


def _check_paired(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"paired boxes need equal shapes, got {tuple(a.shape)} and {tuple(b.shape)}")


def paired_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of ``a[i]`` with ``b[i]`` -> ``[N]``: O(N) elementwise (the diagonal of `pairwise_iou`, tested equal)."""
    _check_paired(a, b)
    inter, union = intersection_union(a, b)
    return torch.nan_to_num(inter / union, nan=0.0)


def paired_giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """GIoU of ``a[i]`` with ``b[i]`` -> ``[N]``, in [-1, 1] (the diagonal of `pairwise_giou`, tested equal)."""
    _check_paired(a, b)
    inter, union = intersection_union(a, b)
    hull = (torch.maximum(a[:, 2:], b[:, 2:]) - torch.minimum(a[:, :2], b[:, :2])).clamp(min=0).prod(dim=1)
    giou = inter / union - (hull - union) / hull
    return torch.nan_to_num(giou, nan=-1.0).clamp(-1.0, 1.0)


def intersection_union(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Areas of ``a[i] ∩ b[i]`` and ``a[i] ∪ b[i]`` -> two ``[N]`` tensors (for cumulative IoU)."""
    from torchvision.ops import box_area

    if a.shape[0] == 0:
        return a.new_zeros(0), a.new_zeros(0)
    lt = torch.maximum(a[:, :2], b[:, :2])
    rb = torch.minimum(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=1)
    return inter, box_area(a) + box_area(b) - inter


@dataclasses.dataclass(frozen=True)
class Match:
    """Result of matching predictions to ground truth: per prediction (in the order given) the IoU it scored (0 when
    unmatched) and the index of its ground-truth box (-1 when unmatched)."""

    ious: list[float]
    gt_index: list[int]

    @property
    def matched(self) -> int:
        return sum(i >= 0 for i in self.gt_index)


def greedy_match(pred: torch.Tensor, gt: torch.Tensor, confidences: Sequence[float] | None = None,
                 threshold: float = 0.5) -> Match:
    """Visual-RFT's greedy matching: predictions in descending confidence (stable: ties keep their order) each take
    the still-unmatched ground-truth box with the highest IoU; the match holds only if that IoU > ``threshold``.

    The IoU matrix is computed once, vectorised; the loop is over predictions (at most `MAX_BOXES`), not pairs.
    """
    n = pred.shape[0]
    if n == 0:
        return Match([], [])
    ious = pairwise_iou(pred, gt)  # [n, m]
    conf = list(confidences) if confidences is not None else [1.0] * n
    order = sorted(range(n), key=lambda i: -conf[i])
    taken = torch.zeros(gt.shape[0], dtype=torch.bool)
    out_iou, out_gt = [0.0] * n, [-1] * n
    for i in order:
        if gt.shape[0] == 0:
            break
        row = ious[i].masked_fill(taken, -1.0)
        best = int(row.argmax())
        if float(row[best]) > threshold:
            taken[best] = True
            out_iou[i], out_gt[i] = float(row[best]), best
    return Match(out_iou, out_gt)
