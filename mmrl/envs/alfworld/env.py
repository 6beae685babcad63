"""``AlfWorldEnv``: an ALFWorld game as a :class:`~mmrl.envs.base.TextEnv`, with verl-agent's conventions.

Episode rules (verl-agent / GiGPO ALFWorld setup; the GMPO paper's App. D uses the same):
- the model writes ``<think>...</think><action>command</action>``; the command is matched exactly against the
  engine's admissible commands (after lower-casing and collapsing spaces, see :mod:`mmrl.envs.actions`);
- the reward of a step is ``success_reward`` (10) on the step that wins the game, minus ``invalid_action_penalty``
  (0.1) when the output's format is invalid; nothing else is shaped. verl-agent's env pays only the 10 and its
  trainer subtracts the penalty from the malformed step's row after the returns are summed: ``info["penalty"]`` lets
  a trainer do the same (``algo.penalty_scope step``);
- a format-invalid step still goes to the engine (with the raw text when there is no ``<action>`` block): it costs a
  step and the engine answers "Nothing happens." unless the text happens to be an admissible command;
- the episode ends on a win or after ``max_steps`` (50) steps;
- the engine is deterministic: the same game gives the same first observation whatever the seed, so every member of a
  GRPO group that resets the same game starts identically. ``seed`` is accepted for the contract and echoed in info.

``info`` of every reset/step: ``won``, ``task_type``, ``task``, ``admissible_actions`` (the commands now admissible),
``action_valid`` (the command was admissible), ``format_ok``, ``reason`` (why the format is bad, else ""),
``action`` (the command sent to the engine), ``feedback`` (the engine's own text for it, no prompt around it),
``step``, ``gamefile``, ``anchor`` (the engine's text of the state now, as verl-agent's ``anchor_obs``: GiGPO's
step-level groups), ``penalty`` (the invalid-action penalty this step's reward includes, 0 or
``invalid_action_penalty``); once done also ``truncated`` (step limit hit).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from mmrl.envs.actions import parse_action
from mmrl.envs.alfworld import prompts
from mmrl.envs.alfworld.engine import Engine
from mmrl.envs.base import EnvError, StepResult, TextEnv
from mmrl.errors import UserError

OBSERVATION_MODES = ("incremental", "window")
# TextWorld's grammar parser is not thread-safe: in a process, one engine call runs at a time. Each runs in a worker
# thread, so that a game's load (0.2-3.5 s) does not stall the event loop, and the other coroutines (model calls,
# envs in an EnvPool's worker processes, which load games side by side) go on meanwhile.
_ENGINE_LOCK = threading.Lock()
T = TypeVar("T")


async def _engine_call(call: Callable[[], T]) -> T:
    def locked() -> T:
        with _ENGINE_LOCK:
            return call()

    return await asyncio.to_thread(locked)


def read_game_meta(game_path: str | Path) -> dict[str, Any]:
    """task_type (from traj_data.json beside the game) and the walkthrough (from the game file), if present."""
    game_path = Path(game_path)
    if not game_path.is_file():
        raise EnvError(f"ALFWorld game file not found: {game_path}")
    meta: dict[str, Any] = {"task_type": "", "walkthrough": None}
    traj = game_path.parent / "traj_data.json"
    try:
        if traj.is_file():
            meta["task_type"] = json.loads(traj.read_text())["task_type"]
        meta["walkthrough"] = json.loads(game_path.read_text()).get("walkthrough")
    except (OSError, ValueError, KeyError) as err:
        raise EnvError(f"unreadable ALFWorld game {game_path}: {type(err).__name__}: {err}") from err
    return meta


class AlfWorldEnv(TextEnv):
    def __init__(self, game_path: str | Path, max_steps: int = 50, history_length: int = 2,
                 invalid_action_penalty: float = 0.1, *, success_reward: float = 10.0,
                 observation_mode: str = "incremental", require_think: bool = True, template_cache: bool = True):
        for name, value, least in (("max_steps", max_steps, 1), ("history_length", history_length, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UserError(f"{name} must be an integer >= {least}, got {value!r}")
        # a penalty is subtracted: a negative one would pay for malformed actions, a NaN one make every reward NaN
        for name, value, least in (("invalid_action_penalty", invalid_action_penalty, 0.0),
                                   ("success_reward", success_reward, -math.inf)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not least <= value < math.inf:
                raise UserError(f"{name} must be a finite number{' >= 0' if least == 0 else ''}, got {value!r}")
        if observation_mode not in OBSERVATION_MODES:
            raise UserError(f"observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        self.max_steps = max_steps
        self.history_length = history_length
        self.invalid_action_penalty = invalid_action_penalty
        self.success_reward = success_reward
        self.observation_mode = observation_mode
        self.require_think = require_think
        self.template_cache = template_cache
        self._engine: Engine | None = None
        self._game_path = str(game_path)
        self._meta = read_game_meta(self._game_path)
        self._reset_episode_state()

    def _reset_episode_state(self) -> None:
        self._started = False
        self._done = False
        self._steps = 0
        self._task = ""
        self._last_observation = ""
        self._admissible: list[str] = []
        self._history: list[tuple[str, str]] = []  # (observation before the action, command sent)

    @property
    def game_path(self) -> str:
        return self._game_path

    @property
    def task_type(self) -> str:
        return self._meta["task_type"]

    @property
    def walkthrough(self) -> list[str] | None:
        """The expert's commands that win the game from reset (generated games always have one)."""
        walk = self._meta["walkthrough"]
        return list(walk) if walk else None

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {"won": False, "task_type": self.task_type, "task": self._task,
                "admissible_actions": list(self._admissible), "action_valid": True, "format_ok": True,
                "reason": "", "action": "", "penalty": 0.0, "step": self._steps, "gamefile": self._game_path,
                **extra}

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start the game from its initial state; ``options={"game_path": ...}`` switches to another game first."""
        new_game = (options or {}).get("game_path")
        if new_game is not None and str(new_game) != self._game_path:
            await self.close()
            self._game_path = str(new_game)
            self._meta = read_game_meta(self._game_path)
        state = await _engine_call(self._load_and_reset)
        self._reset_episode_state()
        self._started = True
        observation, self._task = prompts.split_intro(state.feedback)
        self._last_observation = observation
        self._admissible = state.admissible
        first = prompts.first_prompt(self._task, observation, state.admissible)
        return first, self._info(seed=seed, feedback=observation, anchor=observation)

    def _load_and_reset(self):
        if self._engine is None:
            self._engine = Engine(self._game_path, template_cache=self.template_cache)
        return self._engine.reset()

    async def step(self, action_text: str) -> StepResult:
        if not self._started or self._done:
            raise RuntimeError("AlfWorldEnv.step called before reset(), after the episode ended or after close()")
        parsed = parse_action(action_text, require_think=self.require_think)
        action_valid = parsed.command in self._admissible
        engine, command = self._engine, parsed.command
        state = await _engine_call(lambda: engine.step(command))
        self._history.append((self._last_observation, parsed.command))
        self._steps += 1
        self._last_observation = state.feedback
        self._admissible = state.admissible
        won = state.won
        self._done = won or self._steps >= self.max_steps
        penalty = 0.0 if parsed.format_ok else self.invalid_action_penalty
        reward = (self.success_reward if won else 0.0) - penalty
        if self.observation_mode == "window" and not self._done:
            observation = prompts.window_prompt(self._task, self._history, self._steps, state.feedback,
                                                state.admissible, self.history_length)
        else:
            observation = prompts.step_feedback(self._steps, state.feedback, state.admissible, self._done)
        info = self._info(won=won, action_valid=action_valid, format_ok=parsed.format_ok, reason=parsed.reason,
                          action=parsed.command, feedback=state.feedback, anchor=state.feedback, penalty=penalty)
        if self._done:
            info["truncated"] = not won
        return StepResult(observation, reward, self._done, info)

    async def close(self) -> None:
        self._started = False  # a step now is the caller's error, named as such (reset() starts the game again)
        engine, self._engine = self._engine, None
        if engine is not None:
            await _engine_call(engine.close)
