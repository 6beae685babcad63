"""The agent turn layout's executor (``rollout.agent_layout turn``): every env step is its own row.

OpenRLHF loads the agent file mmrl/openrlhf/turn_agent.py by path (``--train.agent_func_path``) in every rollout
engine, which hands it :class:`AgentExecutor` from here, and calls ``AgentExecutor().execute(prompt, label, ...)`` once
per episode. Where OpenRLHF's ``MultiTurnAgentExecutor`` grows one
sequence (env tokens masked), this executor plays the episode as the local backend's turn layout does
(mmrl/trainer/episodes.py):

* the env runs in its self-contained observation mode (the label's ``env`` holds ``EnvTask.turn_env_kwargs``), so
  every observation is the task, the last turns and the current state (verl-agent's window prompt);
* each turn's prompt is that observation rendered by :class:`~mmrl.envs.episode.TurnRenderer` (the local
  backend's renderer: the tokenizer's own chat template, the task's system prompt) and its response is the model's
  action, stepped into the env as the text decoded without special tokens;
* the episode's outcome, rewards, counters, anchors and invalid-action penalties are kept by
  :class:`~mmrl.envs.episode.EpisodeRecord`, as the local backend's are;
* a turn that does not fit ``max_length`` (prompt + turn) ends the episode truncated, trained with the return so far;
  a next prompt that does not fit ends it truncated too; an env that raises ``EnvError`` ends it as failed, and a
  failed episode gives no rows (the local trainer leaves it out of the update too).

The result is one response dict per episode, OpenRLHF's shape, built from its last turn (what evaluation reads:
``extra_logs["won"]``), with every turn as a response dict of its own under :data:`TURNS_KEY`, each with the env's
reward for its action and the state it was taken in (``TurnStep``). mmrl's samples generator makes those the step's
rows (mmrl/openrlhf/sampling.py); every turn row carries the episode's return as its reward.
"""

from __future__ import annotations

import dataclasses
import os
from copy import deepcopy
from typing import Any

from openrlhf.utils.agent import AgentExecutorBase

from mmrl.batch import TurnStep
from mmrl.envs.adapters.openrlhf_agent import _in_thread, make_env, parse_label
from mmrl.envs.base import EnvError
from mmrl.envs.episode import EpisodeRecord, TurnRenderer
from mmrl.envs.pool import EnvPool

TURNS_KEY = "mmrl_turns"  # the episode response's turns, each a response dict with its TurnStep under STEP_FIELD
STEP_FIELD = "mmrl_step"


@dataclasses.dataclass
class PlayedTurn:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None
    anchor: str
    reward: float = 0.0
    penalty: float = 0.0  # the env's info["penalty"]: the part of ``reward`` that penalises the action's form
    cut: bool = False  # generation hit the length limit


@dataclasses.dataclass(kw_only=True)
class PlayedEpisode(EpisodeRecord):
    turns: list[PlayedTurn] = dataclasses.field(default_factory=list)
    first_prompt: list[int] = dataclasses.field(default_factory=list)


def _sampled_logprobs(output, tokens: list[int]) -> list[float] | None:
    if output.logprobs is None:
        return None
    return [float(step[token].logprob) for step, token in zip(output.logprobs, tokens, strict=False)]


async def play_episode(env_call, env, renderer: TurnRenderer, seed, generate, sampling_params,
                       max_length: int) -> PlayedEpisode:
    """One episode in the turn layout. ``env_call(method, *args)`` awaits an env method (in a worker thread or the
    env pool); ``generate(prompt_ids, params)`` is the rollout engine's."""
    played = PlayedEpisode()
    try:
        observation, info = await env_call(env.reset, seed)
    except EnvError as err:
        played.fail(err)
        return played
    played.started(observation, info)
    prompt_ids = renderer.prompt_ids(observation)
    played.first_prompt = prompt_ids
    if not played.fits(len(prompt_ids), max_length, first=True, budget_name="the turn budget"):
        return played
    decode = renderer.tokenizer.decode
    budget = sampling_params.max_tokens or max_length
    while not played.outcome:
        room = max_length - len(prompt_ids)
        params = deepcopy(sampling_params)
        params.max_tokens = min(budget, room)
        output = (await generate(prompt_ids, params)).outputs[0]
        tokens = list(output.token_ids)
        turn = PlayedTurn(list(prompt_ids), tokens, _sampled_logprobs(output, tokens), played.anchor,
                          cut=output.finish_reason == "length")
        played.turns.append(turn)
        if turn.cut and room < budget:  # the turn itself does not fit: it trains with the return so far, unstepped
            played.end("truncated")
            break
        try:
            result = await env_call(env.step, decode(tokens, skip_special_tokens=True))
        except EnvError as err:
            played.fail(err)
            break
        turn.reward, turn.penalty = float(result.reward), played.stepped(result)
        if played.outcome:
            break
        prompt_ids = renderer.prompt_ids(result.observation)
        played.fits(len(prompt_ids), max_length)
    return played


