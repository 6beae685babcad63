"""Bundled synthetic vision sets, drawn by code with PIL: shapes on a plain canvas with exactly known answers.

Deliberately easy (a handful of flat-coloured shapes, 112 px images by default, few classes) so that a tiny
Qwen-VL on a CPU can learn something in minutes. Each scene is a pure function of (seed, index): the same
parameters give the same pixels and rows on every machine.

* Grounding: 2-3 non-overlapping shapes with distinct (colour, shape) pairs; the referring expression names one
  ("the red circle"). Its box is the bounding box of the shape's own drawn pixels, in pixel-edge coordinates
  ``[min col, min row, max col + 1, max row + 1]`` (so its area counts the pixels it covers), computed from the
  shape's mask, not from the drawing parameters.
* Detection: the same scenes; the query is a colour or a shape ("every red shape") and ``boxes`` lists each match.
* Classification: one shape of a random colour, position and size; the label is the shape's name.
* Visual choice (SAT / CV-Bench-like spatial questions): two shapes; "is A left or right of B", "above or below",
  or "how many shapes"; options in shuffled order, the answer is the correct option's letter.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from mmrl.errors import UserError

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square", "triangle", "cross")
BACKGROUND = (245, 245, 245)
VERSION = "v2"  # bump when the drawing or the row layout changes (the cache key)


def shape_mask(shape: str, cx: float, cy: float, r: float, size: int):
    """A binary mask (PIL "1"-like "L" image) of one shape centred at (cx, cy) with half-extent r."""
    from PIL import Image, ImageDraw

    mask = Image.new("L", (size, size), 0)
    d = ImageDraw.Draw(mask)
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    elif shape == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=255)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=255)
    elif shape == "cross":
        t = r / 3
        d.rectangle([cx - r, cy - t, cx + r, cy + t], fill=255)
        d.rectangle([cx - t, cy - r, cx + t, cy + r], fill=255)
    else:
        raise UserError(f"unknown shape {shape!r}")
    return mask


def mask_box(mask) -> list[int]:
    """Pixel-edge bounding box ``[x1, y1, x2, y2]`` of the mask's set pixels."""
    x1, y1, x2, y2 = mask.getbbox()  # PIL's bbox is already (left, upper, right + 1, lower + 1)
    return [int(x1), int(y1), int(x2), int(y2)]


def draw_scene(objects: list[dict[str, Any]], size: int):
    """Render objects (colour, shape, cx, cy, r) onto a canvas; returns (image, per-object boxes)."""
    from PIL import Image

    canvas = Image.new("RGB", (size, size), BACKGROUND)
    boxes = []
    for obj in objects:
        mask = shape_mask(obj["shape"], obj["cx"], obj["cy"], obj["r"], size)
        canvas.paste(COLOURS[obj["colour"]], (0, 0), mask)
        boxes.append(mask_box(mask))
    return canvas, boxes


def place_objects(rng: random.Random, n: int, size: int, min_r: float, max_r: float,
                  distinct: bool = True) -> list[dict[str, Any]]:
    """``n`` shapes placed one by one with well separated centres (1.5 × the half-extents apart: a square's corner
    is at √2 × r, so no two shapes touch and every shape's pixels stay visible); distinct (colour, shape) pairs
    unless ``distinct`` is False."""
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    rng.shuffle(pairs)
    for _ in range(100):
        objects: list[dict[str, Any]] = []
        for k in range(n):
            colour, shape = pairs[k] if distinct else (rng.choice(list(COLOURS)), rng.choice(SHAPES))
            for _ in range(200):
                r = round(rng.uniform(min_r, max_r), 1)
                obj = {"colour": colour, "shape": shape, "r": r, "cx": round(rng.uniform(r + 2, size - r - 2), 1),
                       "cy": round(rng.uniform(r + 2, size - r - 2), 1)}
                if all(math.dist((obj["cx"], obj["cy"]), (o["cx"], o["cy"])) > 1.5 * (obj["r"] + o["r"]) + 4
                       for o in objects):
                    objects.append(obj)
                    break
            else:
                break
        if len(objects) == n:
            return objects
    raise RuntimeError(f"could not place {n} shapes on a {size} px canvas")


GRID = 14  # the grid layout's cell: one ViT patch of the Qwen-VL families at patch 14


