"""The recipes of ``embedded:tiny-qwen2.5-vl`` (below) and ``embedded:tiny-qwen3-vl`` (`build_tiny_grounding_vl`): the
bundled vision data they are pre-trained on, and their builds.

The processor and the architecture are the vision layer's (`mmrl.vision.embedded`), the loop is every embedded
model's (`mmrl.models.recipes.pretrain`); the text and rows come from the bundled tasks, which is why the recipe
sits in the model layer (above tasks and vision).

Both ship with the package as built files (`mmrl.models.shipped`); ``python -m mmrl.models.recipes.build NAME --out
DIR`` runs a recipe again (in a child process with AVX2 kernels and one thread, see `mmrl.models.recipes.embedded`),
which on another machine or library version gives other weights. Recipe of ``embedded:tiny-qwen2.5-vl`` (version
``VL_RECIPE_VERSION`` in `mmrl.cache`):

1. the byte-level BPE tokenizer of the text default, trained on its corpus plus the bundled geometry prompts and
   answers, with the Qwen-VL special tokens, one token per ``<think>``/``<answer>`` tag (a whole bundled answer
   fits the default 16-token budget) and a chat template that renders image items as
   ``<|vision_start|><|image_pad|><|vision_end|>``;
2. a ``Qwen2_5_VLForConditionalGeneration``: ViT of depth 2 (hidden 64, patch 14, 2 × 2 merge, window attention
   as Qwen2.5-VL), LLM of 2 layers (hidden 96, M-RoPE sections [4, 4, 4]); ~0.57 M parameters;
3. supervised pre-training (:data:`PRETRAIN_STEPS` steps of 16 rows, `mmrl.models.recipes.pretrain`) on a mix of freshly
   drawn geometry diagrams (:data:`GEO_SHARE`, both prompt layouts; drawn by the bundled generator with a random
   stream of their own, not taken from the bundled set, but the generator's picture space is small, so many
   bundled held-out diagrams can come up in pre-training too), freshly drawn grid-layout grounding scenes
   (:data:`GROUNDING_SHARE`) and training rows of the other bundled sets (detection, classification, visual choice).

   It *stops at partial skill*: the model has learnt to see the diagrams (its greedy accuracy beats the best
   constant answer per kind a blind model could give) but is unsure. Last, the gain of the LLM's final norm is
   divided by :data:`HEDGE_TEMPERATURE` (1.3): with tied embeddings that divides every logit by 1.3,
   so the model samples at temperature 1 as the pre-trained one does at 1.3 and its greedy answers do not change.
   It starts as RL with verifiable rewards finds a real base model: the right answer is among its samples far more
   often than it is its one sample. Its measured skill is the ``skill`` record of the model's manifest
   (``mmrl/models/weights/manifest.json``, read by :mod:`mmrl.models.shipped`); what RL makes of it in CPU minutes is
   on docs/results.md#demo_geoqa_gpg.

   Why not noisy targets, as v3 did (a share of the chains resting on a random reading of the diagram): with them
   from the start the model never learnt to read the diagrams at all (its greedy answer was the same for every
   picture, the prior's most frequent one), and a noisy phase after clean pre-training (v4 draft: 150 steps, half
   the chains random) undid most of the seeing. :data:`GEO_NOISE` is therefore 0; a share :data:`BOX_NOISE` of the
   grounding boxes is still moved by one grid cell.
"""

from __future__ import annotations

import random
from collections.abc import Callable

PRETRAIN_STEPS = 900  # stops at partial skill (see the module docstring)
HEDGE_TEMPERATURE = 1.3  # the final norm's gain is divided by this: the model samples as at temperature 1.3
OTHER_SETS = (("grounding", {"variant": "detection"}), ("classification", {}), ("visual_choice", {}))
OTHER_ROWS = 200  # training rows of each non-geometry set in the pre-training mix


def sft_target(row: dict, boxed: bool) -> str:
    """The supervised completion of a bundled geometry row: its short chain, then the answer."""
    chain = row.get("solution", "")
    if boxed:
        return f"<think>{chain}</think> \\boxed{{{row['answer']}}}"
    return f"<think>{chain}</think><answer>{row['answer']}</answer>"


def _corpus_lines(repeats: int = 20) -> list[str]:
    """Prompts and answers of every bundled geometry problem text, for the tokenizer."""
    from mmrl.tasks.geo_synthetic import all_problem_texts
    from mmrl.tasks.geometry3k import BOXED_TEMPLATE
    from mmrl.tasks.geoqa import R1V_TEMPLATE

    lines = []
    for row in all_problem_texts():
        for template in (R1V_TEMPLATE, BOXED_TEMPLATE):
            lines.append(template.replace("{problem}", row["problem"]))
        lines += [sft_target(row, False), sft_target(row, True)]
    return lines * repeats


