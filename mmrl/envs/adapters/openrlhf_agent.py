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
- the dataset's prompt text is not used: the env writes the first prompt. Env texts are framed as chat turns by the
  tokenizer's own chat template (:class:`~mmrl.envs.episode.TurnRenderer`, the local backend's renderer, with the
  label's ``system`` prompt), so the tokens of an episode are the local backend's: the first prompt with the
  assistant header, each turn, then the template's end of turn (its rest, when the model closed the turn itself),
  the feedback as a user turn and the next assistant header; nothing follows the last turn. ``"chat": "none"`` in the
  label sends the env's texts bare;
- the episode's outcome and counters are kept by :class:`~mmrl.envs.episode.EpisodeRecord`, as every driver's are;
- rewards are the env's step rewards (10 on a win, -0.1 for a malformed step), returned as numpy scalars (the executor
  only calls ``.item()``; no torch import here); ``scores`` is 1.0 for a won episode (for dynamic filtering);
  ``extra_logs`` are the episode's (:meth:`~mmrl.envs.episode.EpisodeRecord.logs`: ``won``, ``turns``, ``format_rate``,
  ``valid_action_rate``, ``episode_truncated``, ``env_failed``);
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
from mmrl.envs.episode import EpisodeRecord, TurnRenderer
from mmrl.envs.pool import EnvPool
from mmrl.errors import UserError

logger = logging.getLogger(__name__)
CHATS = ("template", "none")  # env texts framed by the tokenizer's chat template, or bare


def parse_label(label: Any) -> dict[str, Any]:
    """``label`` -> {"game_path", "seed", "env", "chat", "system"}; a bad label is a clear error (a data bug)."""
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
    spec.setdefault("chat", "template")
    spec.setdefault("system", None)
    if spec["chat"] == "chatml":  # a ChatML tokenizer's template frames the turns so: the same as "template"
        spec["chat"] = "template"
    if spec["chat"] not in CHATS:
        raise UserError(f"label 'chat' must be one of {', '.join(CHATS)}, got {spec['chat']!r}")
    return spec


def label_for(game_path: str | Path, *, seed: int | None = None, chat: str = "template", system: str | None = None,
              **env_kwargs: Any) -> str:
    return json.dumps({"game_path": str(game_path), "seed": seed, "env": env_kwargs, "chat": chat, "system": system})


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


class _ClosedTurns:
    """The rollout engine, with the stop token a turn ended with kept in its text. vLLM leaves special tokens out of
    a completion's text (``skip_special_tokens``) but keeps them in its tokens, and the instance sees only the text:
    without the stop text it would close the turn a second time in the feedback."""

    def __init__(self, engine, renderer: TurnRenderer):
        self.engine, self.renderer = engine, renderer

    async def generate(self, prompt_ids, sampling_params, *args, **kwargs):
        result = await self.engine.generate(prompt_ids, sampling_params, *args, **kwargs)
        output, stop = result.outputs[0], self.renderer.stop_text
        tokens = list(output.token_ids)
        if stop and tokens and not output.text.endswith(stop) and self.renderer.tokenizer.decode(tokens[-1:]) == stop:
            output.text += stop
        return result


