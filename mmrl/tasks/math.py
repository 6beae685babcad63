"""Math word problems with verifiable answers (MATH, DeepScaleR, Open-RS, ... in any local jsonl/parquet/csv file,
or a Hugging Face dataset id when online).

The prompt is the R1 template used by the papers (CW-GRPO's App. B): think in ``<think>``, answer in ``<answer>``.
Reward = math-verify accuracy + ``format_weight`` × a format term, chosen by ``format_reward``:

* ``think_answer``: the whole completion is ``<think>…</think><answer>…</answer>`` (R1 / R1-V);
* ``think_close``: the completion holds exactly one ``\\n</think>\\n`` (Open-RS, CW-GRPO's App. C), for models whose
  chat template pre-fills ``<think>`` (DeepSeek-R1-Distill).

``template`` places the problem in the user turn (``{problem}`` is replaced), for evaluation prompts such as
Open-RS's lighteval query.

``one_shot`` adds a solved example turn in the think/answer format before the problem; a real instruct model gets
it by default (``pretrained_options``, mmrl/tasks/prompts.py): a small one does not write the tags from the system
prompt alone.
"""

from __future__ import annotations

import logging
import math
import random
from decimal import Decimal
from typing import Any

from mmrl.errors import UserError
from mmrl.rewards.base import get_reward, weighted
from mmrl.rewards.text import plain_number
from mmrl.tasks.base import Task, register_task
from mmrl.tasks.prompts import chat
from mmrl.tasks.tables import check_sources, load_rows, row_place

R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning "
    "process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think> <answer> answer here </answer>."
)
FORMAT_REWARDS = {"think_answer": "think_answer_format", "think_close": "think_close_format"}
# The one-shot example (not drawn from the data: a file's first row may be any length or subject).
log = logging.getLogger("mmrl")
MATH_EXAMPLE = ("A shop sells pens at 3 dollars each. How much do 4 pens cost?",
                "<think>Each pen costs 3 dollars, so 4 pens cost 4 × 3 = 12 dollars.</think>\n<answer>12</answer>")


def is_answer_value(value: Any) -> bool:
    """A gold answer is text or a number as written. A list, an object, true/false, bytes or a NaN is not something
    the verifier could match, and str() would invent a gold answer ("[1, 2]", "True", "b'12'", "nan")."""
    if isinstance(value, (bool, list, tuple, dict, bytes, bytearray, memoryview)):
        return False
    if isinstance(value, Decimal):
        return value.is_finite()
    return not (isinstance(value, float) and not math.isfinite(value))


def to_samples(rows: list[dict[str, Any]], problem_key: str, answer_key: str, where: str,
               system_prompt: str | None, template: str = "{problem}",
               example: tuple[str, str] | None = None, field: str = "task.path") -> list[dict[str, Any]]:
    """Rows -> chat samples; a bad row fails naming ``field``, the option that named the file (a held-out file's
    rows are ``task.eval_path``'s, not the training file's)."""
    if rows and all(problem_key not in row for row in rows):
        raise UserError(f"task.problem_key: {where} has no column {problem_key!r} (columns: {sorted(rows[0])})")
    if rows and all(answer_key not in row for row in rows):
        raise UserError(f"task.answer_key: {where} has no column {answer_key!r} (columns: {sorted(rows[0])})")
    samples = []
    for i, row in enumerate(rows):
        at = f"{where} {row_place(rows, i)}"
        problem, answer = row.get(problem_key), row.get(answer_key)
        for key, value in ((problem_key, problem), (answer_key, answer)):
            if value is None or not str(value).strip():
                state = "has no" if value is None else "has an empty"
                raise UserError(f"{field}: {at} {state} {key!r}")
        if not isinstance(problem, str):
            raise UserError(f"{field}: {at} has a {problem_key!r} that is not text: {problem!r}")
        if not is_answer_value(answer):
            raise UserError(f"{field}: {at} has an {answer_key!r} that is not text or a number: "
                             f"{answer!r}")
        samples.append({"messages": chat(template.replace("{problem}", problem), system_prompt or "", example),
                        "answer": str(answer), "problem": problem, "prompt_text": problem, "origin": at})
    warn_e_notation(samples, where, field)
    return samples


def warn_e_notation(samples: list[dict[str, Any]], where: str, field: str = "task.path") -> None:
    """One warning per data file whose gold answers write numbers in e-notation: they are scored as the numbers
    they write (mmrl.rewards.text.plain_number), which math-verify alone would not do (it reads 1e3 as 3·e)."""
    written = [s for s in samples if plain_number(s["answer"]) != s["answer"]]
    if written:
        first = written[0]
        log.warning("%s: %s has %d gold answer(s) in e-notation (first: %r at %s); each is scored as the "
                    "number it writes (%s), not as a product with Euler's number e", field, where, len(written),
                    first["answer"], first["origin"].removeprefix(f"{where} "), plain_number(first["answer"]))


@register_task("math", pretrained_options={"one_shot": True})
def math_task(path: str = "", eval_path: str = "", problem_key: str = "problem", answer_key: str = "answer",
              eval_fraction: float = 0.1, format_weight: float = 0.5, system_prompt: str = R1_SYSTEM_PROMPT,
              max_samples: int = 0, seed: int = 0, format_reward: str = "think_answer",
              template: str = "{problem}", split: str = "train", one_shot: bool = False) -> Task:
    """``split``: the split of a hub ``path`` (AIME24's hub copy has only "train", MATH-500's only "test");
    ``eval_path`` is read from its "test" split."""
    if not path:
        raise UserError("task.path: the math task needs a data file (jsonl/parquet/csv) or a hub dataset id")
    if not 0 <= eval_fraction < 1:
        raise UserError(f"task.eval_fraction must be in [0, 1), got {eval_fraction}")
    if format_reward not in FORMAT_REWARDS:
        raise UserError(f"task.format_reward must be one of {', '.join(FORMAT_REWARDS)}, got {format_reward!r}")
    if "{problem}" not in template:
        raise UserError(f"task.template must contain {{problem}}, got {template!r}")
    check_sources(path, eval_path, max_samples)
    rows = load_rows(path, split)
    if not rows:
        raise UserError(f"task.path: {path} has no rows")
    if max_samples:
        rows = rows[:max_samples]
    example = MATH_EXAMPLE if one_shot else None
    train = to_samples(rows, problem_key, answer_key, path, system_prompt or None, template, example)
    if eval_path:
        held_out = load_rows(eval_path, "test", "task.eval_path")
        if not held_out:  # as an empty training file is: a run would report an evaluation of nothing
            raise UserError(f"task.eval_path: {eval_path} has no rows")
        evals = to_samples(held_out, problem_key, answer_key, eval_path, system_prompt or None, template, example,
                           "task.eval_path")
    elif eval_fraction:  # hold out a seeded random eval_fraction (files are often sorted by source or difficulty)
        random.Random(seed).shuffle(train)
        n_eval = int(len(train) * eval_fraction)
        train, evals = train[n_eval:], train[:n_eval]
    else:  # every row trains (or, for an evaluation set, is a problem), in the file's order
        evals = []
    format_key = FORMAT_REWARDS[format_reward]
    parts = [(get_reward("math_accuracy"), 1.0), (get_reward(format_key), format_weight)]
    return Task("math", train=train, eval=evals, reward=weighted(parts, "math"), accuracy_key="math_accuracy",
                format_key=format_key,
                description=f"{len(train)} train / {len(evals)} eval problems from {path}")
