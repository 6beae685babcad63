"""The rollout part of the local trainer: which prompts (or games) a step samples, their groups of responses (or
episodes) from the policy, scored, with GVPO's replayed responses mixed in, and the objective's resampling rule.

Its state (the prompt order, the replay history) goes into checkpoints; its env pool runs a multi-turn task's envs.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections import deque
from functools import partial
from typing import Any

import mmrl.algos as algos
from mmrl.batch import Group, Response
from mmrl.replay import ReplayStore
from mmrl.rewards.base import RewardResult
from mmrl.run.config import TrainConfig
from mmrl.run.prompts import encode_prompt
from mmrl.tasks import Task
from mmrl.tasks.base import EnvTask
from mmrl.trainer.episodes import Episode, model_policy, run_episodes
from mmrl.trainer.policy import Policy
from mmrl.trainer.rollout import generate, score_groups
from mmrl.trainer.vision_prompts import PromptCache, prompts_vision

log = logging.getLogger("mmrl")


class PromptSampler:
    """Shuffled epochs over the training split; its whole state goes into checkpoints. An endless split (a task's
    `mmrl.tasks.base.GeneratedRows`) has no epochs: every draw is a fresh row number from the same seeded RNG."""

    def __init__(self, size: int, seed: int, endless: bool = False):
        self.size, self.rng, self.order, self.pos = size, random.Random(seed), [], 0
        self.endless = endless

    def take(self, k: int) -> list[int]:
        if self.endless:
            return [self.rng.randrange(self.size) for _ in range(k)]
        out = []
        while len(out) < k:
            if self.pos >= len(self.order):
                self.order, self.pos = list(range(self.size)), 0
                self.rng.shuffle(self.order)
            out.append(self.order[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": self.order, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.order, self.pos = state["order"], state["pos"]


class ReplayHistory(ReplayStore[Response]):
    """GVPO's off-policy π_s: the most recent scored responses of each prompt (its training-split row), replayed into
    later groups by the rule of `mmrl.replay`, which the openrlhf backend follows too."""

    def take(self, sample_index: int, k: int) -> list[Response]:
        return [dataclasses.replace(r, historical=True) for r in super().take(sample_index, k)]

    def add(self, key: int, responses) -> None:
        """Kept without their sampler's log-probs: the rollout correction compares a step's trainer with that step's
        own sampler, and a replayed response's sampler is an older policy (GVPO weighs it by its own rule)."""
        super().add(key, [dataclasses.replace(r, logprobs=None) for r in responses])

    def state_dict(self) -> dict[int, list[dict[str, Any]]]:
        """Each prompt's responses as plain fields (a checkpoint stores JSON values, not objects)."""
        return {k: [dataclasses.asdict(r) for r in v] for k, v in self.by_prompt.items()}

    def load_state_dict(self, state: dict[int, list[dict[str, Any]]]) -> None:
        self.by_prompt = {k: deque((_response(r) for r in v), maxlen=self.capacity) for k, v in state.items()}


def _response(fields: dict[str, Any]) -> Response:
    reward = fields.get("reward")
    return Response(**{**fields, "reward": None if reward is None else RewardResult(**reward)})


