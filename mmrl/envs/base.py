"""The environment contract: two async methods, text in and text out. No trainer is imported here or by any env.

An episode is ``reset`` then ``step`` until ``done``. The agent is a language model; what it emits is passed to
``step`` *verbatim* (reasoning included): the env parses its own action format and scores malformed output itself, so
every trainer (mmrl's, OpenRLHF's agent executor, TRL, a gymnasium loop) gets the same rewards for the same text.

Observations are *incremental*: ``reset`` returns the first prompt text of the episode (task, first observation,
admissible actions) and each ``step`` returns the feedback text for the action just taken (next observation,
admissible actions, step count). A multi-turn trainer appends them as user turns after the model's turns, so one
episode is one growing sequence whose env tokens are masked out of the loss (the OpenRLHF multi-turn layout).

Rules every env keeps:
- ``step`` never raises for bad model output: it returns a penalty and a reason in ``info``.
- An env that breaks (engine crash, timeout) raises :class:`EnvError`; whoever drives it ends that episode as
  failed and keeps the run going.
- ``info`` carries at least ``won`` (bool) once ``done``; envs with task families add ``task_type``. An env may add
  ``anchor``: the state the next action is taken in, as text without history or instructions (GiGPO groups the
  turns of a group by it; the observation text stands in when absent).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any


class EnvError(RuntimeError):
    """The environment itself failed (not the agent): the episode ends, marked failed; the run goes on."""


@dataclasses.dataclass
class StepResult:
    observation: str  # feedback text for the action just taken
    reward: float  # reward of this step (the episode return is the sum)
    done: bool  # the episode is over (won, lost, or the step limit)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class TextEnv(abc.ABC):
    """A text environment for language-model agents. Subclasses implement ``reset`` and ``step``."""

    @abc.abstractmethod
    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; returns the first observation text and an info dict. Same seed and options → same start."""

    @abc.abstractmethod
    async def step(self, action_text: str) -> StepResult:
        """Apply the model's raw output ``action_text``: the feedback, the step reward and whether it is over."""

    async def close(self) -> None:  # noqa: B027 - optional hook: most envs hold nothing to release
        """Release engine resources. Safe to call twice."""
