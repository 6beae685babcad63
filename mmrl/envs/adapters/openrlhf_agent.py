"""OpenRLHF agent file: ALFWorld (or any mmrl TextEnv) inside OpenRLHF's multi-turn agent executor.

    python -m openrlhf.cli.train_ppo_ray ... \\
        --train.agent_func_path $(python -c "import mmrl.envs.adapters.openrlhf_agent as m; print(m.__file__)") \\
        --data.prompt_data alfworld_train.jsonl --data.input_key prompt --data.label_key label

OpenRLHF 0.11 (``openrlhf/utils/agent.py``, ``openrlhf/trainer/ray/vllm_engine.py``) loads this file by path, builds
``AgentExecutor()`` with no arguments in every vLLM actor, and for each prompt builds one ``AgentInstance()``: it
calls ``reset({"observation": prompt, "label": label})`` and then, after every generation, ``step`` with the text so
far and the new ``action_text``; env tokens are masked out of the loss by the executor (``action_ranges``).

What this file decides:
- the game comes from the sample's ``label``: a game path, or a JSON object ``{"game_path": ..., "seed": ...,
  "env": {AlfWorldEnv keyword arguments}}`` (:func:`label_for` writes one; :func:`write_dataset` a whole jsonl), so the
  configuration travels with the data, not with the process environment of remote actors;
- the dataset's prompt text is not used: the env writes the first prompt. Env texts are framed as chat turns with the
  ChatML markers Qwen models use (``"chat": "none"`` in the label sends them bare); as in OpenRLHF's own multi-turn
  example, ``<|im_end|>`` is added before the feedback when the generation stopped without it;
- rewards are the env's step rewards (10 on a win, -0.1 for a malformed step), returned as numpy scalars (the executor
  only calls ``.item()``; no torch import here); ``scores`` is 1.0 for a won episode (for dynamic filtering);
- an env that fails (:class:`EnvError`, at reset or at a step) ends its episode with no further reward and
  ``env_failed = 1`` in the logs, instead of raising into the vLLM actor;
- the engine is synchronous, so env calls run in a worker thread and never block the vLLM actor's event loop (the
  samples of a prompt run concurrently, so several threads use engines at once: safe, every engine call holds the
  engine's process-wide lock, see :mod:`mmrl.envs.alfworld.engine`); with
  ``MMRL_ENV_WORKERS=N`` in the actor's environment (Ray: ``--runtime_env`` ``env_vars``) or ``AgentExecutor(N)``,
  the envs run instead in an :class:`~mmrl.envs.pool.EnvPool` of N processes owned by the executor, so the episodes
  of one actor use N cores; each env is closed when its episode ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from mmrl.envs.base import EnvError, StepResult, TextEnv
from mmrl.envs.pool import EnvPool
from mmrl.errors import UserError

logger = logging.getLogger(__name__)
CHATML = ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>")  # user open, turn switch, end


def parse_label(label: Any) -> dict[str, Any]:
    """``label`` -> {"game_path", "seed", "env", "chat"}; a bad label is a clear error (it is a data bug)."""
    if isinstance(label, dict):
        spec = dict(label)
    elif isinstance(label, str) and label.lstrip().startswith("{"):
        spec = json.loads(label)
    elif isinstance(label, str | Path):
        spec = {"game_path": str(label)}
    else:
        raise UserError(f"ALFWorld agent label must be a game path or a JSON object, got {type(label).__name__}")
    if not spec.get("game_path"):
        raise UserError(f"ALFWorld agent label has no game_path: {label!r}")
    spec.setdefault("seed", None)
    spec.setdefault("env", {})
    spec.setdefault("chat", "chatml")
    if spec["chat"] not in ("chatml", "none"):
        raise UserError(f"label 'chat' must be 'chatml' or 'none', got {spec['chat']!r}")
    return spec


def label_for(game_path: str | Path, *, seed: int | None = None, chat: str = "chatml", **env_kwargs: Any) -> str:
    return json.dumps({"game_path": str(game_path), "seed": seed, "env": env_kwargs, "chat": chat})


def write_dataset(games: Iterable[Any], path: str | Path, **env_kwargs: Any) -> Path:
    """A jsonl OpenRLHF reads with ``--data.input_key prompt --data.label_key label``, one line per ``GameInfo``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for game in games:
            f.write(json.dumps({"prompt": game.task or game.task_type,
                                "label": label_for(game.path, **env_kwargs)}) + "\n")
    return path


def make_env(spec: dict[str, Any]) -> TextEnv:
    from mmrl.envs.alfworld import AlfWorldEnv

    return AlfWorldEnv(spec["game_path"], **spec["env"])


