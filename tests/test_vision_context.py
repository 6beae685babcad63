"""`mmrl.vision.reward_context` (the reward context from image headers, no pixel work) against what the real
processor does on the embedded Qwen2.5-VL, and the OpenRLHF launcher's annotate hook that uses it."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from mmrl.tasks import get_task
from mmrl.vision import reward_context
from mmrl.vision.context import pixel_budget
from mmrl.vision.images import ImageError
from mmrl.vision.processor import VisionProcessor


@pytest.fixture(scope="module")
def vl_dir():
    from mmrl.cache import EMBEDDED_VL_NAME
    from mmrl.models import shipped_model

    return str(shipped_model(EMBEDDED_VL_NAME))


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "blue").save(buffer, format="PNG")
    return buffer.getvalue()


def _row(*images, text: str = "Find the box.") -> dict:
    content = [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}], "answer": [1, 2, 3, 4]}


def test_context_equals_what_the_processor_annotates(vl_dir, tmp_path):
    """The sizes the processor really used (read back from image_grid_thw) under its own default budget."""
    from transformers import AutoImageProcessor

    size = AutoImageProcessor.from_pretrained(vl_dir).size
    budget = (size["shortest_edge"], size["longest_edge"])
    assert pixel_budget(vl_dir)[2:] == budget
    processor = VisionProcessor.from_pretrained(vl_dir, *budget)
    wide = tmp_path / "wide.png"
    Image.new("RGB", (410, 150), "green").save(wide)
    rows = get_task("grounding", n_samples=4, image_size=300).train[:2]  # 300² > the budget: downscaled
    rows += get_task("grounding", n_samples=4).train[:1]  # 112²: kept
    rows.append(_row(str(wide), _png(61, 45)))  # a path and bytes, two images, neither a multiple of 28
    for i, row in enumerate(rows):
        expected = processor.annotate({}, processor.encode(row["messages"], f"row {i}"))
        assert reward_context(row, vl_dir) == expected
    assert reward_context(rows[0], vl_dir)["resized_hw"] != reward_context(rows[0], vl_dir)["original_hw"]
    assert reward_context(rows[-1], vl_dir)["original_hw"] == [[150, 410], [45, 61]]


def test_text_rows_get_nothing_and_bad_images_name_the_row(vl_dir, tmp_path):
    assert reward_context({"messages": [{"role": "user", "content": "2+2?"}]}, vl_dir) == {}
    assert reward_context({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, vl_dir) == {}
    with pytest.raises(ImageError, match=r"train row 7: image file .*missing.png' does not exist"):
        reward_context(_row(str(tmp_path / "missing.png")), vl_dir, "train row 7")
    with pytest.raises(ImageError, match="train row 8: image 5 bytes is missing or corrupt"):
        reward_context(_row(b"notpn"), vl_dir, "train row 8")


def test_qwen2_vl_checkpoint_gives_the_0_1000_frame(vl_dir, tmp_path):
    from transformers import AutoConfig, Qwen2VLConfig, Qwen2VLImageProcessor

    model_dir = tmp_path / "qwen2-vl"
    Qwen2VLConfig().save_pretrained(model_dir)
    Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56).save_pretrained(model_dir)
    assert AutoConfig.from_pretrained(model_dir).model_type == "qwen2_vl"
    context = reward_context(_row(_png(300, 200)), str(model_dir))
    # 300×200 under at most 56² pixels: factor 28, aspect kept -> 56×28 (h, w) = (28, 56)
    assert context == {"coord_frame": "norm1000", "resized_hw": [[28, 56]], "original_hw": [[200, 300]]}


def test_text_model_is_refused_with_one_line(embedded_model_dir):
    with pytest.raises(ValueError, match="is not a Qwen-VL model"):
        reward_context(_row(_png(8, 8)), str(embedded_model_dir))


def test_openrlhf_annotator_feeds_the_grounding_reward(vl_dir):
    """A box that is perfect in the model's (resized-pixel) frame scores the maximum once the label carries the
    context; read as original pixels (no context) the same answer misses."""
    from mmrl.openrlhf.launch import vision_annotator

    annotate = vision_annotator(vl_dir)
    assert callable(annotate)
    task = get_task("grounding", n_samples=4, image_size=300)
    row = task.train[0]
    label = {k: v for k, v in row.items() if k != "messages"} | annotate(row)
    assert label["coord_frame"] == "pixels"
    (oh, ow), (rh, rw) = label["original_hw"][0], label["resized_hw"][0]
    x1, y1, x2, y2 = row["answer"]
    in_model_frame = [x1 * rw / ow, y1 * rh / oh, x2 * rw / ow, y2 * rh / oh]
    completion = f"<think>it is there</think><answer>{in_model_frame}</answer>"
    scored = task.reward([completion], [label])[0]
    assert scored.components["iou"] == pytest.approx(1.0, abs=1e-6)
    assert scored.score == pytest.approx(task.reward.high, abs=1e-6)
    unscaled = task.reward([completion], [{k: v for k, v in label.items() if k not in annotate(row)}])[0]
    assert unscaled.components["iou"] < 0.9
