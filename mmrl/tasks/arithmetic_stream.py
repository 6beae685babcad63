"""Arithmetic drawn fresh every step: an unbounded training stream and a fixed held-out set disjoint from it.

A problem is ``terms`` operands in ``[0, max_operand]`` joined by operators from ``ops`` (``12+7``; with
``terms=3``, two-step problems such as ``12+7*3``, usual precedence). The problem space is split once, by a hash of
each problem, into a held-out part (``eval_fraction`` of it) and a training part. The held-out split is
``eval_size`` problems of the held-out part (all of it when it is smaller), fixed by ``seed``; training row ``i`` is
drawn from the training part by a generator seeded with (``seed``, ``i``), so the same row is the same problem in
every process and after a resume. The training split is endless (:class:`mmrl.tasks.base.GeneratedRows`): the
trainer draws fresh row numbers every step, so a run sees new problems rather than epochs over a few
(``train_size`` > 0 keeps a fixed list instead, which the openrlhf backend needs since it reads a file).

The hash reads a problem whose operators are all ``+`` or all ``*`` with its operands sorted, so ``7+12`` and
``12+7`` fall on the same side: a held-out sum is not trained on under another order.

Reward and prompt are the ``arithmetic`` task's: math-verify accuracy plus ``format_weight`` × the answer-tag format
(see mmrl/tasks/arithmetic.py for why the format term is on); the two parts are logged apart (``accuracy``,
``format_rate``) in training and evaluation alike.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any

from mmrl.errors import UserError
from mmrl.rewards.base import get_reward, weighted
from mmrl.tasks.arithmetic import INSTRUCT_SYSTEM_PROMPT, OPS
from mmrl.tasks.base import GeneratedRows, Task, register_task
from mmrl.tasks.prompts import chat, worked_answer

Problem = tuple[tuple[int, ...], tuple[str, ...]]  # operands, operators between them
MAX_LISTED = 200_000  # problem spaces up to this size are listed to pick the held-out set, larger ones sampled


def expression(problem: Problem) -> str:
    operands, ops = problem
    out = str(operands[0])
    for op, n in zip(ops, operands[1:], strict=True):
        out += f"{op}{n}"
    return out


def value(problem: Problem) -> int:
    """The problem's value with the usual precedence (``*`` before ``+`` and ``-``)."""
    operands, ops = problem
    sums = [operands[0]]  # signed products, added up at the end
    for op, n in zip(ops, operands[1:], strict=True):
        if op == "*":
            sums[-1] *= n
        else:
            sums.append(n if op == "+" else -n)
    return sum(sums)