async def _in_thread(coroutine_function, *args):
    """Run a TextEnv coroutine on its own loop in a worker thread (the engine blocks; the actor's loop must not)."""
    return await asyncio.to_thread(lambda: asyncio.run(coroutine_function(*args)))


class AgentInstance(AgentInstanceBase):
    pool: EnvPool | None = None  # set on the subclass AgentExecutor builds when it runs a pool

    def __init__(self, *args, **kwargs):
        self.env: TextEnv | None = None
        self.failure = ""  # why the env could not start ("" when it did)
        self.chat = "chatml"
        self.turns = 0
        self.episode_return = 0.0

    def _user_turn(self, text: str, *, last: bool) -> str:
        if self.chat == "none":
            return text
        user, switch, end = CHATML
        return f"{user}{text}{end}" if last else f"{user}{text}{switch}"

    async def reset(self, states: dict, **kwargs):
        spec = parse_label(states.get("label"))
        self.chat = spec["chat"]
        self.turns, self.episode_return, self.failure = 0, 0.0, ""
        try:
            if self.pool is not None:
                self.env = self.pool.env(game_path=spec["game_path"], **spec["env"])
                first, _ = await self.env.reset(seed=spec["seed"])
            else:
                self.env = make_env(spec)
                first, _ = await _in_thread(self.env.reset, spec["seed"])
        except EnvError as err:  # the executor needs a prompt anyway: say so, and end at the first step
            self.failure = str(err)
            first = f"The environment failed to start: {err}"
        return {"observation": self._user_turn(first, last=False)}

    async def step(self, states: dict, **kwargs) -> dict[str, Any]:
        action_text = states["action_text"]
        if self.failure:
            return await self._finish(0.0, "", won=False, failed=True, info={"reason": self.failure},
                                sampling_params=states.get("sampling_params"))
        try:
            if self.pool is not None:
                result: StepResult = await self.env.step(action_text)
            else:
                result = await _in_thread(self.env.step, action_text)
        except EnvError as err:
            return await self._finish(0.0, "", won=False, failed=True, info={"reason": str(err)},
                                sampling_params=states.get("sampling_params"))
        self.turns += 1
        feedback = self._user_turn(result.observation, last=result.done)
        if self.chat == "chatml" and CHATML[2] not in action_text:  # generation cut before <|im_end|>: close it
            feedback = CHATML[2] + "\n" + feedback
        if result.done:
            return await self._finish(result.reward, feedback, won=bool(result.info.get("won")), failed=False,
                                info=result.info, sampling_params=states.get("sampling_params"))
        self.episode_return += result.reward
        return {"rewards": np.float64(result.reward), "scores": 0.0, "environment_feedback": feedback, "done": False,
                "sampling_params": states.get("sampling_params"), "extra_logs": self._logs(result.info, False, False)}

    async def _release(self) -> None:
        """Close the episode's env (frees the engine; in a pool, the worker's memory) — best effort: it is over."""
        env, self.env = self.env, None
        if env is None:
            return
        try:
            await (env.close() if self.pool is not None else _in_thread(env.close))
        except EnvError as err:  # the env's worker is already gone: nothing left to free
            logger.info("closing a finished episode's env failed: %s", err)

    async def _finish(self, reward: float, feedback: str, *, won: bool, failed: bool, info: dict[str, Any],
                      sampling_params) -> dict[str, Any]:
        self.episode_return += reward
        await self._release()
        return {"rewards": np.float64(reward), "scores": 1.0 if won else 0.0, "environment_feedback": feedback,
                "done": True, "sampling_params": sampling_params, "extra_logs": self._logs(info, won, failed)}

    def _logs(self, info: dict[str, Any], won: bool, failed: bool) -> dict[str, float]:
        return {"won": float(won), "env_failed": float(failed), "turns": float(self.turns),
                "format_ok": float(bool(info.get("format_ok", False))),
                "action_valid": float(bool(info.get("action_valid", False)))}


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self, env_workers: int | None = None):
        """OpenRLHF builds this with no arguments; ``env_workers`` (default ``$MMRL_ENV_WORKERS``, else 0) > 0 runs
        the envs in a pool of that many processes instead of threads of the actor."""
        if env_workers is None:
            env_workers = int(os.environ.get("MMRL_ENV_WORKERS", "0") or 0)
        from mmrl.envs.alfworld import AlfWorldEnv  # pickled into the workers by its importable name (this file is
        # loaded by path as "agent_module", which a spawned worker could not import)

        self.pool = EnvPool(AlfWorldEnv, num_workers=env_workers) if env_workers > 0 else None
        instance_class = AgentInstance
        if self.pool is not None:  # hand the pool to this executor's instances (they are built with no arguments)
            instance_class = type("PooledAgentInstance", (AgentInstance,), {"pool": self.pool})
        super().__init__(instance_class)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
