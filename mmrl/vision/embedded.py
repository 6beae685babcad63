"""The embedded Qwen-VL models' processors and architectures: ``embedded:tiny-qwen2.5-vl`` (the vision default) and
``embedded:tiny-qwen3-vl`` (the default of ``--task grounding``).

The recipe that pre-trains it on the bundled data lives in `mmrl.models.recipes.embedded_vl` (the vision layer knows no
task), with the one pre-training loop of every embedded model (`mmrl.models.recipes.pretrain`); the built models ship
with the package (`mmrl.models.shipped`), like the text default.

* the byte-level BPE tokenizer of the text default with the Qwen-VL special tokens, one token per
  ``<think>``/``<answer>`` tag (a whole bundled answer fits the default 16-token budget) and a chat template that
  renders image items as ``<|vision_start|><|image_pad|><|vision_end|>``;
* a ``Qwen2_5_VLForConditionalGeneration``: ViT of depth 2 (hidden 64, patch 14, 2 × 2 merge, window attention
  as Qwen2.5-VL), LLM of 2 layers (hidden 96, M-RoPE sections [4, 4, 4]); ~0.57 M parameters.

``embedded:tiny-qwen3-vl`` shares the tokenizer and the LLM size, as a ``Qwen3VLForConditionalGeneration``: ViT of
depth 2 (hidden 64, patch 16, 2 × 2 merge, DeepStack from block 0) with Qwen3-VL's *learnt absolute position
embedding* (8 × 8 patches, so a 112 px image, resized to 128, uses it without interpolation) and interleaved M-RoPE in
the LLM; ~0.67 M parameters. Grounding needs it: Qwen2.5-VL's ViT has only relative 2D RoPE, and the LLM's M-RoPE at
head_dim 24 turns a 4 × 4 grid of image tokens by < 0.2 rad, so no part of the tiny Qwen2.5-VL knows where an image
token is (docs/vision.md, "Grounding").

The processor (image processor + tokenizer + chat template) is saved beside the model, so ``AutoProcessor`` and
`mmrl.vision.processor.VisionProcessor.from_pretrained` load it like any Qwen2.5-VL checkpoint.
"""

from __future__ import annotations

import torch

TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MIN_PIXELS, MAX_PIXELS = 56 * 56, 224 * 224  # the processor's own defaults (a run's model.min/max_pixels apply on top)


def build_processor(tokenizer):
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tokenizer.chat_template = VL_CHAT_TEMPLATE
    image_processor = Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=14, merge_size=2,
                                            temporal_patch_size=2)
    # transformers 5 needs a video processor to build a Qwen-VL processor; it is never used here.
    return Qwen2_5_VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                               video_processor=Qwen2VLVideoProcessor(), chat_template=VL_CHAT_TEMPLATE)


def tiny_qwen2_5_vl(tokenizer, hidden: int = 96, layers: int = 2, vision_hidden: int = 64, seed: int = 0):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    head_dim = hidden // 4
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [head_dim // 6, head_dim // 6, head_dim // 2 - 2 * (head_dim // 6)]},
                tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=None)
    vision = dict(depth=2, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_heads=4,
                  out_hidden_size=hidden, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                  fullatt_block_indexes=[1])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **vl_token_fields(tokenizer))
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config)


def vl_token_fields(tokenizer) -> dict:
    """The fields every Qwen-VL config takes from the tokenizer: its image/video/vision marker ids, end and pad ids
    (the embedding stays tied to the LM head)."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in
           ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    return {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
            "tie_word_embeddings": True, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def build_qwen3_processor(tokenizer):
    """The Qwen3-VL processor of ``embedded:tiny-qwen3-vl``: patch 16, 2 × 2 merge, the same tokenizer and template."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer.chat_template = VL_CHAT_TEMPLATE
    image_processor = Qwen2VLImageProcessor(min_pixels=QWEN3_MIN_PIXELS, max_pixels=QWEN3_MAX_PIXELS, patch_size=16,
                                            merge_size=2, temporal_patch_size=2)
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                            video_processor=Qwen3VLVideoProcessor(), chat_template=VL_CHAT_TEMPLATE)


QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS = 64 * 64, 256 * 256  # patch 16 × merge 2: sides are multiples of 32


def tiny_qwen3_vl(tokenizer, hidden: int = 96, layers: int = 2, vision_hidden: int = 64, seed: int = 0):
    """A ``Qwen3VLForConditionalGeneration`` with an 8 × 8 learnt position embedding in its ViT (see the docstring)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    head_dim = hidden // 4
    section = [head_dim // 6, head_dim // 6, head_dim // 2 - 2 * (head_dim // 6)]
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section,
                                 "mrope_interleaved": True},
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    vision = dict(depth=2, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_heads=4, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=hidden, num_position_embeddings=64,
                  deepstack_visual_indexes=[0])
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **vl_token_fields(tokenizer))
    torch.manual_seed(seed)
    return Qwen3VLForConditionalGeneration(config)
