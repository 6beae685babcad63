"""The task contract: prompts, a reward, and which reward components are "accuracy" and "format".

A sample is a plain dict with at least ``messages`` (a chat, list of {"role", "content"}) and ``answer``; tasks may add
more keys (the reward functions read them). A sample read from a user's file carries ``origin``, where the file wrote it
(``"data.jsonl line 7"``), which errors about the sample name. Tasks know nothing about trainers or models.

Two kinds, told apart by the class attribute ``multi_turn`` (so the trainer needs no import of any env):
* :class:`Task` (single turn): rows of prompts and a reward on the completion text.
* :class:`EnvTask` (multi-turn): rows of env starts (e.g. a game file) and ``make_env(row)`` building a fresh
  :class:`mmrl.envs.base.TextEnv` for one episode (``env_class(**env_kwargs(row))``, a form an env pool can rebuild
  in its worker processes); the env gives the rewards.

A task may register recommended config values (``register_task(name, config_defaults={...})``, e.g. a longer turn
budget or its own embedded model); they sit between the built-in defaults and the user's YAML and flags.

A task may also register ``pretrained_options``: option values for a real pretrained model (a chat a real instruct
model follows, mmrl/tasks/prompts.py), while its defaults stay what the embedded models were pre-trained on.
:func:`options_for_model` applies them under the user's own options when the model is not embedded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from mmrl.errors import UserError
from mmrl.rewards.base import Reward
from mmrl.values import as_default_type, exact_scalar

TASKS: dict[str, Callable[..., Task | EnvTask]] = {}
TASK_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {}  # task name -> {"section.field": value}
TASK_PRETRAINED_OPTIONS: dict[str, dict[str, Any]] = {}  # task name -> {option: value} for non-embedded models


def register_task(name: str, config_defaults: dict[str, Any] | None = None,
                  pretrained_options: dict[str, Any] | None = None):
    def wrap(factory: Callable[..., Task | EnvTask]) -> Callable[..., Task | EnvTask]:
        if name in TASKS:
            raise UserError(f"task {name!r} is registered twice")
        TASKS[name] = factory
        if config_defaults:
            TASK_CONFIG_DEFAULTS[name] = dict(config_defaults)
        if pretrained_options:
            TASK_PRETRAINED_OPTIONS[name] = dict(pretrained_options)
        return factory

    return wrap


def sample_place(sample: dict[str, Any], split: str, index: int) -> str:
    """``"train row 3: data.jsonl line 7"``: the sample's index in its split and, when it has one, its ``origin``
    (a split is often shuffled, so the index alone does not find the row in the file)."""
    origin = sample.get("origin")
    return f"{split} row {index}: {origin}" if origin else f"{split} row {index}"


def options_for_model(name: str, options: dict[str, Any], embedded: bool) -> dict[str, Any]:
    """Task ``name``'s options for a model: the user's ``options`` over the task's ``pretrained_options`` when the
    model is not one of the embedded models (those keep the task defaults they were pre-trained on)."""
    if embedded:
        return dict(options)
    return {**TASK_PRETRAINED_OPTIONS.get(name, {}), **options}


class GeneratedRows(Sequence):
    """An endless training split made by code: row ``i`` is ``make_row(i)``, built when asked for and the same every
    time. Its length is nominal (2**62); the local trainer draws row numbers at random from it every step (fresh
    problems, no epochs), and checks that need every row read only a prefix (:data:`CHECKED_PREFIX` rows)."""

    SIZE = 2**62
    CHECKED_PREFIX = 64

    def __init__(self, make_row: Callable[[int], dict[str, Any]]):
        self.make_row = make_row

    def __len__(self) -> int:
        return self.SIZE

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self.SIZE)
            if (stop - start) // step > 1_000_000:
                raise ValueError(f"a slice of {(stop - start) // step} generated rows; take a shorter prefix")
            return [self.make_row(i) for i in range(start, stop, step)]
        if not -self.SIZE <= index < self.SIZE:
            raise IndexError(f"row {index} of a generated split of {self.SIZE} rows")
        return self.make_row(index % self.SIZE)


def checked_rows(rows: Sequence[dict[str, Any]], limit: int) -> Sequence[dict[str, Any]]:
    """The rows a start-up check reads: the first ``limit``, or a generated split's first few."""
    if isinstance(rows, GeneratedRows):
        limit = min(limit, GeneratedRows.CHECKED_PREFIX)
    return rows[:limit]