def place_on_grid(rng: random.Random, n: int, size: int, spans: tuple[int, ...] = (2, 3),
                  cell: int = GRID) -> list[dict[str, Any]]:
    """``n`` shapes with distinct (colour, shape) pairs, each filling a square of ``span`` × ``span`` grid cells
    (its drawn pixels' box is exactly those cells: ``[cell·i, cell·j, cell·(i + span), cell·(j + span)]``), with at
    least one free cell between any two. The facts are on the patch grid, so a tiny ViT can see where a shape is."""
    cells = size // cell
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    rng.shuffle(pairs)
    for _ in range(100):
        taken: list[tuple[int, int, int]] = []
        for _ in range(200):
            if len(taken) == n:
                break
            span = rng.choice(spans)
            i, j = rng.randrange(0, cells - span + 1), rng.randrange(0, cells - span + 1)
            if all(i + span < a or a + b < i or j + span < c or c + b < j for a, c, b in taken):
                taken.append((i, j, span))
        if len(taken) == n:
            # pixels cell·i .. cell·(i + span) - 1 on both axes: the mask's box is the cells' edges
            return [{"colour": colour, "shape": shape, "r": (cell * span - 1) / 2,
                     "cx": cell * i + (cell * span - 1) / 2, "cy": cell * j + (cell * span - 1) / 2}
                    for (i, j, span), (colour, shape) in zip(taken, pairs, strict=False)]
    raise RuntimeError(f"could not place {n} shapes on a {cells} × {cells} grid")


THINK_ANSWER = "Think in <think> </think>, then answer in <answer> </answer>."


def grounding_prompt(expression: str) -> str:
    return f"Find {expression} in the image and output its bounding box [x1,y1,x2,y2]. {THINK_ANSWER}"


def detection_prompt(expression: str) -> str:
    return f"Find every {expression} in the image and output their boxes as a list of [x1,y1,x2,y2]. {THINK_ANSWER}"


def classification_prompt(classes: list[str]) -> str:
    return f"Which shape is in the image: {', '.join(classes)}? {THINK_ANSWER}"


def choice_prompt(question: str, options: list[str]) -> str:
    listed = " ".join(f"({chr(65 + i)}) {o}" for i, o in enumerate(options))
    return f"{question} {listed} {THINK_ANSWER} Answer with the option's letter."