def held_out(problem: Problem, eval_fraction: float) -> bool:
    """Whether ``problem`` is in the held-out part of the space: a hash of its canonical form (operands sorted when
    every operator is ``+`` or every one is ``*``) below ``eval_fraction``. Fixed: it depends on nothing else."""
    operands, ops = problem
    if len(set(ops)) == 1 and ops[0] in "+*":
        operands = tuple(sorted(operands))
    key = expression((operands, ops)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64 < eval_fraction


def prompt(text: str) -> str:
    return f"Compute {text}. Answer in <answer></answer> tags."  # the arithmetic task's wording


def draw(rng: random.Random, max_operand: int, ops: str, terms: int) -> Problem:
    return (tuple(rng.randint(0, max_operand) for _ in range(terms)), tuple(rng.choice(ops) for _ in range(terms - 1)))


def draw_from(rng: random.Random, max_operand: int, ops: str, terms: int, eval_fraction: float,
              want_held_out: bool) -> Problem:
    """A problem of one part of the split (rejection sampling: each part holds a fixed share of the space)."""
    for _ in range(10_000):
        problem = draw(rng, max_operand, ops, terms)
        if held_out(problem, eval_fraction) == want_held_out:
            return problem
    raise UserError(f"task.eval_fraction {eval_fraction}: no {'held-out' if want_held_out else 'training'} problem "
                     f"found in 10000 draws; choose a fraction further from 0 and 1")


def held_out_problems(max_operand: int, ops: str, terms: int, eval_fraction: float, eval_size: int,
                      seed: int) -> list[Problem]:
    """At most ``eval_size`` distinct problems of the held-out part, fixed by ``seed``: a shuffled sample of the whole
    part when the space is small enough to list (fewer when the part is smaller), else drawn by rejection."""
    rng = random.Random(f"arithmetic_stream held-out {seed}")
    space = (max_operand + 1) ** terms * len(ops) ** (terms - 1)
    if space <= MAX_LISTED:
        part = [(operands, chosen) for operands in itertools.product(range(max_operand + 1), repeat=terms)
                for chosen in itertools.product(ops, repeat=terms - 1) if held_out((operands, chosen), eval_fraction)]
        rng.shuffle(part)
        return part[:eval_size]
    found: dict[Problem, None] = {}
    while len(found) < eval_size:  # a space this large holds far more held-out problems than any eval_size
        found[draw_from(rng, max_operand, ops, terms, eval_fraction, True)] = None
    return list(found)


@register_task("arithmetic_stream", pretrained_options={"system_prompt": INSTRUCT_SYSTEM_PROMPT, "one_shot": True})
def arithmetic_stream_task(max_operand: int = 9, ops: str = "+", terms: int = 2, eval_fraction: float = 0.2,
                           eval_size: int = 100, train_size: int = 0, seed: int = 0, format_weight: float = 0.5,
                           system_prompt: str = "", one_shot: bool = False) -> Task:
    if max_operand < 1:
        raise UserError(f"task.max_operand must be >= 1, got {max_operand}")
    if not ops or any(op not in OPS for op in ops):
        raise UserError(f"task.ops must be made of {''.join(OPS)}, got {ops!r}")
    if not 2 <= terms <= 4:
        raise UserError(f"task.terms must be between 2 and 4, got {terms}")
    if not 0 < eval_fraction < 1:
        raise UserError(f"task.eval_fraction must be in (0, 1), got {eval_fraction}")
    if eval_size < 1:
        raise UserError(f"task.eval_size must be >= 1, got {eval_size}")
    if train_size < 0:
        raise UserError(f"task.train_size must be >= 0 (0: a fresh problem every draw), got {train_size}")
    ops = "".join(dict.fromkeys(ops))  # a repeated operator would only weigh the draw

    def training_problem(index: int) -> Problem:
        rng = random.Random(f"arithmetic_stream train {seed} {index}")
        return draw_from(rng, max_operand, ops, terms, eval_fraction, False)

    first = training_problem(0)  # the one-shot example
    example = (prompt(expression(first)),
               worked_answer(f"{expression(first)} = {value(first)}", str(value(first)))) if one_shot else None

    def row(problem: Problem) -> dict[str, Any]:
        text = expression(problem)
        return {"messages": chat(prompt(text), system_prompt, example),
                "answer": str(value(problem)), "problem": text}

    train: GeneratedRows | list[dict[str, Any]] = GeneratedRows(lambda i: row(training_problem(i)))
    if train_size:
        train = list(train[:train_size])
    evaluation = [row(p) for p in held_out_problems(max_operand, ops, terms, eval_fraction, eval_size, seed)]
    parts = [(get_reward("math_accuracy"), 1.0), (get_reward("answer_format"), format_weight)]
    supply = f"{train_size} training problems" if train_size else "a fresh training problem every draw"
    return Task("arithmetic_stream", train=train, eval=evaluation, reward=weighted(parts, "arithmetic_stream"),
                accuracy_key="math_accuracy", format_key="answer_format",
                description=f"{terms}-term problems over {ops}, operands 0..{max_operand}: {supply}; {len(evaluation)} "
                            f"held-out problems from a disjoint {eval_fraction:g} of the space")