def turn_response(prompt: str, label: str, turn_prompt: list[int], tokens: list[int],
                  logprobs: list[float] | None, with_logprobs: bool, reward: float, score: float, truncated: bool,
                  logs: dict[str, float]) -> dict[str, Any]:
    """One row as OpenRLHF's executors return it: the prompt's tokens, then the action's (one action range)."""
    rollout_log_probs = None
    if with_logprobs:
        rollout_log_probs = [0.0] * len(turn_prompt) + (logprobs or [0.0] * len(tokens))
    return {"prompt": prompt, "label": label, "images": None, "mm_train_inputs": None, "reward": reward,
            "scores": score, "observation_tokens": turn_prompt + tokens,
            "action_ranges": [(len(turn_prompt), len(turn_prompt) + len(tokens))] if tokens else [],
            "rollout_log_probs": rollout_log_probs, "truncated": truncated, "extra_logs": dict(logs)}


def episode_response(prompt: str, label: str, played: PlayedEpisode, with_logprobs: bool) -> dict[str, Any]:
    """The episode as one response (its last turn; what evaluation reads) and its turns under :data:`TURNS_KEY`."""
    ret, score = float(sum(played.rewards)), 1.0 if played.won else 0.0
    logs = played.logs(len(played.turns))
    last = played.turns[-1] if played.turns else PlayedTurn(played.first_prompt, [], None, "")
    out = turn_response(prompt, label, last.prompt_ids, last.token_ids, last.logprobs, with_logprobs, ret, score,
                        last.cut, logs)
    rows = []
    if played.outcome != "failed":
        final = len(played.turns) - 1
        for index, turn in enumerate(played.turns):
            row = turn_response(prompt, label, turn.prompt_ids, turn.token_ids, turn.logprobs, with_logprobs, ret,
                                score, index == final and played.outcome == "truncated", logs)
            # the generator numbers the episode
            row[STEP_FIELD] = TurnStep(-1, index, turn.reward, turn.anchor, turn.penalty)
            rows.append(row)
    out[TURNS_KEY] = rows
    return out


async def _pooled(method, *args):
    return await method(*args)  # the env pool's envs already run in their worker processes


class AgentExecutor(AgentExecutorBase):
    """Built by OpenRLHF with no arguments in every rollout engine. ``env_workers`` (default ``$MMRL_ENV_WORKERS``,
    else 0) > 0 runs the envs in an env pool of that many processes; 0 runs each env in a worker thread."""

    def __init__(self, env_workers: int | None = None):
        if env_workers is None:
            env_workers = int(os.environ.get("MMRL_ENV_WORKERS", "0") or 0)
        from mmrl.envs.alfworld import AlfWorldEnv  # pickled into the pool's workers by its importable name

        self.pool = EnvPool(AlfWorldEnv, num_workers=env_workers) if env_workers > 0 else None
        self.renderers: dict[tuple[int, str | None], TurnRenderer] = {}

    def renderer(self, tokenizer, system_prompt: str | None) -> TurnRenderer:
        key = (id(tokenizer), system_prompt)
        if key not in self.renderers:
            self.renderers[key] = TurnRenderer(tokenizer, system_prompt)
        return self.renderers[key]

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        spec = parse_label(label)
        renderer = self.renderer(hf_tokenizer, spec.get("system"))
        env_call = _pooled if self.pool is not None else _in_thread
        try:
            env = self.pool.env(game_path=spec["game_path"], **spec["env"]) if self.pool is not None else \
                make_env(spec)
        except EnvError as err:  # an unreadable game fails its episode only, as in the local trainer
            played = PlayedEpisode()
            played.fail(err)
            return self._respond(prompt, label, played, renderer, sampling_params)
        try:
            played = await play_episode(env_call, env, renderer, spec["seed"], llm_engine.generate, sampling_params,
                                        max_length)
        finally:
            try:
                await env_call(env.close)
            except EnvError:
                pass  # the episode is over either way; a failing close cannot hurt the data
        return self._respond(prompt, label, played, renderer, sampling_params)

    @staticmethod
    def _respond(prompt, label, played: PlayedEpisode, renderer: TurnRenderer, sampling_params) -> dict[str, Any]:
        if not played.first_prompt:  # an env that never started: the episode's one response says why
            played.first_prompt = renderer.prompt_ids(f"The environment failed to start: {played.error}")
        return episode_response(prompt, label, played, sampling_params.logprobs is not None)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