def _write(root: Path, rows: list[dict[str, Any]]) -> None:
    with open(root / "rows.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def build_grounding(root: Path, n: int, size: int, seed: int, detection: bool = False, layout: str = "free") -> None:
    """Grounding (or detection) scenes as ``root/images/*.png`` + ``root/rows.jsonl``; ``layout`` "grid" puts the
    referring set's shapes on the patch grid (`place_on_grid`), "free" anywhere."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        rng = random.Random(f"grounding-{seed}-{i}")
        if layout == "grid" and not detection:
            objects = place_on_grid(rng, rng.choice((2, 3)), size)
        elif detection:
            objects = place_objects(rng, rng.choice((3, 4)), size, size * 0.07, size * 0.11, distinct=False)
        else:
            objects = place_objects(rng, rng.choice((2, 3)), size, size * 0.09, size * 0.15)
        image, boxes = draw_scene(objects, size)
        name = f"{i:05d}.png"
        image.save(root / "images" / name)
        if detection:
            by = rng.choice(("colour", "shape"))
            value = objects[0][by]
            expression = f"{value} shape" if by == "colour" else value
            hits = [b for o, b in zip(objects, boxes, strict=True) if o[by] == value]
            rows.append({"image": f"images/{name}", "expression": expression, "boxes": hits,
                         "objects": objects, "image_hw": [size, size]})
        else:
            k = rng.randrange(len(objects))
            expression = f"the {objects[k]['colour']} {objects[k]['shape']}"
            rows.append({"image": f"images/{name}", "expression": expression, "answer": boxes[k],
                         "objects": objects, "image_hw": [size, size]})
    _write(root, rows)


def build_classification(root: Path, n: int, size: int, seed: int, colour_cue: bool = True,
                         classes: tuple[str, ...] = SHAPES) -> None:
    """One shape per image, balanced classes. ``colour_cue``: each class is always drawn in its own colour (circle
    red, square green, ...), a signal even a tiny vision tower picks up; without it the colour is random and only
    the outline tells the classes apart."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    palette = list(COLOURS)
    for i in range(n):
        rng = random.Random(f"classification-{seed}-{i}")
        k = i % len(classes)  # balanced classes
        label = classes[k]
        r = rng.uniform(size * 0.18, size * 0.35)
        colour = palette[k % len(palette)] if colour_cue else rng.choice(palette)
        obj = {"colour": colour, "shape": label, "r": round(r, 1),
               "cx": round(rng.uniform(r + 2, size - r - 2), 1), "cy": round(rng.uniform(r + 2, size - r - 2), 1)}
        image, _ = draw_scene([obj], size)
        name = f"{i:05d}.png"
        image.save(root / "images" / name)
        rows.append({"image": f"images/{name}", "label": label, "objects": [obj], "image_hw": [size, size]})
    _write(root, rows)


def _relation_question(rng: random.Random, objects: list[dict[str, Any]]) -> tuple[str, list[str], str, str]:
    a, b = objects[0], objects[1]
    name_a, name_b = f"the {a['colour']} {a['shape']}", f"the {b['colour']} {b['shape']}"
    if abs(a["cx"] - b["cx"]) >= abs(a["cy"] - b["cy"]):
        question = f"Is {name_a} to the left or to the right of {name_b}?"
        return question, ["left", "right"], "left" if a["cx"] < b["cx"] else "right", "relation"
    question = f"Is {name_a} above or below {name_b}?"
    return question, ["above", "below"], "above" if a["cy"] < b["cy"] else "below", "relation"


CHOICE_KINDS = ("position", "relation", "count")


def _position_question(rng: random.Random, size: int) -> tuple[list[dict[str, Any]], str, list[str], str]:
    """One shape clearly in one half of the image: "left or right half" / "top or bottom half"."""
    r = round(rng.uniform(size * 0.08, size * 0.15), 1)
    colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    near = round(rng.uniform(r + 2, size / 2 - 6), 1)  # the centre is at least 6 px from the middle line
    far = round(size - near, 1)
    other = round(rng.uniform(r + 2, size - r - 2), 1)
    first = rng.random() < 0.5
    name = f"the {colour} {shape}"
    if rng.random() < 0.5:
        obj = {"colour": colour, "shape": shape, "r": r, "cx": near if first else far, "cy": other}
        return [obj], f"Is {name} in the left or the right half of the image?", ["left", "right"], \
            "left" if first else "right"
    obj = {"colour": colour, "shape": shape, "r": r, "cx": other, "cy": near if first else far}
    return [obj], f"Is {name} in the top or the bottom half of the image?", ["top", "bottom"], \
        "top" if first else "bottom"


def build_visual_choice(root: Path, n: int, size: int, seed: int, kinds: tuple[str, ...] = CHOICE_KINDS,
                        shuffle_options: bool = False) -> None:
    """Questions cycle through ``kinds``: ``position`` (one shape: which half of the image; the easiest),
    ``relation`` (two shapes: left/right of or above/below each other; CV-Bench "Relation"), ``count`` (1-4 shapes;
    CV-Bench "Count"). Options keep a fixed order per kind unless ``shuffle_options``: then the letter is a direct
    function of the image; with shuffled options (as CV-Bench) a model must also read the option list, a binding a
    tiny model does not learn in CPU minutes."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        rng = random.Random(f"visual_choice-{seed}-{i}")
        kind = kinds[i % len(kinds)]
        if kind == "count":
            count = rng.choice((1, 2, 3, 4))
            objects = place_objects(rng, count, size, size * 0.08, size * 0.13)
            question, options, correct = "How many shapes are in the image?", ["1", "2", "3", "4"], str(count)
        elif kind == "relation":
            objects = place_objects(rng, 2, size, size * 0.09, size * 0.15)
            question, options, correct, _ = _relation_question(rng, objects)
        else:
            objects, question, options, correct = _position_question(rng, size)
        if shuffle_options:
            rng.shuffle(options)
        image, _ = draw_scene(objects, size)
        name = f"{i:05d}.png"
        image.save(root / "images" / name)
        rows.append({"image": f"images/{name}", "question": question, "options": options,
                     "answer": chr(65 + options.index(correct)), "answer_text": correct, "kind": kind,
                     "objects": objects, "image_hw": [size, size]})
    _write(root, rows)


LAYOUTS = ("grid", "free")


def synthetic_set(kind: str, n: int = 512, size: int = 112, seed: int = 0, colour_cue: bool = True,
                  choice_kinds: tuple[str, ...] = ("position",), shuffle_options: bool = False,
                  layout: str = "free") -> Path:
    """Directory of the bundled set ``kind`` (grounding | detection | classification | visual_choice), generated
    into the cache on first use. ``layout`` (grounding only): "grid" or "free" shape placement."""
    from mmrl.tasks.vision_data import build_cached

    if n < 1:
        raise UserError(f"task.n_samples must be >= 1, got {n}")
    if not 56 <= size <= 1024:
        raise UserError(f"task.image_size must be in [56, 1024], got {size}")
    if layout not in LAYOUTS:
        raise UserError(f"task.layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    builders = {"grounding": lambda r: build_grounding(r, n, size, seed, layout=layout),
                "detection": lambda r: build_grounding(r, n, size, seed, detection=True),
                "classification": lambda r: build_classification(r, n, size, seed, colour_cue),
                "visual_choice": lambda r: build_visual_choice(r, n, size, seed, choice_kinds, shuffle_options)}
    if kind not in builders:
        raise UserError(f"unknown synthetic set {kind!r}; choose one of {', '.join(builders)}")
    bad = [k for k in choice_kinds if k not in CHOICE_KINDS]
    if bad or not choice_kinds:
        raise UserError(f"task.kinds: unknown question kinds {bad}; use some of {', '.join(CHOICE_KINDS)}")
    variant = {"classification": "-cue" if colour_cue else "-nocue",
               "visual_choice": "-" + "+".join(choice_kinds) + ("-shuffled" if shuffle_options else ""),
               "grounding": "-grid" if layout == "grid" else ""}.get(kind, "")
    return build_cached(f"{kind}{variant}-{VERSION}-n{n}-s{size}-seed{seed}", builders[kind])


def reference_completion(sample: dict[str, Any]) -> str:
    """A correct ``<think>…</think><answer>…</answer>`` completion for a vision sample (grounding, detection,
    classification or choice), for supervised warm-starts and tokenizer corpora. Boxes are written in the sample's
    ``coord_frame`` when the vision layer has annotated it (rounded to integers, as Qwen-VL writes them), else in
    original pixels."""
    from mmrl.rewards.vision import frame_of
    from mmrl.vision.boxes import as_boxes, from_original

    if "boxes" in sample or isinstance(sample.get("answer"), list):
        boxes = sample.get("boxes", [sample.get("answer")])
        frame, original_hw, resized_hw = frame_of(sample)
        converted = from_original(as_boxes(boxes), frame, original_hw, resized_hw).round().int().tolist()
        answer = json.dumps(converted if "boxes" in sample else converted[0]).replace(" ", "")
        return f"<think>I look for {sample.get('problem', 'it')}.</think><answer>{answer}</answer>"
    if sample.get("options"):
        return f"<think>I compare the shapes.</think><answer>{sample['answer']}</answer>"
    return f"<think>I look at the shape.</think><answer>{sample['answer']}</answer>"


def corpus_lines(n_per_kind: int = 64, size: int = 112, seed: int = 0) -> list[str]:
    """Prompt texts and reference completions of the bundled vision sets (without drawing any image), for training
    a tokenizer that covers these tasks."""
    lines = []
    for i in range(n_per_kind):
        rng = random.Random(f"corpus-{seed}-{i}")
        objects = place_objects(rng, 3, size, size * 0.08, size * 0.12)
        _, boxes = zip(*[(o, [round(o["cx"] - o["r"]), round(o["cy"] - o["r"]), round(o["cx"] + o["r"]),
                              round(o["cy"] + o["r"])]) for o in objects], strict=True)
        name = f"the {objects[0]['colour']} {objects[0]['shape']}"
        lines.append(grounding_prompt(name))
        lines.append(reference_completion({"answer": list(boxes[0]), "problem": name}))
        lines.append(detection_prompt(objects[1]["shape"]))
        lines.append(reference_completion({"boxes": [list(b) for b in boxes[:2]], "problem": objects[1]["shape"]}))
        lines.append(classification_prompt(list(SHAPES)))
        lines.append(reference_completion({"answer": objects[2]["shape"]}))
        question, options, correct, _ = _relation_question(rng, objects)
        lines.append(choice_prompt(question, options))
        lines.append(reference_completion({"answer": chr(65 + options.index(correct)), "options": options}))
    lines.append(choice_prompt("How many shapes are in the image?", ["1", "2", "3", "4"]))
    return lines
