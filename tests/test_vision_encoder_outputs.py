"""Image features shared across a group only reach a model whose forward takes them: transformers 5.17's Qwen-VL
forward has no ``mm_encoder_outputs`` argument and drops it, so such a model must get every row's own pixels."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2_5_VLForConditionalGeneration

from mmrl.batch import Response, collate
from mmrl.tasks import get_task
from mmrl.trainer.vision_prompts import PromptCache
from mmrl.vision.inputs import takes_encoder_outputs


class QwenVLWithoutEncoderOutputs(Qwen2_5_VLForConditionalGeneration):
    """The forward of transformers 5.17: keyword arguments it does not know vanish in ``**kwargs``."""

    def forward(self, input_ids=None, attention_mask=None, pixel_values=None, image_grid_thw=None,
                mm_token_type_ids=None, **kwargs):
        kwargs.pop("mm_encoder_outputs", None)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                               image_grid_thw=image_grid_thw, mm_token_type_ids=mm_token_type_ids, **kwargs)


@pytest.fixture(scope="module")
def vision_batch_and_models():
    """3 geoqa prompts x 2 responses, and the embedded vision architecture (untrained) in both forwards."""
    from mmrl.models.recipes.embedded_vl import vl_tokenizer
    from mmrl.vision.embedded import MAX_PIXELS, MIN_PIXELS, build_processor, tiny_qwen2_5_vl
    from mmrl.vision.family import FAMILIES
    from mmrl.vision.processor import VisionProcessor

    tokenizer = vl_tokenizer()
    processor = VisionProcessor(build_processor(tokenizer), FAMILIES["qwen2_5_vl"], MIN_PIXELS, MAX_PIXELS)
    model = tiny_qwen2_5_vl(tokenizer).eval()
    older = QwenVLWithoutEncoderOutputs(model.config).eval()
    older.load_state_dict(model.state_dict())
    cache = PromptCache(processor, get_task("geoqa", n_samples=20).train[:3], "train", 512)
    groups = [cache.group(i) for i in range(3)]
    answer = tokenizer("<think>AB is 3</think><answer>3</answer>", add_special_tokens=False)["input_ids"]
    for g in groups:
        g.responses = [Response(answer + [tokenizer.eos_token_id]), Response(answer[:2] + [tokenizer.eos_token_id])]
    return collate(groups, tokenizer.pad_token_id), model, older


def logits(model, batch, shared: bool) -> torch.Tensor:
    extra = batch.vision.model_inputs(batch.input_ids, "cpu", model if shared else None)
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **extra).logits


def test_a_forward_without_encoder_outputs_gets_each_rows_pixels(vision_batch_and_models):
    batch, model, older = vision_batch_and_models
    assert takes_encoder_outputs(model) and not takes_encoder_outputs(older)
    extra = batch.vision.model_inputs(batch.input_ids, "cpu", older)
    assert "pixel_values" in extra and "mm_encoder_outputs" not in extra
    torch.testing.assert_close(logits(older, batch, shared=True), logits(model, batch, shared=True),
                               atol=1e-5, rtol=1e-5)


def test_a_lora_wrapped_model_still_shares_features(vision_batch_and_models):
    from mmrl.models.lora import LoraSettings, add_lora, parse_targets

    batch, model, _ = vision_batch_and_models
    import copy

    wrapped = add_lora(copy.deepcopy(model), LoraSettings(4, 8, parse_targets("q_proj,v_proj")))
    assert takes_encoder_outputs(wrapped)
    assert "mm_encoder_outputs" in batch.vision.model_inputs(batch.input_ids, "cpu", wrapped)