GEO_NOISE = 0.0  # share of pre-training diagrams whose target chain rests on a random reading (see the docstring)
BOX_NOISE = 0.5  # share of pre-training grounding scenes whose target box is off by one grid cell
GEO_SHARE = 0.6  # share of pre-training rows that are geometry diagrams
GROUNDING_SHARE = 0.25  # ... grid-layout grounding scenes (the rest: rows of the other bundled sets)


def geometry_messages(image, problem: str, boxed: bool) -> list[dict]:
    """The chat of a geometry problem as the ``geoqa`` (R1-V) or ``geometry3k`` (EasyR1) task builds it."""
    from mmrl.tasks.geometry3k import BOXED_TEMPLATE
    from mmrl.tasks.geoqa import R1V_TEMPLATE

    text = (BOXED_TEMPLATE if boxed else R1V_TEMPLATE).replace("{problem}", problem)
    return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}]


def geometry_examples(vp, noise: float = GEO_NOISE):
    """``draw(rng)``: a freshly drawn geometry diagram (from its own random stream, not the bundled set's rows; the
    same picture can still come up), in either layout, whose target chain rests on the true reading, or with
    probability ``noise`` on a uniformly drawn one."""
    from mmrl.models.recipes.pretrain import Example
    from mmrl.tasks.geo_synthetic import geo_problem, problem_text, random_reading

    tok = vp.tokenizer

    def draw(rng: random.Random) -> Example:
        image, row = geo_problem(rng)
        if rng.random() < noise:
            row = problem_text(row["kind"], random_reading(row["kind"], rng))
        boxed = rng.random() < 0.5
        prompt = vp.encode(geometry_messages(image, row["problem"], boxed), "pre-training diagram")
        target = tok(sft_target(row, boxed) + "<|im_end|>", add_special_tokens=False)["input_ids"]
        return Example(prompt.prompt_ids, target, prompt.inputs)

    return draw


def grounding_examples(vp, noise: float = BOX_NOISE, size: int = 112, counts: tuple[int, ...] = (2, 3)):
    """``draw(rng)``: a freshly drawn grid-layout grounding scene (from its own random stream, not the bundled
    set's rows) of ``counts`` shapes whose target box is the referred shape's, or with probability ``noise`` that box
    moved by one grid cell in a random direction (clipped to the image), written in the model's frame as the
    grounding task's reference completion."""
    from mmrl.models.recipes.pretrain import Example
    from mmrl.tasks.synthetic_vision import GRID, draw_scene, grounding_prompt, place_on_grid, reference_completion
    from mmrl.tasks.vision_data import vision_messages

    def draw(rng: random.Random) -> Example:
        objects = place_on_grid(rng, rng.choice(counts), size)
        image, boxes = draw_scene(objects, size)
        k = rng.randrange(len(objects))
        box = list(boxes[k])
        if rng.random() < noise:
            dx, dy = rng.choice([(a, b) for a in (-1, 0, 1) for b in (-1, 0, 1) if (a, b) != (0, 0)])
            dx = max(-box[0], min(size - box[2], dx * GRID))
            dy = max(-box[1], min(size - box[3], dy * GRID))
            box = [box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy]
        expression = f"the {objects[k]['colour']} {objects[k]['shape']}"
        row = {"messages": vision_messages(image, grounding_prompt(expression)), "answer": box, "problem": expression}
        prompt = vp.encode(row["messages"], "pre-training scene")
        target = vp.tokenizer(reference_completion(vp.annotate(row, prompt)) + "<|im_end|>", add_special_tokens=False)
        return Example(prompt.prompt_ids, target["input_ids"], prompt.inputs)

    return draw


def set_examples(vp, rows: list[tuple[dict, Callable[[dict], str]]]):
    """``draw(rng)``: one of ``rows`` (sample, target(annotated sample) -> completion), each encoded once."""
    from mmrl.models.recipes.pretrain import Example

    encoded = []
    for i, (row, completion) in enumerate(rows):
        prompt = vp.encode(row["messages"], f"pre-training row {i}")
        target = vp.tokenizer(completion(vp.annotate(row, prompt)) + "<|im_end|>", add_special_tokens=False)
        encoded.append(Example(prompt.prompt_ids, target["input_ids"], prompt.inputs))
    return lambda rng: encoded[rng.randrange(len(encoded))]


def mixed(parts: list[tuple[float, Callable]]):
    """``draw(rng)`` picking one of ``parts`` (weight, draw) by weight, then drawing from it."""
    weights = [w for w, _ in parts]

    def draw(rng: random.Random):
        return rng.choices(parts, weights)[0][1](rng)

    return draw


def other_rows(per_set: int = OTHER_ROWS) -> list[tuple[dict, Callable[[dict], str]]]:
    """``per_set`` training rows of each other bundled vision set (grounding, detection, classification, visual
    choice) with their reference completion."""
    from mmrl.tasks import get_task
    from mmrl.tasks.synthetic_vision import reference_completion

    rows = []
    for name, options in OTHER_SETS:
        rows += [(r, reference_completion) for r in get_task(name, **options).train[:per_set]]
    return rows