@dataclasses.dataclass
class Rollouts:
    """One step's rollout batch from the policy (:meth:`collect`), and the state that carries across steps."""

    cfg: TrainConfig
    algo: algos.Algorithm
    task: Task | EnvTask
    policy: Policy
    sampler: PromptSampler
    history: ReplayHistory
    vision_prompts: PromptCache | None = None  # the training split's image prompts (None for text)
    env_pool: Any = None  # multi-turn unless rollout.env_workers is 0: the mmrl.envs.pool.EnvPool running the envs
    failed_episodes: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # since the last logged step
    episodes_played: int = 0  # the turn layout: a running id for episodes, so that a batch's episode ids are unique

    def prompt_ids(self, index: int) -> list[int]:
        if index not in self.policy.prompt_cache:
            self.policy.prompt_cache[index] = encode_prompt(self.policy.tokenizer, self.task.train[index]["messages"],
                                                     self.cfg.rollout.max_prompt_tokens)
        return self.policy.prompt_cache[index]

    def new_group(self, index: int, responses: list[Response]) -> Group:
        if self.vision_prompts is not None:  # annotated sample, prompt ids and images (mmrl.trainer.vision_prompts)
            return self.vision_prompts.group(index, responses)
        return Group(index, self.task.train[index], self.prompt_ids(index), responses)

    def sample_groups(self, n_prompts: int) -> list[Group]:
        """Sample prompts, generate their groups (mixing in replayed responses for GVPO) and score them."""
        if self.task.multi_turn:
            return self.sample_episode_groups(n_prompts)
        r = self.cfg.rollout
        groups = []
        for index in self.sampler.take(n_prompts):
            old = self.history.take(index, r.replay_historical)
            groups.append(self.new_group(index, old))
        todo = [(g, r.samples_per_prompt - len(g.responses)) for g in groups]
        prompts = [g.prompt_ids for g, n in todo for _ in range(n)]
        images = prompts_vision(todo) if self.vision_prompts is not None else None
        with self.policy.autocast():
            fresh = generate(self.policy.model, self.policy.tokenizer, prompts, r.max_new_tokens, r.temperature,
                             r.top_p, r.generation_batch_size, vision=images, sampler=r.sampler, top_k=r.top_k,
                             repetition_penalty=r.repetition_penalty, return_logprobs=True)
        at = 0
        for g, n in todo:
            g.responses = fresh[at : at + n] + g.responses
            at += n
        score_groups(groups, self.task.reward)
        for g in groups:
            self.history.add(g.sample_index, [x for x in g.responses if not x.historical])
        return groups

    def episode_seed(self, index: int) -> int:
        """The reset seed of game ``index``: fixed per game, so a group's episodes (and GVPO's replayed ones) share
        one start."""
        return self.cfg.run.seed * 1_000_003 + index

    @property
    def turn_layout(self) -> bool:
        """Agent episodes train turn by turn (``rollout.agent_layout turn``): every env step is its own sample."""
        return self.task.multi_turn and self.cfg.rollout.agent_layout == "turn"

    def env_factory(self, row: dict[str, Any]):
        """A zero-argument builder of the env for ``row`` in the run's agent layout: in the env pool's workers, or in
        this process."""
        layout = self.cfg.rollout.agent_layout
        if self.env_pool is not None:
            return partial(self.env_pool.env, **self.task.kwargs_for(row, layout))
        return partial(self.task.make_env, row, layout)

    def sample_episode_groups(self, n_games: int) -> list[Group]:
        """Multi-turn: ``samples_per_prompt`` episodes of each sampled game from one reset seed, all played together
        turn by turn. Episodes whose env failed are left out of training (counted in the metrics)."""
        r = self.cfg.rollout
        plan = []
        for index in self.sampler.take(n_games):
            old = self.history.take(index, r.replay_historical)
            row = self.task.train[index]
            episodes = [Episode(self.env_factory(row), seed=self.episode_seed(index), layout=r.agent_layout)
                        for _ in range(r.samples_per_prompt - len(old))]
            plan.append((index, old, episodes))
        # a turn-layout context is re-prompted every turn, so there is no growing sequence to keep a KV cache of
        policy = model_policy(self.policy.model, self.policy.tokenizer, r.max_new_tokens, r.temperature, r.top_p,
                              r.generation_batch_size, with_logprobs=True,
                              kv_cache=r.episode_kv_cache and not self.turn_layout)
        with self.policy.autocast():
            run_episodes([ep for _, _, eps in plan for ep in eps], self.policy.renderer, policy, r.max_episode_tokens)
        groups = []
        for index, old, episodes in plan:
            played = [ep for ep in episodes if ep.outcome != "failed"]
            self.failed_episodes += [ep.summary() for ep in episodes if ep.outcome == "failed"]
            if not played:
                continue
            starts = [ep.turns[0].prompt_ids if self.turn_layout else ep.prompt_ids for ep in played]
            if any(start != starts[0] for start in starts):
                raise RuntimeError(f"game {self.task.train[index]} started differently under one seed; a group needs "
                                   f"identical starts")
            if self.turn_layout:  # every turn is a sample of the game's group; the ids tell its episode apart
                responses = []
                for ep in played:
                    responses += ep.turn_responses(self.episodes_played)
                    self.episodes_played += 1
            else:
                responses = [ep.response() for ep in played]
            group = Group(index, self.task.train[index], starts[0], responses + old)
            self.history.add(index, [x for x in group.responses if not x.historical])
            groups.append(group)
        return groups

    def collect(self, step: int) -> tuple[list[Group], dict[str, float]]:
        """One rollout batch of ``prompts_per_step`` groups, topped up by the objective's resampling rule (GPG's β_th:
        resample while too few groups are valid). ``step``: the steps done before it."""
        target = self.cfg.rollout.prompts_per_step
        groups = self.sample_groups(target)
        rule = self.algo.resampling()
        if not rule.active:
            return groups, {}
        valid = [g for g in groups if not g.all_rewards_equal]
        last, rounds = groups, 0
        while len(valid) < rule.valid_fraction * target and rounds < rule.max_rounds:
            rounds += 1
            last = self.sample_groups(target)
            valid += [g for g in last if not g.all_rewards_equal]
        if len(valid) < rule.valid_fraction * target:
            log.warning("step %d: only %d/%d valid groups after %d resampling rounds (β_th=%.2f); training on them",
                        step + 1, len(valid), target, rounds, rule.valid_fraction)
        kept = valid[:target]
        kept += [g for g in last if g.all_rewards_equal][: target - len(kept)]
        return kept, {"resample_rounds": float(rounds)}
