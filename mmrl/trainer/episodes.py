"""Multi-turn episodes: in the episode layout one episode is one response row (OpenRLHF's ``MultiTurnAgentExecutor``);
in the turn layout (below) every env step is a row of its own.

    [initial prompt: chat template of the env's first observation + assistant header]   (the Group's prompt)
    [turn 1: the model's sampled tokens, up to and including its stop token]              loss mask 1
    [feedback 1: end of turn, the env's feedback as a user turn, next assistant header]   loss mask 0
    [turn 2 ...]                                                                          loss mask 1
    ...

The sequence grows turn by turn and is never re-tokenised: what the model conditioned on when it sampled a turn is
exactly the prefix the trainer re-scores it with, so π_old re-scoring reproduces the sampler's log-probs (tested).

:func:`run_episodes` drives many episodes at once: each turn the still-running episodes are generated as one batch
(``policy``), then their env steps run concurrently (``asyncio.gather``; an :class:`~mmrl.envs.base.TextEnv` that runs
its engine elsewhere, like the env pool, steps in parallel). A policy is any function from running episodes to their
next turns: the sampling model (:func:`model_policy`) for RL and evaluation, or scripted expert text for the SFT
warm-up (mmrl/trainer/sft.py), so demonstrations are rendered by the very same code as rollouts. The chat pieces
(:class:`~mmrl.envs.episode.TurnRenderer`) and the episode's bookkeeping (:class:`~mmrl.envs.episode.EpisodeRecord`)
are the ones the openrlhf backend's drivers use too (mmrl/envs/episode.py).

How an episode ends (``Episode.outcome``): ``done`` (the env says so: won, lost or its step limit), ``truncated``
(the next turn or feedback would pass ``max_episode_tokens``), or ``failed`` (the env raised
:class:`~mmrl.envs.base.EnvError` or timed out: the episode ends, the run goes on; the trainer leaves failed episodes
out of the update, since their return says nothing about the policy).

The episode's reward is the sum of its step rewards (the env's convention; ALFWorld: 10·won minus 0.1 per step whose
output had no well-formed ``<action>``).

The turn layout (``layout="turn"``, verl-agent's): the env runs in its self-contained observation mode
(``EnvTask.turn_env_kwargs``: every observation is the task, the last turns and the current state), and every env step
is one training sample: its prompt is the chat-templated observation, its response the model's turn
(:class:`TurnSample`). Nothing grows across turns, so a turn's context is bounded by the history window whatever the
episode's length; ``max_episode_tokens`` then bounds each turn-sample (prompt and turn).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from mmrl.batch import Response, TurnStep
from mmrl.envs.base import EnvError, TextEnv
from mmrl.envs.episode import EpisodeRecord, TurnRenderer
from mmrl.rewards.base import RewardResult
from mmrl.trainer.rollout import generate
from mmrl.trainer.turn_sampler import CachedTurnSampler, Turn


@dataclasses.dataclass
class TurnSample:
    """One turn of the turn layout: the prompt the model saw, its turn, the sampler's log-probs, the env's reward for
    the turn (0 when the turn was cut short and never stepped) and the anchor state it was taken in."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None
    anchor: str
    reward: float = 0.0
    penalty: float = 0.0  # the env's info["penalty"]: the part of ``reward`` that penalises the action's form


LAYOUTS = ("episode", "turn")


