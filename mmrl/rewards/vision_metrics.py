"""Evaluation metrics of the vision tasks, over every scored response of ``python -m mmrl.eval``.

Each is ``fn(completions, samples) -> {name: value}`` (a `Task.metrics`); samples carry the same ``coord_frame`` /
``original_hw`` / ``resized_hw`` the rewards read, so metrics and rewards agree on the frame.

Grounding (the GPG paper's Table 8 reports mIoU and gIoU on LISA, following Visual-RFT and LISA, Lai et al. 2024):

* ``miou`` -- mean over responses of the box IoU with the ground truth (a response with no readable box counts 0).
  LISA's "gIoU" is defined the same way -- "the average of all per-image IoUs" -- but over segmentation masks;
  on box annotations it is this number, so it is not printed twice.
* ``ciou`` -- LISA's cIoU: cumulative intersection / cumulative union (biased toward large objects).
* ``acc@0.5`` -- share of responses with IoU > 0.5 (RefCOCO accuracy).
* ``mean_giou`` -- mean generalized IoU (Rezatofighi et al. 2019; -1 when no box), the quantity ``giou_plus_one``
  rewards; not LISA's gIoU despite the name.
* ``box_rate`` -- share of responses with a readable box.

Detection: ``detection_iou`` and ``detection_confidence`` (Visual-RFT's R_IoU and R_conf, means), ``precision``
and ``recall`` of greedy matches at IoU > 0.5 (micro-averaged over all boxes).

Classification and choice: ``accuracy`` = mean of the match reward (equal to pass@1 over the same responses).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mmrl.rewards.base import Sample


def grounding_metrics(completions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
    from mmrl.rewards.vision import grounding_scores

    rows = grounding_scores(completions, samples)
    if not rows:
        return {}
    n = len(rows)
    union = sum(r["union"] for r in rows)
    return {"miou": sum(r["iou"] for r in rows) / n,
            "ciou": sum(r["inter"] for r in rows) / union if union > 0 else 0.0,
            "acc@0.5": sum(r["iou"] > 0.5 for r in rows) / n,
            "mean_giou": sum(r["giou"] for r in rows) / n,
            "box_rate": sum(r["reason"] is None or r["reason"].startswith("predicted box") for r in rows) / n}


def detection_metrics(completions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
    from mmrl.rewards.vision import detection_parts, gold_boxes, predicted_in_original
    from mmrl.vision.boxes import as_boxes, greedy_match

    if not completions:
        return {}
    r_iou = r_conf = 0.0
    matched = n_pred = n_gt = 0
    for text, sample in zip(completions, samples, strict=True):
        a, c, _ = detection_parts(text, sample)
        r_iou, r_conf = r_iou + a, r_conf + c
        pred, conf, _ = predicted_in_original(text, sample)
        gt = as_boxes(gold_boxes(sample))
        match = greedy_match(pred, gt, [1.0 if x is None else x for x in conf])
        matched, n_pred, n_gt = matched + match.matched, n_pred + pred.shape[0], n_gt + gt.shape[0]
    n = len(completions)
    return {"detection_iou": r_iou / n, "detection_confidence": r_conf / n,
            "precision": matched / n_pred if n_pred else 0.0, "recall": matched / n_gt if n_gt else 0.0}


def match_accuracy(reward_name: str) -> Callable[[Sequence[str], Sequence[Sample]], dict[str, float]]:
    """``accuracy`` = mean of a 0/1 reward (``classification_match``, ``choice_match``)."""

    def metrics(completions: Sequence[str], samples: Sequence[Sample]) -> dict[str, float]:
        from mmrl.rewards.base import get_reward

        results = get_reward(reward_name)(list(completions), list(samples))
        return {"accuracy": sum(r.score for r in results) / len(results)} if results else {}

    return metrics