def vl_tokenizer():
    """The tokenizer of both embedded Qwen-VL models (recipe step 1)."""
    from mmrl.models.recipes.embedded import train_tokenizer
    from mmrl.tasks.synthetic_vision import corpus_lines
    from mmrl.vision.embedded import TAG_TOKENS

    tokenizer = train_tokenizer(vocab_size=448, extra=_corpus_lines() + corpus_lines())
    tokenizer.add_tokens(TAG_TOKENS)  # one token per tag: a whole answer fits the default 16-token budget
    return tokenizer


def build_tiny_vl(steps: int | None = None):
    """(model, processor) of the vision default, pre-trained ``steps`` steps (None: :data:`PRETRAIN_STEPS`)."""
    import torch

    from mmrl.models.recipes.pretrain import pretrain
    from mmrl.vision.embedded import MAX_PIXELS, MIN_PIXELS, build_processor, tiny_qwen2_5_vl
    from mmrl.vision.family import FAMILIES
    from mmrl.vision.processor import VisionProcessor

    tokenizer = vl_tokenizer()
    processor = build_processor(tokenizer)
    model = tiny_qwen2_5_vl(tokenizer)
    vp = VisionProcessor(processor, FAMILIES["qwen2_5_vl"], MIN_PIXELS, MAX_PIXELS)
    draw = mixed([(GEO_SHARE, geometry_examples(vp)), (GROUNDING_SHARE, grounding_examples(vp)),
                  (1 - GEO_SHARE - GROUNDING_SHARE, set_examples(vp, other_rows()))])
    pretrain(model, draw, tokenizer.pad_token_id, steps=PRETRAIN_STEPS if steps is None else steps, batch_size=16,
             lr=3e-3)
    with torch.no_grad():  # logits / HEDGE_TEMPERATURE exactly: the LM head reads the final norm's output linearly
        model.model.language_model.norm.weight.div_(HEDGE_TEMPERATURE)
    return model, processor


GROUNDING_PRETRAIN_STEPS = 2400  # phase 1, one-shape scenes; the loss leaves its plateau after ~1000 (docs/vision.md)
GROUNDING_SELECT_ROUNDS = 2  # phase 2: rounds of 600 steps on 2-3-shape scenes, each with a fresh AdamW (seed 100 + k)
GROUNDING_ROUND_STEPS = 600


def build_tiny_grounding_vl(steps: int | None = None):
    """(model, processor) of ``embedded:tiny-qwen3-vl``, the default of ``--task grounding``.

    The tokenizer of the vision default and a tiny Qwen3-VL (`mmrl.vision.embedded.tiny_qwen3_vl`: learnt absolute
    position embedding in the ViT), pre-trained on freshly drawn grid scenes ("the red circle" and its box, in
    Qwen3-VL's 0..1000 frame; 16 rows a step, AdamW 3e-3) in two phases, because the bundled kind of scene (2-3 shapes)
    alone keeps the model on a plateau (the same box for every picture) for as long as it was tried:

    1. :data:`GROUNDING_PRETRAIN_STEPS` steps on scenes with ONE shape: it learns to find a shape and write its box;
    2. :data:`GROUNDING_SELECT_ROUNDS` rounds of 600 steps on 2-3-shape scenes: it starts to box the shape the
       expression names. It stops there, at partial skill: its greedy boxes are better than its samples at
       temperature 1, the regime RL sharpens. Its measured skill is the ``skill`` record of the model's manifest
       (``mmrl/models/weights/manifest.json``); what RL makes of it is on docs/results.md#grounding_gpg.

    ``steps`` (None: the recipe's) replaces the step count of each phase and round."""
    from mmrl.models.recipes.pretrain import pretrain
    from mmrl.vision.embedded import QWEN3_MAX_PIXELS, QWEN3_MIN_PIXELS, build_qwen3_processor, tiny_qwen3_vl
    from mmrl.vision.family import FAMILIES
    from mmrl.vision.processor import VisionProcessor

    tokenizer = vl_tokenizer()
    processor = build_qwen3_processor(tokenizer)
    model = tiny_qwen3_vl(tokenizer)
    vp = VisionProcessor(processor, FAMILIES["qwen3_vl"], QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS)
    pretrain(model, grounding_examples(vp, noise=0.0, counts=(1,)), tokenizer.pad_token_id,
             steps=GROUNDING_PRETRAIN_STEPS if steps is None else steps, batch_size=16, lr=3e-3)
    for k in range(GROUNDING_SELECT_ROUNDS):
        pretrain(model, grounding_examples(vp, noise=0.0), tokenizer.pad_token_id,
                 steps=GROUNDING_ROUND_STEPS if steps is None else steps, batch_size=16, lr=3e-3, seed=100 + k)
    return model, processor
