"""GeoQA in the R1-V layout: a geometry diagram, a question, a numeric (or choice) answer; think, then answer.

With no ``path`` the bundled synthetic set is used (`mmrl.tasks.geo_synthetic`: triangle-angle and ruler-segment
diagrams drawn by code). With ``path``: a jsonl/json/parquet/csv file (image paths relative to it, raw bytes, or HF
image dicts) or a hub id such as ``leonardPKU/GEOQA_R1V_Train_8K`` (columns ``image``, ``problem``, ``solution`` with
the answer in ``<answer>`` tags, read as the answer). The prompt is R1-V's: the question followed by
"Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags."

Reward = ``geoqa_accuracy`` (math-verify with exact-match fallback, units dropped; `mmrl.rewards.geometry`) +
``format_weight`` × ``think_answer_format`` (R1-V adds both with weight 1).
"""

from __future__ import annotations

import re
from typing import Any

from mmrl.errors import UserError
from mmrl.rewards.base import get_reward, weighted
from mmrl.rewards.geometry import strip_units
from mmrl.tasks.base import Task, register_task
from mmrl.tasks.geo_synthetic import geo_set
from mmrl.tasks.math import is_answer_value
from mmrl.tasks.tables import row_place
from mmrl.tasks.vision_data import (
    IMAGE_TASK_DEFAULTS,
    ImageRoot,
    image_value,
    load_splits,
    load_table,
    refuse_file_options,
    require_column,
    split_rows,
    strip_answer_tags,
)

R1V_TEMPLATE = "{problem} Output the thinking process in <think> </think> and final answer (number) in " \
               "<answer> </answer> tags."


def image_list(cell: Any, base: ImageRoot, where: str) -> list[str | bytes]:
    """One or several images of a row (a list column such as Geometry3K's ``images``), each checked to open."""
    cell = cell.tolist() if hasattr(cell, "tolist") and not isinstance(cell, (bytes, str)) else cell
    cells = cell if isinstance(cell, list) else [cell]
    if not cells:
        raise UserError(f"{where}: empty image list")
    return [image_value(c, base, f"{where} image {i}") for i, c in enumerate(cells)]


def multi_image_messages(images: list[Any], text: str, system_prompt: str | None = None,
                         placeholder: str = "<image>") -> list[dict[str, Any]]:
    """A user turn with every image and the text: ``<image>`` markers in the text (Geometry3K, LLaVA style) place
    the images inline; without markers all images come first (the R1-V / Qwen convention)."""
    content: list[dict[str, Any]] = []
    if placeholder in text:
        parts = text.split(placeholder)
        if len(parts) - 1 != len(images):
            raise UserError(f"{len(parts) - 1} {placeholder} markers for {len(images)} images")
        for i, part in enumerate(parts):
            if part.strip():
                content.append({"type": "text", "text": part.strip()})
            if i < len(images):
                content.append({"type": "image", "image": images[i]})
    else:
        content = [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": text}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": content}]


def check_answer(cell: Any, answer: Any, where: str, answer_key: str) -> None:
    """A gold answer the reward can score: text or a number (:func:`is_answer_value`), with a value once units and
    degree marks are dropped (``geoqa_accuracy`` scores every completion 0 against "cm" or "°"). An R1-V
    ``solution`` holds the answer in ``<answer>`` tags: without them the whole worked solution would be the gold."""
    if answer is None or not str(answer).strip():
        raise UserError(f"{where}: empty answer")
    if not is_answer_value(answer):
        raise UserError(f"{where}: answer {str(answer)[:60]!r} is not text or a number")
    if answer_key == "solution" and isinstance(cell, str) and not re.search("<answer>.*?</answer>", cell, re.DOTALL):
        raise UserError(f"{where}: the solution has no <answer>…</answer> tag holding the answer")
    if not strip_units(str(answer)):
        raise UserError(f"{where}: answer {str(answer)[:60]!r} is only units; the reward drops units and would "
                         "have no answer to compare")