@dataclasses.dataclass
class Task:
    """A single-turn task: prompts and the reward that scores their completions.

    Args:
        name: the registry name (``--task``).
        train, eval: rows (``train`` may be endless: :class:`GeneratedRows`); each a dict with ``messages`` (the
            chat prompt; image items in the qwen-vl-utils layout
            for tasks with images) and whatever the reward reads (``answer``, boxes, options, ...). ``eval`` is the
            held-out split, never trained on.
        reward: the :class:`mmrl.rewards.Reward` of a completion given its row.
        accuracy_key, format_key: the reward components reported as "accuracy" and "format rate".
        description: one line for ``--help``.
        metrics: optional ``(completions, samples) -> {name: value}`` added to an evaluation (mIoU, ...).
    """

    multi_turn: ClassVar[bool] = False
    name: str
    train: Sequence[dict[str, Any]]
    eval: list[dict[str, Any]]
    reward: Reward
    accuracy_key: str = "math_accuracy"  # reward component reported as "accuracy"
    format_key: str | None = None  # reward component reported as "format rate"
    description: str = ""
    # Optional extra evaluation metrics: ``metrics(completions, samples) -> {name: value}`` over all scored responses
    # (mIoU for grounding, ...); `mmrl.trainer.evaluate.evaluate` adds them to its result.
    metrics: Callable[[list[str], list[dict[str, Any]]], dict[str, float]] | None = None

    def __post_init__(self) -> None:
        if not self.train:
            raise UserError(f"task {self.name!r}: the training split is empty")
        for split, rows in (("train", self.train), ("eval", self.eval)):
            for i, row in enumerate(checked_rows(rows, len(rows))):
                if not row.get("messages"):
                    raise UserError(f"task {self.name!r}: {split} row {i} has no prompt")


@dataclasses.dataclass
class EnvTask:
    """A multi-turn task: each row is one env start; ``make_env(row)`` returns a fresh ``TextEnv`` for one episode.

    ``env_class`` is a picklable (module-level) TextEnv class or function and ``env_kwargs(row)`` its keyword
    arguments, so that an :class:`mmrl.envs.pool.EnvPool` can build the same env in a worker process.

    A group is n episodes of the same row and reset seed (identical starts). ``expert(row, seed)``, when the task has
    demonstrations, returns a fresh scripted player for one episode: a function from the env's (observation, info)
    after reset and after every step to the turn text it emits (the SFT warm-up plays it through the real env, so a
    demonstration is rendered exactly as a rollout; ``seed`` varies the player between demonstrations of one row).
    ``accuracy_key``/``format_key`` name the episode reward components reported as success rate and format rate.
    """

    multi_turn: ClassVar[bool] = True
    name: str
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    env_class: Callable[..., Any]  # (**env_kwargs(row)) -> mmrl.envs.base.TextEnv
    env_kwargs: Callable[[dict[str, Any]], dict[str, Any]]
    expert: Callable[[dict[str, Any], int], Callable[[str, dict[str, Any]], str]] | None = None
    system_prompt: str | None = None
    accuracy_key: str = "success"
    format_key: str | None = "format"
    description: str = ""
    # Env keyword arguments (over ``env_kwargs(row)``) under which every observation is a self-contained prompt:
    # the task, the last turns and the current state (verl-agent's prompt), for ``rollout.agent_layout turn``, where
    # every env step is its own training sample. None: the env has no such mode, the turn layout is refused.
    turn_env_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.train:
            raise UserError(f"task {self.name!r}: the training split is empty")

    def kwargs_for(self, row: dict[str, Any], layout: str = "episode") -> dict[str, Any]:
        """The env's keyword arguments for ``row`` in agent ``layout`` (``episode`` or ``turn``)."""
        if layout == "turn":
            if self.turn_env_kwargs is None:
                raise UserError(f"task {self.name!r}: its env has no self-contained per-turn prompt; "
                                 f"rollout.agent_layout turn is not available")
            return {**self.env_kwargs(row), **self.turn_env_kwargs}
        return self.env_kwargs(row)

    def make_env(self, row: dict[str, Any], layout: str = "episode") -> Any:
        return self.env_class(**self.kwargs_for(row, layout))


def get_task(name: str, **options: Any) -> Task | EnvTask:
    """Build task ``name``; ``options`` are its documented keyword arguments (unknown ones raise ValueError)."""
    checked = checked_options(name, options)  # first: an unknown name is one line, not a KeyError
    return TASKS[name](**checked)


def checked_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Task ``name``'s ``options`` as the types of their defaults; an unknown task or option is one line. Reads no
    data, so ``--print-config`` can check them without building the task."""
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; choose one of: {', '.join(sorted(TASKS))}")
    defaults = option_defaults(name)
    checked = {}
    for key, value in options.items():
        if key not in defaults:
            raise UserError(f"task {name!r} has no option {key!r}; it has: {', '.join(sorted(defaults))}")
        checked[key] = typed_option(f"task.{key}", value, defaults[key])
    return checked


def option_defaults(name: str) -> dict[str, Any]:
    """``{option: default}`` of registered task ``name`` (its factory's keyword arguments)."""
    import inspect

    return {k: p.default for k, p in inspect.signature(TASKS[name]).parameters.items()}


def typed_option(where: str, value: Any, default: Any) -> Any:
    """A task option as the type of its default. Text from the command line is read only where the option is a
    number or a flag, so a text option keeps exactly what was written ("007" stays "007", "yes" stays "yes"); a YAML
    value of the wrong kind (an unquoted number for a text option) is refused rather than re-written."""
    return as_default_type(where, value, default, exact_scalar)