@dataclasses.dataclass
class Episode(EpisodeRecord):
    """One episode being played. ``env`` is a TextEnv or a function building one: building happens inside the
    driver, so an env that cannot even be built (``EnvError``, e.g. an unreadable game) fails only its episode. Its
    outcome, rewards, counters and anchor are kept by :class:`~mmrl.envs.episode.EpisodeRecord`, as every driver's
    are."""

    env: TextEnv | Callable[[], TextEnv] | None
    seed: int | None = None
    options: dict[str, Any] | None = None
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)  # after the prompt: turns and feedback
    loss_mask: list[int] = dataclasses.field(default_factory=list)  # per token_ids: 1 model, 0 env
    sampler_logprobs: list[float | None] = dataclasses.field(default_factory=list)  # per token_ids (None: env)
    actions: list[str] = dataclasses.field(default_factory=list)  # the model's raw turn texts
    observations: list[str] = dataclasses.field(default_factory=list)  # the env's texts: first prompt, then feedback
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # the env's info of the last reset / step
    layout: str = "episode"  # "turn": each turn re-prompts from the env's self-contained observation
    turns: list[TurnSample] = dataclasses.field(default_factory=list)  # the turn layout's samples

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.token_ids

    @property
    def largest_context(self) -> int:
        """The most tokens the model read and wrote at once: the whole episode, or the turn layout's largest turn."""
        if self.layout == "turn":
            return max((len(t.prompt_ids) + len(t.token_ids) for t in self.turns), default=len(self.prompt_ids))
        return len(self.context)

    def summary(self, tokens: int | None = None) -> dict[str, Any]:
        return super().summary(self.largest_context if tokens is None else tokens)

    def reward(self) -> RewardResult:
        """The episode's return as a reward; ``success``/``format``/``valid_action`` are its reported components."""
        s = self.summary()
        if self.won:
            reason = None
        elif self.outcome == "failed":
            reason = f"env failed: {self.error}"
        elif self.outcome == "truncated":
            reason = "episode token budget reached"
        else:
            reason = f"not won in {self.steps} steps"
        return RewardResult(s["return"], reason, {"success": float(self.won), "format": s["format_rate"],
                                                   "valid_action": s["valid_action_rate"]})

    def response(self) -> Response:
        return Response(list(self.token_ids), "\n".join(self.actions), reward=self.reward(),
                        truncated=self.outcome == "truncated", loss_mask=list(self.loss_mask),
                        episode=self.summary(), logprobs=_sampled(self.sampler_logprobs))

    def turn_responses(self, episode_id: int) -> list[Response]:
        """The turn layout's training samples: one per turn, each with its own prompt and the episode's return as its
        reward; the episode's summary rides on the first only, so that episode metrics count each episode once."""
        reward, summary, last = self.reward(), self.summary(), len(self.turns) - 1
        return [Response(list(t.token_ids), text, reward=reward, truncated=i == last and self.outcome == "truncated",
                         episode=summary if i == 0 else None, prompt_ids=list(t.prompt_ids),
                         step=TurnStep(episode_id, i, t.reward, t.anchor, t.penalty),
                         logprobs=None if t.logprobs is None else list(t.logprobs))
                for i, (t, text) in enumerate(zip(self.turns, self.actions, strict=True))]


def _sampled(logprobs: list[float | None]) -> list[float] | None:
    """An episode's sampler log-probs as a response carries them: NaN on env tokens; None when none was recorded."""
    if all(x is None for x in logprobs):
        return None
    return [math.nan if x is None else x for x in logprobs]


Policy = Callable[[list[Episode]], list[Turn]]


def model_policy(model, tokenizer, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 batch_size: int = 64, with_logprobs: bool = False, kv_cache: bool = True) -> Policy:
    """The sampling policy: all running episodes as one generation batch (chunked by ``batch_size``).

    ``kv_cache`` (default): a :class:`~mmrl.trainer.turn_sampler.CachedTurnSampler`, which keeps each episode's keys
    and values across turns and reads only the new tokens each turn. ``kv_cache=False``: every turn re-reads each
    episode's whole context through ``generate`` (the layout before the cache; kept to measure against)."""
    from mmrl.trainer.rollout import eos_ids

    if kv_cache:
        return CachedTurnSampler(model, tokenizer, max_new_tokens, temperature, top_p, batch_size, with_logprobs)

    stop = set(eos_ids(tokenizer, model))

    def policy(episodes: list[Episode]) -> list[Turn]:
        responses = generate(model, tokenizer, [e.context for e in episodes], max_new_tokens, temperature, top_p,
                             batch_size, return_logprobs=with_logprobs)
        return [Turn(r.token_ids, r.text, bool(r.token_ids) and r.token_ids[-1] in stop, r.logprobs)
                for r in responses]

    return policy


async def _guarded(call, timeout: float | None):
    """Await an env call; an :class:`EnvError` or a timeout becomes the error text (other exceptions are bugs)."""
    try:
        return await asyncio.wait_for(call, timeout) if timeout else await call, ""
    except EnvError as exc:
        return None, f"EnvError: {exc}"
    except TimeoutError:
        return None, f"env call timed out after {timeout} s"


async def _reset(ep: Episode, renderer: TurnRenderer, max_tokens: int, timeout: float | None) -> None:
    if not isinstance(ep.env, TextEnv):
        try:
            ep.env = ep.env()
        except EnvError as exc:
            ep.env = None
            ep.fail(exc)
            return
    result, error = await _guarded(ep.env.reset(seed=ep.seed, options=ep.options), timeout)
    if result is None:
        ep.fail(error)
        return
    observation, info = result
    ep.observations.append(observation)
    ep.info = info
    ep.started(observation, info)
    ep.prompt_ids = renderer.prompt_ids(observation)
    ep.fits(len(ep.prompt_ids), max_tokens, first=True, budget_name="max_episode_tokens")