def geometry_rows(rows: list[dict[str, Any]], base: ImageRoot, where: str, *, image_key: str, problem_key: str,
                  answer_key: str, template: str, system_prompt: str | None) -> list[dict[str, Any]]:
    """Table rows -> vision samples; a bad row fails here, at start, naming the row and column."""
    for key, option in ((image_key, "image_key"), (problem_key, "problem_key"), (answer_key, "answer_key")):
        require_column(rows, key, option, where)
    samples = []
    for i, row in enumerate(rows):
        at = f"{where} {row_place(rows, i)}"
        images = image_list(row.get(image_key), base, f"{at} column {image_key!r}")
        problem, answer = row.get(problem_key), strip_answer_tags(row.get(answer_key))
        if problem is not None and not isinstance(problem, str):
            raise UserError(f"{at} column {problem_key!r}: problem {str(problem)[:60]!r} is not text")
        if not problem or not problem.strip():
            raise UserError(f"{at} column {problem_key!r}: empty problem")
        check_answer(row.get(answer_key), answer, f"{at} column {answer_key!r}", answer_key)
        text = template.replace("{problem}", problem.strip())
        try:
            messages = multi_image_messages(images, text, system_prompt)
        except ValueError as exc:
            raise UserError(f"{at}: {exc}") from exc
        problem = problem.replace("<image>", "").strip()
        sample = {"messages": messages, "answer": str(answer).strip(), "problem": problem}
        sample.update({k: row[k] for k in ("kind", "solution") if k in row})  # bundled set: problem kind, chain
        sample["origin"] = at
        samples.append(sample)
    return samples


def load_geometry(path: str, eval_path: str, *, eval_fraction: float, max_samples: int, seed: int, n_samples: int,
                  layout: str, options: dict[str, Any], allow_outside_images: bool = False) -> tuple[list, list, str]:
    """(train, eval, description of the source) for a geometry task; the bundled set when ``path`` is empty."""
    if path:
        def samples(rows, base, source):
            if not options["answer_key"]:  # settled by the training rows (built first), kept for eval
                # any row, not the first: a first row without its answer is then named as such
                options["answer_key"] = "answer" if any("answer" in row for row in rows) else "solution"
            return geometry_rows(rows, base, source, **options)

        train, evals = load_splits(path, eval_path, samples, max_samples=max_samples, eval_fraction=eval_fraction,
                                   seed=seed, allow_outside_images=allow_outside_images)
        return train, evals, path
    root = geo_set(n_samples, seed)
    rows, images = load_table(str(root / "rows.jsonl"), "train")
    if layout == "geometry3k":  # the same diagrams in the Geometry3K layout: an images list and an <image> marker
        rows = [{**r, "image": [r["image"]], "problem": "<image>" + r["problem"]} for r in rows]
    options = {**options, "image_key": "image", "problem_key": "problem", "answer_key": "answer"}
    train, evals = split_rows(geometry_rows(rows, images, "bundled geometry set", **options), eval_fraction, seed)
    return train, evals, f"the bundled synthetic geometry set ({n_samples} diagrams: ruler segments, grid rectangles)"


# The headline command (``python -m mmrl.train --algo gpg --task geoqa``) is the demo's run: 40 steps, held-out
# pass@1 at step 0, 20 and 40 (docs/vision.md, "What the CPU demo shows").
GEOQA_DEFAULTS = {**IMAGE_TASK_DEFAULTS, "run.steps": 40, "run.eval_every": 20}
# The options that read a task.path file (refused without one: the bundled set has its own columns and split).
FILE_OPTIONS = ("eval_path", "image_key", "problem_key", "answer_key", "max_samples")


def geometry_task(factory, given: dict[str, Any], format_reward: str) -> Task:
    """The task a geometry factory (``geoqa``, ``geometry3k``) names, from its arguments ``given``: the same loading,
    checks and reward for both, which differ only in their layout, template and format reward."""
    name = factory.__name__.removesuffix("_task")
    if given["n_samples"] < 10:
        raise UserError(f"task.n_samples must be >= 10, got {given['n_samples']}")
    if not given["path"]:
        refuse_file_options(factory, given, FILE_OPTIONS)
    options = {key: given[key] for key in ("image_key", "problem_key", "answer_key", "template")}
    options["system_prompt"] = given["system_prompt"] or None
    train, evals, source = load_geometry(given["path"], given["eval_path"], eval_fraction=given["eval_fraction"],
                                         max_samples=given["max_samples"], seed=given["seed"],
                                         n_samples=given["n_samples"], layout=name, options=options,
                                         allow_outside_images=given["allow_outside_images"])
    parts = [(get_reward("geoqa_accuracy"), 1.0), (get_reward(format_reward), given["format_weight"])]
    return Task(name, train=train, eval=evals, reward=weighted(parts, name), accuracy_key="geoqa_accuracy",
                format_key=format_reward, description=f"{len(train)} train / {len(evals)} eval problems from {source}")


@register_task("geoqa", config_defaults=GEOQA_DEFAULTS)
def geoqa_task(path: str = "", eval_path: str = "", image_key: str = "image", problem_key: str = "problem",
               answer_key: str = "", template: str = R1V_TEMPLATE, format_weight: float = 1.0, system_prompt: str = "",
               eval_fraction: float = 0.1, max_samples: int = 0, n_samples: int = 2200, seed: int = 0,
               allow_outside_images: bool = False) -> Task:
    return geometry_task(geoqa_task, locals(), "think_answer_format")