class AgentInstance(AgentInstanceBase):
    pool: EnvPool | None = None  # set on the subclass AgentExecutor builds when it runs a pool
    renderer: TurnRenderer | None = None  # set on the subclass AgentExecutor builds for the engine's tokenizer

    def __init__(self, *args, **kwargs):
        self.env: TextEnv | None = None
        self.record = EpisodeRecord()
        self.chat = "template"
        self.chat_turns: TurnRenderer | None = None
        self.turns = 0

    async def reset(self, states: dict, **kwargs):
        spec = parse_label(states.get("label"))
        self.chat, self.record, self.turns = spec["chat"], EpisodeRecord(), 0
        if self.renderer is None:  # built by another executor than this file's, which binds the engine's tokenizer
            raise UserError("AgentInstance is played by this file's AgentExecutor, which gives it the engine's "
                            "tokenizer for the chat template")
        if self.chat == "template":
            self.chat_turns = self.renderer if spec["system"] is None else TurnRenderer(self.renderer.tokenizer,
                                                                                       spec["system"])
        try:
            if self.pool is not None:
                self.env = self.pool.env(game_path=spec["game_path"], **spec["env"])
                first, info = await self.env.reset(seed=spec["seed"])
            else:
                self.env = make_env(spec)
                first, info = await _in_thread(self.env.reset, spec["seed"])
            self.record.started(first, info)
        except EnvError as err:  # the executor needs a prompt anyway: say so, and end at the first step
            self.record.fail(err)
            first = f"The environment failed to start: {err}"
        return {"observation": first if self.chat_turns is None else self.chat_turns.prompt_text(first)}

    async def step(self, states: dict, **kwargs) -> dict[str, Any]:
        action_text, sampling_params = states["action_text"], states.get("sampling_params")
        if self.record.outcome == "failed":  # the env never started
            return await self._finish(0.0, sampling_params)
        # the env reads the turn as the local backend steps it: without the stop token that closed it
        stop = self.renderer.closes_turn(action_text)
        action = action_text[: -len(stop)] if stop else action_text
        try:
            if self.pool is not None:
                result: StepResult = await self.env.step(action)
            else:
                result = await _in_thread(self.env.step, action)
        except EnvError as err:
            self.record.fail(err)
            return await self._finish(0.0, sampling_params)
        self.turns += 1
        self.record.stepped(result)
        if result.done:  # nothing follows the last turn (the local backend's episode ends there too)
            return await self._finish(result.reward, sampling_params)
        return {"rewards": np.float64(result.reward), "scores": 0.0,
                "environment_feedback": result.observation if self.chat_turns is None else
                self.chat_turns.feedback_text(result.observation, stop), "done": False,
                "sampling_params": sampling_params, "extra_logs": self.record.logs(self.turns)}

    async def _release(self) -> None:
        """Close the episode's env (frees the engine; in a pool, the worker's memory) — best effort: it is over."""
        env, self.env = self.env, None
        if env is None:
            return
        try:
            await (env.close() if self.pool is not None else _in_thread(env.close))
        except EnvError as err:  # the env's worker is already gone: nothing left to free
            logger.info("closing a finished episode's env failed: %s", err)

    async def _finish(self, reward: float, sampling_params) -> dict[str, Any]:
        await self._release()
        return {"rewards": np.float64(reward), "scores": 1.0 if self.record.won else 0.0, "environment_feedback": "",
                "done": True, "sampling_params": sampling_params, "extra_logs": self.record.logs(self.turns)}


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self, env_workers: int | None = None):
        """OpenRLHF builds this with no arguments; ``env_workers`` (default ``$MMRL_ENV_WORKERS``, else 0) > 0 runs
        the envs in a pool of that many processes instead of threads of the actor."""
        if env_workers is None:
            env_workers = int(os.environ.get("MMRL_ENV_WORKERS", "0") or 0)
        from mmrl.envs.alfworld import AlfWorldEnv  # pickled into the workers by its importable name (this file is
        # loaded by path as "agent_module", which a spawned worker could not import)

        self.pool = EnvPool(AlfWorldEnv, num_workers=env_workers) if env_workers > 0 else None
        self.instance_classes: dict[int, type[AgentInstance]] = {}
        super().__init__(AgentInstance)

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, *args,
                      **kwargs):
        # OpenRLHF builds each episode's instance with no arguments: the engine's tokenizer (for the chat template)
        # and this executor's pool reach it as attributes of a subclass, one per tokenizer
        key = id(hf_tokenizer)
        if key not in self.instance_classes:
            self.instance_classes[key] = type("BoundAgentInstance", (AgentInstance,),
                                              {"pool": self.pool, "renderer": TurnRenderer(hf_tokenizer)})
        self.agent_instance_cls = self.instance_classes[key]
        engine = _ClosedTurns(llm_engine, self.agent_instance_cls.renderer)
        return await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer, engine, *args,
                                     **kwargs)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