async def _step(ep: Episode, turn: Turn, renderer: TurnRenderer, stop_text: str | None, max_tokens: int,
                timeout: float | None) -> None:
    result, error = await _guarded(ep.env.step(turn.text), timeout)
    if result is None:
        ep.fail(error)
        return
    ep.observations.append(result.observation)
    ep.info = result.info
    penalty = ep.stepped(result)
    if ep.layout == "turn":
        ep.turns[-1].reward, ep.turns[-1].penalty = float(result.reward), penalty
    if ep.outcome:
        return
    if ep.layout == "turn":  # the next turn reads the env's self-contained observation afresh
        ep.prompt_ids = renderer.prompt_ids(result.observation)
        ep.token_ids, ep.loss_mask, ep.sampler_logprobs = [], [], []  # only the current turn, as its prompt
        ep.fits(len(ep.prompt_ids), max_tokens)
        return
    feedback = renderer.feedback_ids(result.observation, stop_text)
    if len(ep.context) + len(feedback) >= max_tokens:  # no room for the feedback and a next turn
        ep.end("truncated")
        return
    ep.token_ids += feedback
    ep.loss_mask += [0] * len(feedback)
    ep.sampler_logprobs += [None] * len(feedback)


async def _close(env: TextEnv) -> None:
    try:
        await env.close()
    except EnvError:
        pass  # the episode is over either way; a failing close cannot hurt the data


async def _drive(episodes: list[Episode], renderer: TurnRenderer, policy: Policy, max_tokens: int,
                 timeout: float | None) -> None:
    await asyncio.gather(*(_reset(ep, renderer, max_tokens, timeout) for ep in episodes))
    decode = renderer.tokenizer.decode
    while running := [ep for ep in episodes if not ep.outcome]:
        turns = policy(running)
        steps = []
        for ep, turn in zip(running, turns, strict=True):
            room = max_tokens - len(ep.context)
            tokens = turn.token_ids[:room]
            if ep.layout == "turn":
                ep.turns.append(TurnSample(list(ep.prompt_ids), list(tokens),
                                           list(turn.logprobs[: len(tokens)]) if turn.logprobs else None, ep.anchor))
            ep.token_ids += tokens
            ep.loss_mask += [1] * len(tokens)
            ep.sampler_logprobs += list(turn.logprobs[: len(tokens)]) if turn.logprobs else [None] * len(tokens)
            ep.actions.append(turn.text)
            if len(tokens) < len(turn.token_ids):
                ep.end("truncated")  # the turn itself does not fit: it trains with the return so far, unstepped
                continue
            stop_text = decode(tokens[-1:]) if turn.stopped else None
            steps.append(_step(ep, turn, renderer, stop_text, max_tokens, timeout))
        await asyncio.gather(*steps)
    await asyncio.gather(*(_close(ep.env) for ep in episodes if isinstance(ep.env, TextEnv)))


def run_episodes(episodes: list[Episode], renderer: TurnRenderer, policy: Policy, max_episode_tokens: int,
                 step_timeout: float | None = None) -> list[Episode]:
    """Play every episode to its end (in place; also returned). Envs are closed afterwards. Each episode's ``layout``
    says how its turns are rendered (a turn-layout episode's env must be in its self-contained observation mode)."""
    for ep in episodes:
        if ep.layout not in LAYOUTS:
            raise ValueError(f"episode layout must be one of {LAYOUTS}, got {ep.layout!r}")
    asyncio.run(_drive(episodes, renderer, policy, max_episode_tokens, step_timeout))
    return episodes


def episode_metrics(summaries: Sequence[dict[str, Any]], prefix: str = "") -> dict[str, float]:
    """Success rate overall and per task type, valid-action and format rates, episode length, outcomes."""
    if not summaries:
        return {}
    n = len(summaries)
    out = {
        f"{prefix}success_rate": sum(s["won"] for s in summaries) / n,
        f"{prefix}valid_action_rate": sum(s["valid_action_rate"] for s in summaries) / n,
        f"{prefix}format_rate": sum(s["format_rate"] for s in summaries) / n,
        f"{prefix}episode_length": sum(s["steps"] for s in summaries) / n,
        f"{prefix}episode_tokens": sum(s["tokens"] for s in summaries) / n,
        f"{prefix}truncated_episodes": sum(s["outcome"] == "truncated" for s in summaries) / n,
        f"{prefix}env_failures": float(sum(s["outcome"] == "failed" for s in summaries)),
    }
    by_type: dict[str, list[bool]] = {}
    for s in summaries:
        by_type.setdefault(s["task_type"] or "unknown", []).append(s["won"])
    out.update({f"{prefix}success/{t}": sum(w) / len(w) for t, w in sorted(by_type.items())})
    return out


def failure_reasons(summaries: Sequence[dict[str, Any]]) -> Counter[str]:
    return Counter(s["error"] for s in summaries if s["outcome"] == "failed")
