"""The local trainer: one process, CPU or one GPU, readable top to bottom.

    for step in steps:
        groups  = sample prompts -> generate n responses each -> rewards        (collect_rollouts)
        batch   = collate(groups); old (and ref) log-probs; advantages; batch stats
        for epoch in K: for mini-batch of whole groups: loss -> backward -> clip -> AdamW step
        log metrics; maybe evaluate; maybe checkpoint

Multi-turn tasks (``task.multi_turn``, e.g. ALFWorld) differ only in how groups are made: a group is n episodes of one
game played turn by turn (mmrl/trainer/episodes.py), each episode one response whose env tokens are masked out of the
loss; the rest of the loop is the same. They may start with a supervised warm-up on expert demonstrations
(mmrl/trainer/sft.py).

The run's objects (task and reward, objective, model, tokenizer, vision processor) come from the backend-neutral
build layer (mmrl/trainer/build.py), as for the OpenRLHF backend. This file knows no objective by name: what one needs
from the loop is declared by the `mmrl.algos.Algorithm` contract (GPG's resampling rule β_th, GPG's Alg. 1 line 1;
GVPO's replay of historical responses as an off-policy π_s, GVPO's Theorem 3.2; a reference model).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import random
import signal
import sys
import time
from collections import Counter, deque
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import mmrl.algos as algos
from mmrl import moe
from mmrl.algos.base import advantage_spread, kl_to_old, stats_for_rows
from mmrl.batch import Group, Response, RolloutBatch, collate
from mmrl.errors import Interrupted, UserError, checkpoint_note
from mmrl.models import load_tokenizer
from mmrl.models.lora import FrozenBase, LoraSettings, add_lora, load_policy_weights, policy_weights
from mmrl.replay import ReplayStore
from mmrl.rewards.base import RewardResult
from mmrl.samples import SAMPLES_FILE, RunSamples, group_records
from mmrl.tasks import Task
from mmrl.tasks.base import EnvTask
from mmrl.trainer.build import (
    build_algorithm,
    build_task,
    check_episode_budget,
    encode_all_prompts,
    load_policy,
    load_vision,
    lora_settings,
    pick_device,
    reference_needed,
)
from mmrl.trainer.checkpoint import latest_checkpoint, load_latest, save_checkpoint, set_aside, set_rng_state
from mmrl.trainer.config import TrainConfig, validate
from mmrl.trainer.episodes import Episode, TurnRenderer, episode_metrics, model_policy, run_episodes
from mmrl.trainer.eval_sets import EvalSet, build_eval_sets
from mmrl.trainer.evaluate import evaluate_episode_groups, evaluate_groups
from mmrl.trainer.kl_band import hold_in_band
from mmrl.trainer.loggers import RunLoggers
from mmrl.trainer.masking import masked_config
from mmrl.trainer.metrics import MetricsLog, plot_curves, read_metrics
from mmrl.trainer.rollout import (
    ROW_BY_ROW_MIN_WIDTH,
    batch_logprobs,
    encode_prompt,
    generate,
    response_logprobs,
    score_groups,
)
from mmrl.trainer.run_dir import RunDir, claim, refuse_finished
from mmrl.trainer.schedule import build_scheduler
from mmrl.trainer.sft import run_demonstrations, warm_up
from mmrl.trainer.vision_prompts import PromptCache, prompts_vision

log = logging.getLogger("mmrl")


def turn_steps(groups: list[Group]) -> algos.TurnSteps:
    """The turn layout's per-row facts (episode, step, step reward, anchor state) in ``collate``'s row order."""
    steps = [r.step for g in groups for r in g.responses]
    if any(s is None for s in steps):
        raise RuntimeError("turn layout: a response without its turn's step (episode, index, reward, anchor)")
    return algos.TurnSteps(torch.tensor([s.episode for s in steps]), torch.tensor([s.index for s in steps]),
                           torch.tensor([s.reward for s in steps], dtype=torch.float32),
                           tuple(s.anchor for s in steps),
                           torch.tensor([s.penalty for s in steps], dtype=torch.float32))


def episode_responses(responses: list[Response], turn_layout: bool) -> list[Response]:
    """The responses that each stand for one episode, for per-episode metrics (reward, success, format): all of them,
    or in the turn layout each episode's first turn. Every turn carries its episode's return, so averaged over turns
    long (mostly lost) episodes would weigh more."""
    return [r for r in responses if r.episode or not turn_layout]


class PromptSampler:
    """Shuffled epochs over the training split; its whole state goes into checkpoints."""

    def __init__(self, size: int, seed: int):
        self.size, self.rng, self.order, self.pos = size, random.Random(seed), [], 0

    def take(self, k: int) -> list[int]:
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

    def state_dict(self) -> dict[int, list[dict[str, Any]]]:
        """Each prompt's responses as plain fields (a checkpoint stores JSON values, not objects)."""
        return {k: [dataclasses.asdict(r) for r in v] for k, v in self.by_prompt.items()}

    def load_state_dict(self, state: dict[int, list[dict[str, Any]]]) -> None:
        self.by_prompt = {k: deque((_response(r) for r in v), maxlen=self.capacity) for k, v in state.items()}


def _response(fields: dict[str, Any]) -> Response:
    reward = fields.get("reward")
    return Response(**{**fields, "reward": None if reward is None else RewardResult(**reward)})


@dataclasses.dataclass
class Trainer:
    """Everything a run holds. Built by :func:`build_trainer`; :meth:`run` is the loop."""

    cfg: TrainConfig
    algo: algos.Algorithm
    task: Task | EnvTask
    tokenizer: Any
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: PromptSampler
    history: ReplayHistory
    run_dir: Path
    device: torch.device = torch.device("cpu")
    compute_dtype: torch.dtype = torch.float32
    step: int = 0
    is_moe: bool = False
    moe_experts: int = 0
    moe_top_k: int = 0
    stop_signal: int | None = None  # set by SIGINT/SIGTERM: finish the step, checkpoint, stop
    writing_checkpoint: bool = False  # a second signal now waits for the write (then stops) instead of tearing it
    stop_after_write: int | None = None  # the signal that arrived during the write
    evaluating: bool = False  # in run()'s evaluation of the step just trained (or of the model before any step)
    prompt_cache: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    vision: Any = None  # mmrl.vision.processor.VisionProcessor when the task has images
    vision_prompts: Any = None  # mmrl.trainer.vision_prompts.PromptCache of the training split
    renderer: TurnRenderer | None = None  # multi-turn tasks: the chat-template pieces of an episode
    failed_episodes: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # since the last logged step
    env_pool: Any = None  # multi-turn with rollout.env_workers > 0: the mmrl.envs.pool.EnvPool running the envs
    owner: RunDir | None = None  # the run directory's lock, held from build until run() ends
    eval_sets: list[EvalSet] = dataclasses.field(default_factory=list)  # evaluation.sets; empty: run.eval_* on task
    episodes_played: int = 0  # the turn layout: a running id for episodes, so that a batch's episode ids are unique

    def autocast(self):
        """Mixed precision: weights and optimizer state stay float32, forward passes run in ``model.dtype``."""
        return torch.autocast(self.device.type, dtype=self.compute_dtype,
                              enabled=self.compute_dtype != torch.float32)

    # ------------------------------------------------------------------------------------------- rollouts

    def prompt_ids(self, index: int) -> list[int]:
        if index not in self.prompt_cache:
            self.prompt_cache[index] = encode_prompt(self.tokenizer, self.task.train[index]["messages"],
                                                     self.cfg.rollout.max_prompt_tokens)
        return self.prompt_cache[index]

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
        with self.autocast():
            fresh = generate(self.model, self.tokenizer, prompts, r.max_new_tokens, r.temperature, r.top_p,
                             r.generation_batch_size, vision=images, sampler=r.sampler, top_k=r.top_k,
                             repetition_penalty=r.repetition_penalty)
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
        policy = model_policy(self.model, self.tokenizer, r.max_new_tokens, r.temperature, r.top_p,
                              r.generation_batch_size, kv_cache=r.episode_kv_cache and not self.turn_layout)
        with self.autocast():
            run_episodes([ep for _, _, eps in plan for ep in eps], self.renderer, policy, r.max_episode_tokens)
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

    def collect_rollouts(self) -> tuple[list[Group], dict[str, float]]:
        """One rollout batch of ``prompts_per_step`` groups, topped up by the objective's resampling rule (GPG's β_th:
        resample while too few groups are valid)."""
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
                        self.step + 1, len(valid), target, rounds, rule.valid_fraction)
        kept = valid[:target]
        kept += [g for g in last if g.all_rewards_equal][: target - len(kept)]
        return kept, {"resample_rounds": float(rounds)}

    @property
    def row_by_row_min_width(self) -> int:
        """Re-scoring and the update score text batches this wide or wider one unpadded row at a time on the CPU
        (``optim.row_by_row``; mmrl.trainer.rollout.response_logprobs); 0 = always one padded batch. Never for an MoE,
        so that π_old, π_θ and the reference all see the batch its routing was recorded on."""
        return ROW_BY_ROW_MIN_WIDTH if self.cfg.optim.row_by_row and not self.is_moe else 0

    def old_logprobs_from_update(self) -> bool:
        """π_old needs no forward of its own when the update's forward is at π_old's weights: one update per rollout,
        no replayed responses (GVPO), no routing to record (MoE), no KL-to-init metric, and an objective whose
        whole-batch statistics do not read π_old. TRL's GRPO does the same with ``num_iterations=1``."""
        o, r = self.cfg.optim, self.cfg.rollout
        return (o.epochs * o.minibatches == 1 and not r.replay_historical and not self.is_moe
                and self.ref_model is None and not self.algo.batch_stats_reads_old_logprobs)

    def prepare_batch(self, groups: list[Group]) -> tuple[RolloutBatch, dict[str, Any]]:
        batch = collate(groups, self.tokenizer.pad_token_id)
        temperature = self.cfg.rollout.temperature
        micro = self.cfg.optim.micro_batch_size or 64
        with self.autocast():
            if not self.old_logprobs_from_update():  # else left None: update() takes its own detached log-probs
                batch.old_logprobs, batch.routing = batch_logprobs(self.model, batch, temperature, micro,
                                                                   record_routing=self.is_moe,
                                                                   row_by_row_min_width=self.row_by_row_min_width)
            if self.ref_model is not None:
                batch.ref_logprobs, _ = batch_logprobs(self.ref_model, batch, temperature, micro,
                                                       row_by_row_min_width=self.row_by_row_min_width)
        if self.turn_layout:  # per turn: the episode's advantage, or the objective's own step-level one (GiGPO)
            batch.advantages = self.algo.turn_advantages(batch.rewards, batch.group_ids, turn_steps(groups))
        else:  # DAPO's overlong shaping, when set, lowers the reward the objective trains on (not the logged one)
            batch.rewards = self.algo.shaped_rewards(batch.rewards, batch.response_mask.sum(1))
            batch.advantages = self.algo.advantages(batch.rewards, batch.group_ids)
        stats = self.algo.batch_stats(batch.rewards, batch.group_ids, batch.advantages, batch.old_logprobs,
                                      batch.response_mask)
        return batch, stats

    def moe_forward(self, batch: RolloutBatch, rows: torch.Tensor, sub: RolloutBatch):
        """Training forward of an MoE: optional routing replay, router losses and routing metrics."""
        c = self.cfg.moe
        width = batch.input_ids.shape[1]
        hooks = moe.RouterHooks(self.model, (len(rows), width),
                                replay=[r[rows] for r in batch.routing] if c.routing_replay else None,
                                capture_logits=c.aux_loss_coef > 0 or c.z_loss_coef > 0)
        with hooks.active():
            logprobs, entropy = response_logprobs(self.model, batch, self.cfg.rollout.temperature,
                                                  with_entropy=True, rows=rows,
                                                  entropy_grad=self.algo.entropy_coef > 0)
        mask = sub.attention_mask
        natural = hooks.natural if c.routing_replay else hooks.routing
        extra_loss = torch.zeros((), device=logprobs.device)
        metrics = {"moe/routing_mismatch": moe.routing_mismatch(natural, sub.routing, mask)}
        metrics.update(moe.load_metrics(moe.expert_load(natural, self.moe_experts, mask)))
        if c.aux_loss_coef > 0:
            aux = moe.load_balancing_loss(hooks.logits, self.moe_top_k, sub.attention_mask)
            extra_loss = extra_loss + c.aux_loss_coef * aux
            metrics["moe/aux_loss"] = float(aux.detach())
        if c.z_loss_coef > 0:
            z = moe.z_loss(hooks.logits, sub.attention_mask)
            extra_loss = extra_loss + c.z_loss_coef * z
            metrics["moe/z_loss"] = float(z.detach())
        return logprobs, entropy, extra_loss, metrics

    # ------------------------------------------------------------------------------------------- update

    def micro_batches(self, batch: RolloutBatch, groups: torch.Tensor) -> list[torch.Tensor]:
        """Rows of each micro-batch of a mini-batch: whole groups, at most ``micro_batch_size`` responses each
        (a larger group is a micro-batch of its own)."""
        limit = self.cfg.optim.micro_batch_size
        rows_of = [(batch.group_ids == g).nonzero().squeeze(1) for g in groups.tolist()]
        if not limit:
            return [torch.cat(rows_of)]
        if self.turn_layout and not self.algo.needs_whole_groups:
            # a game's group holds every turn of its episodes (hundreds for 50-step episodes); objectives whose loss
            # reads no group statistic take it in pieces, still exact under the loss-mass weights
            return list(torch.cat(rows_of).split(limit))
        out, current = [], []
        for rows in rows_of:
            if current and sum(len(r) for r in current) + len(rows) > limit:
                out.append(torch.cat(current))
                current = []
            current.append(rows)
        return out + [torch.cat(current)]

    @property
    def router_losses(self) -> bool:
        """An MoE trained with a router loss (``moe.aux_loss_coef`` / ``moe.z_loss_coef``): a mini-batch has loss to
        step on even when no response token carries any."""
        return self.is_moe and (self.cfg.moe.aux_loss_coef > 0 or self.cfg.moe.z_loss_coef > 0)

    def update(self, batch: RolloutBatch, stats: dict[str, Any]) -> dict[str, float]:
        """K epochs over mini-batches of whole groups; one optimizer step per mini-batch, its gradient accumulated
        over micro-batches (:meth:`accumulate`). A step whose loss or gradient is not finite is skipped. With
        ``optim.target_kl`` each step is held inside the KL band (mmrl.trainer.kl_band), and a step that had to be
        shrunk ends the rollout step's updates. Ends with the KL of the updated policy to π_old over the batch."""
        o = self.cfg.optim
        params = [p for p in self.model.parameters() if p.requires_grad]
        order_rng = torch.Generator().manual_seed(self.cfg.run.seed * 1_000_003 + self.step)
        n_groups = int(batch.group_ids.max()) + 1
        sums: Counter[str] = Counter()
        updates = skipped = 0
        # one update with no π_old forward of its own: π_old is the update forward's detached log-probs, kept here
        old = batch.old_logprobs if batch.old_logprobs is not None else torch.zeros_like(batch.response_mask)
        stopped = False
        for _ in range(o.epochs):
            if stopped:
                break
            for chunk in torch.randperm(n_groups, generator=order_rng).chunk(o.minibatches):
                micro = self.micro_batches(batch, chunk)
                masses = [self.algo.loss_mass(batch.response_mask[r], batch.group_ids[r]) for r in micro]
                if sum(masses) == 0 and not self.router_losses:
                    continue  # nothing in this mini-batch carries loss (e.g. only empty responses)
                finite, step_metrics = self.accumulate(batch, stats, micro, masses, old)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, o.grad_clip) if finite else None
                if grad_norm is None or not torch.isfinite(grad_norm):
                    self.optimizer.zero_grad(set_to_none=True)  # NaN/inf never reaches the optimizer
                    skipped += 1
                    continue
                # the rate this update steps with (the scheduler's last rate once it has stepped is the next one's)
                sums.update({"lr": self.optimizer.param_groups[0]["lr"]})
                before = [p.detach().clone() for p in params] if o.target_kl else None
                self.optimizer.step()
                self.scheduler.step()
                updates += 1
                sums.update(step_metrics)
                sums.update({"grad_norm": float(grad_norm)})
                if before is not None:
                    rows = torch.cat(micro)
                    band = hold_in_band(params, before, partial(self.measure_kl, batch, old, rows), o.target_kl,
                                        o.kl_halvings)
                    sums.update({"kl_halvings": float(band.halvings), "kl_undone": float(band.undone)})
                    if band.halvings or band.undone:  # at the band's edge: further steps would only push on it
                        stopped = True
                        break
        out = {k: v / max(updates, 1) for k, v in sums.items()}
        out.update(updates=float(updates), skipped_updates=float(skipped))
        if o.target_kl:
            out["kl_early_stop"] = float(stopped)
        out["kl_step"], out["kl_step_max"] = self.measure_kl(batch, old, torch.arange(batch.size))
        return out

    def measure_kl(self, batch: RolloutBatch, old: torch.Tensor, rows: torch.Tensor) -> tuple[float, float]:
        """(mean, max) per-token k3 KL(π_θ || π_old) of the current weights on the trained tokens of ``rows``: one
        forward without gradient."""
        sub = batch.select(rows)
        with torch.no_grad(), self.autocast():
            logprobs, _ = batch_logprobs(self.model, sub, self.cfg.rollout.temperature,
                                         self.cfg.optim.micro_batch_size or 64,
                                         row_by_row_min_width=self.row_by_row_min_width)
        return kl_to_old(logprobs, old[rows], sub.response_mask)

    def accumulate(self, batch: RolloutBatch, stats: dict[str, Any], micro: list[torch.Tensor],
                   masses: list[float], old: torch.Tensor | None = None) -> tuple[bool, Counter[str]]:
        """The gradient of one mini-batch, accumulated exactly over its micro-batches (``micro``: the rows of each;
        ``masses``: each one's ``algo.loss_mass``) into the parameters' ``.grad``, for one optimizer step.

        Each micro-batch's loss is weighted by its share of the mini-batch's loss mass, its router losses by its
        share of rows, so the sum is the whole mini-batch's gradient; the metrics are weighted alike. Returns
        (finite, metrics); (False, nothing) at the first non-finite loss, with part of the gradient accumulated.
        Without π_old log-probs in ``batch`` (one update per rollout), the update's own are written into ``old``.
        """
        total, n_rows = sum(masses), sum(len(r) for r in micro)
        self.optimizer.zero_grad(set_to_none=True)
        metrics: Counter[str] = Counter()
        for rows, mass in zip(micro, masses, strict=True):
            sub = batch.select(rows).to(self.device)
            loss, router_loss, entropy, micro_metrics = self.micro_batch_loss(batch, rows, sub, stats, old)
            if not (torch.isfinite(loss) and torch.isfinite(torch.as_tensor(router_loss))):
                return False, Counter()
            share = mass / total if total else 0.0
            (loss * share + router_loss * (len(rows) / n_rows)).backward()
            mask = sub.response_mask
            token_entropy = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
            metrics.update({k: v * share for k, v in micro_metrics.items()})
            metrics.update({"loss": float(loss.detach()) * share, "entropy": token_entropy * share})
        return True, metrics

    def micro_batch_loss(self, batch: RolloutBatch, rows: torch.Tensor, sub: RolloutBatch, stats: dict[str, Any],
                         old_out: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | float, torch.Tensor, dict[str, float]]:
        """The training forward of the ``rows`` of ``batch`` (``sub``: those rows on the device) and its losses:
        (the objective's loss with its entropy bonus, the MoE router losses (0.0 for a dense model), the token
        entropy ``[B, T]``, metrics)."""
        router_loss, router_metrics = 0.0, {}
        with self.autocast():
            if self.is_moe:
                logprobs, entropy, router_loss, router_metrics = self.moe_forward(batch, rows, sub)
            else:
                logprobs, entropy = response_logprobs(self.model, batch, self.cfg.rollout.temperature,
                                                      with_entropy=True, rows=rows,
                                                      row_by_row_min_width=self.row_by_row_min_width,
                                                      entropy_grad=self.algo.entropy_coef > 0)
        old = logprobs.detach() if sub.old_logprobs is None else sub.old_logprobs
        if sub.old_logprobs is None and old_out is not None:
            old_out[rows] = old.float().cpu()
        loss, metrics = self.algo.policy_loss(
            logprobs=logprobs, old_logprobs=old, advantages=sub.advantages, mask=sub.response_mask,
            group_ids=sub.group_ids, ref_logprobs=sub.ref_logprobs, stats=stats_for_rows(stats, rows))
        metrics = {**metrics, **router_metrics}
        if self.algo.entropy_coef > 0:  # every objective: -coef × entropy, averaged as its loss
            bonus = self.algo.entropy_bonus(entropy, sub.response_mask.to(entropy.device), sub.group_ids)
            loss = loss + bonus
            metrics["entropy_bonus"] = float(bonus.detach())
        return loss, router_loss, entropy, metrics

    # ------------------------------------------------------------------------------------------- the loop

    def train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        groups, rollout_info = self.collect_rollouts()
        t_gen = time.perf_counter() - t0
        failed, self.failed_episodes = self.failed_episodes, []
        if not groups:  # every env of the step failed: nothing to learn from, the run goes on
            log.warning("step %d: every episode's env failed; no update", self.step + 1)
            return {"step": self.step + 1, "reward": float("nan"), "accuracy": float("nan"), "response_length": 0.0,
                    "updates": 0.0, **episode_metrics(failed)}
        t1 = time.perf_counter()
        batch, stats = self.prepare_batch(groups)
        t2 = time.perf_counter()
        update_metrics = self.update(batch, stats)
        elapsed = time.perf_counter() - t0

        responses = [r for g in groups for r in g.responses]
        episodes = episode_responses(responses, self.turn_layout)
        components = [r.reward.components for r in episodes]
        returns = torch.tensor([r.reward.score for r in episodes], dtype=torch.float32)  # as collate holds them
        lengths = [len(r.token_ids) for r in responses]
        reasons = Counter(r.reward.reason for r in episodes if r.reward.reason)
        record: dict[str, Any] = {
            "step": self.step + 1,  # the update this step makes: a record is labelled with the updates done after it
            "reward": float(returns.mean()),
            "reward_std": float(returns.std()) if len(returns) > 1 else 0.0,  # whole batch, ddof 1, not per group
            "accuracy": float(np.mean([c.get(self.task.accuracy_key, 0.0) >= 1.0 for c in components])),
            "response_length": float(np.mean(lengths)),  # generated tokens, the stop token counted
            "truncated_frac": float(np.mean([r.truncated for r in responses])),
            "lr": self.optimizer.param_groups[0]["lr"],  # the next update's; the update metrics' mean replaces it
            "step_time": elapsed,
            "generation_time": t_gen,  # rollouts and rewards (with GPG's resampling rounds)
            "rescoring_time": t2 - t1,  # old (and reference) log-probs of the batch
            "update_time": elapsed - (t2 - t0),  # forward, backward and optimizer steps
            "batch_tokens": float(batch.attention_mask.sum()),  # prompt + response tokens the update reads, no padding
            "tokens_per_s": sum(lengths) / max(elapsed, 1e-9),  # response tokens over the whole step's time
            "top_zero_reason": reasons.most_common(1)[0][0] if reasons else None,
        }
        if self.task.format_key:
            record["format_rate"] = float(np.mean([c.get(self.task.format_key, 0.0) >= 1.0 for c in components]))
        record.update({k: float(v) for k, v in stats.items() if isinstance(v, (int, float))})
        record.update(advantage_spread(batch.advantages, batch.group_ids))
        if batch.ref_logprobs is not None:
            kl = algos.base.kl_k3(batch.old_logprobs, batch.ref_logprobs)
            record["kl_init"] = float((kl * batch.response_mask).sum() / batch.response_mask.sum().clamp(min=1))
        if batch.routing is not None:
            load = moe.expert_load(batch.routing, self.moe_experts, batch.attention_mask)
            record["moe/expert_load"] = [[round(x, 4) for x in layer] for layer in load.tolist()]
            record.update({f"rollout_{k.split('/')[1]}": v for k, v in moe.load_metrics(load).items()})
        if self.task.multi_turn:  # success (overall, per task type), valid-action and format rates, lengths
            record.update(episode_metrics([r.episode for r in responses if r.episode] + failed))
        record.update(rollout_info)
        record.update(update_metrics)
        return record

    def checkpoint(self) -> Path:
        state = {**policy_weights(self.model, lora_settings(self.cfg)), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                 "history": self.history.state_dict()}
        self.writing_checkpoint = True
        try:
            path = save_checkpoint(self.run_dir, self.step, state, self.cfg.run.keep_checkpoints)
        finally:
            self.writing_checkpoint = False
        if self.owner is not None:  # the checkpoints pruned by keep_checkpoints leave the record with it
            self.owner.record(path, prune=path.parent)
        if self.stop_after_write is not None:
            raise Interrupted(self.stop_after_write, path)
        return path

    def restore(self, state: dict[str, Any], path: Path) -> None:
        if bool(state.get("lora")) != (lora_settings(self.cfg) is not None):
            raise UserError(f"config: {path} was written {'with' if state.get('lora') else 'without'} LoRA "
                             f"adapters; resume with the model.lora_* settings it was written with")
        load_policy_weights(self.model, state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.history.load_state_dict(state["history"])
        set_rng_state(state["rng"])
        self.step = state["step"]

    def evaluate(self, samples: RunSamples | None = None) -> dict[str, Any]:
        """``eval/<metric>`` on the task's held-out split with ``run.eval_*``; with ``evaluation.sets``,
        ``eval/<set>/<metric>`` per set with the set's own sampling, and ``eval/average`` of the sets' headlines.
        The completions of the first ``run.eval_sample_prompts`` problems (of the first set) go to ``samples``."""
        r, rc = self.cfg.run, self.cfg.rollout
        if not self.eval_sets:
            result, groups = self.evaluate_task(self.task, r.eval_samples, r.eval_temperature, 1.0, rc.max_new_tokens)
            out = {f"eval/{k}": v for k, v in result.items()}
        else:
            out, groups = {}, None
            for s in self.eval_sets:
                c = s.config
                result, set_groups = self.evaluate_task(s.task, c.samples, c.temperature, c.top_p,
                                                        s.max_new_tokens(self.cfg), c.repetition_penalty)
                groups = set_groups if groups is None else groups
                out.update({f"eval/{s.name}/{k}": v for k, v in result.items()})
            out["eval/average"] = (sum(out[f"eval/{s.name}/{s.config.metric}"] for s in self.eval_sets)
                                   / len(self.eval_sets))
        if samples is not None and r.eval_sample_prompts:
            samples.append(group_records(groups, step=self.step, max_prompts=r.eval_sample_prompts))
        return out

    def evaluate_task(self, task: Task | EnvTask, k: int, temperature: float, top_p: float, max_new_tokens: int,
                      repetition_penalty: float = 1.0) -> tuple[dict[str, Any], list[Group]]:
        rc = self.cfg.rollout
        with self.autocast():
            if task.multi_turn:
                return evaluate_episode_groups(
                    self.model, self.tokenizer, task, k=k, temperature=temperature, top_p=top_p,
                    max_new_tokens=max_new_tokens, max_episode_tokens=rc.max_episode_tokens, seed=self.cfg.run.seed,
                    batch_size=rc.generation_batch_size, env_factory=self.env_factory,
                    kv_cache=rc.episode_kv_cache and not self.turn_layout, layout=rc.agent_layout)
            return evaluate_groups(
                self.model, self.tokenizer, task, k=k, temperature=temperature, top_p=top_p,
                max_new_tokens=max_new_tokens, max_prompt_tokens=rc.max_prompt_tokens, seed=self.cfg.run.seed,
                batch_size=rc.generation_batch_size, vision=self.vision, sampler=rc.sampler,
                repetition_penalty=repetition_penalty)

    def run(self) -> dict[str, Any]:
        """Train until ``run.steps``; on SIGINT/SIGTERM finish the step, checkpoint and stop."""
        cfg = self.cfg
        # the first step a resumed run logs again: records up to its checkpoint's step stay
        resume_step = self.step + 1 if cfg.run.resume else None
        if self.owner is not None:  # recorded before they are written: a later --run.overwrite removes them
            self.owner.record("metrics.jsonl", SAMPLES_FILE, *RunLoggers.names(cfg.run.wandb))
        metrics = MetricsLog(self.run_dir / "metrics.jsonl", resume_step=resume_step)
        samples = RunSamples(self.run_dir, resume_step=resume_step)
        loggers = RunLoggers(self.run_dir, cfg.run.tensorboard, cfg.run.wandb, masked_config(cfg.to_dict()),
                             resume_step)
        if self.owner is not None and loggers.event_files:  # TensorBoard names its files as it creates them
            self.owner.record(*loggers.event_files)
        previous = {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        bar = tqdm(total=cfg.run.steps, initial=self.step, disable=not cfg.run.progress, desc=f"{cfg.algo.name}",
                   unit="step", dynamic_ncols=True)
        last: dict[str, Any] = {}
        try:
            if cfg.run.eval_every and self.step == 0:  # the curve's start: the model before any update
                with self.evaluation():
                    start = {"step": 0, **self.evaluate()}
                metrics.write(start)
                loggers.write(start)
            while self.step < cfg.run.steps and self.stop_signal is None:
                record = self.train_step()
                self.step += 1
                if (cfg.run.eval_every and self.step % cfg.run.eval_every == 0) or self.step == cfg.run.steps:
                    with self.evaluation():
                        record.update(self.evaluate(samples))
                metrics.write(record)
                loggers.write(record)
                last = record
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward']:.3f}", acc=f"{record['accuracy']:.2f}",
                                len=f"{record['response_length']:.1f}")
                due = cfg.run.checkpoint_every and self.step % cfg.run.checkpoint_every == 0
                if due or self.stop_signal is not None or self.step == cfg.run.steps:
                    self.checkpoint()
            if cfg.run.plot:
                if self.owner is not None:
                    self.owner.record("curves.png")
                plot_curves(read_metrics(self.run_dir / "metrics.jsonl"), self.run_dir / "curves.png",
                            f"{cfg.algo.name} on {cfg.task.name} ({cfg.model.name})")
        finally:
            bar.close()
            loggers.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.env_pool is not None:
                self.env_pool.close()
            if self.owner is not None:
                self.owner.lock.release()
        return last

    def _request_stop(self, signum, frame) -> None:
        if self.writing_checkpoint:  # never torn: the first signal stops the loop after it, a second one raises then
            log.warning("signal %d: the checkpoint of step %d is being written; stopping when it is complete",
                        signum, self.step)
            if self.stop_signal is None:
                self.stop_signal = signum
            else:
                self.stop_after_write = signum
            return
        if self.stop_signal is not None:  # a second signal: stop now, the last checkpoint stays valid
            raise Interrupted(signum, latest_checkpoint(self.run_dir))
        log.warning("signal %d: %s", signum, self.stop_message())
        self.stop_signal = signum

    @contextlib.contextmanager
    def evaluation(self):
        self.evaluating = True
        try:
            yield
        finally:
            self.evaluating = False

    def stop_message(self) -> str:
        """What a first stop signal lets finish. The step counter is advanced before the step's evaluation, so
        during one it already names the step being finished; before the first step nothing is checkpointed."""
        if not self.evaluating and self.step >= self.cfg.run.steps:  # after the last step: its files are written
            return f"step {self.step} was the last; finishing the run's files, then stopping"
        if not self.evaluating:
            return f"finishing step {self.step + 1}, then checkpointing and stopping"
        if self.step == 0:
            return "finishing the evaluation before the first step, then stopping"
        if self.step >= self.cfg.run.steps:
            return f"finishing the final evaluation (step {self.step}), then checkpointing and stopping"
        return f"finishing the evaluation of step {self.step}, then checkpointing and stopping"


# ----------------------------------------------------------------------------------------------- building
#
# build_trainer runs the set-up phases below in this order. Everything that can be refused without a model is
# refused before the run directory is claimed; the claim comes before the first model load (a second run into the
# same --out stops in seconds), and a start refused after the claim leaves no new folder behind.


def build_trainer(cfg: TrainConfig) -> Trainer:
    """The run of ``cfg``, ready to :meth:`~Trainer.run`; bad input fails with one line."""
    validate(cfg)
    task, eval_sets = _setup_task(cfg)
    algo = _setup_objective(cfg, task)
    owner = claim(cfg)  # locked for this run; refuses a foreign folder or a resume that changes what is trained
    try:
        return _build_claimed(cfg, task, eval_sets, algo, owner)
    except BaseException:
        owner.abandon()  # a start refused after the claim leaves no new folder behind
        raise


def _build_claimed(cfg: TrainConfig, task: Task | EnvTask, eval_sets: list[EvalSet], algo: algos.Algorithm,
                   owner: RunDir) -> Trainer:
    """The phases that run in the claimed directory ``owner``, in order."""
    resumed = _read_resumed(cfg, owner)
    _setup_seeds(cfg)
    policy = _setup_policy(cfg, task)
    if not cfg.run.resume:  # a fresh run must never resume or prune into an earlier one's checkpoints
        owner.clear_previous()  # only what that run recorded; anything else stays (and is named)
    if cfg.sft.steps and not cfg.run.resume:  # before the reference copy: RL starts from (and is anchored to) SFT
        _setup_sft_warmup(cfg, task, policy, owner)
    ref_model = _setup_reference(cfg, algo, policy)
    optimizer, scheduler = _setup_optimizer(cfg, policy.model)
    with contextlib.ExitStack() as on_failure:
        env_pool = _setup_env_pool(cfg, task)  # last: a refusal before it leaves no worker processes to stop
        if env_pool is not None:  # a refused resume or a failed config.json write leaves no worker behind
            on_failure.callback(env_pool.close)
        trainer = Trainer(cfg, algo, task, policy.tokenizer, policy.model, ref_model, optimizer, scheduler,
                          PromptSampler(len(task.train), cfg.run.seed),
                          ReplayHistory(cfg.rollout.samples_per_prompt if cfg.rollout.replay_historical else 0),
                          owner.path, policy.device, policy.compute_dtype, prompt_cache=policy.prompt_cache,
                          renderer=policy.renderer, env_pool=env_pool, is_moe=bool(policy.routers),
                          moe_experts=max((r.num_experts for _, r in policy.routers), default=0),
                          moe_top_k=policy.routers[0][1].top_k if policy.routers else 0, vision=policy.vision,
                          eval_sets=eval_sets, vision_prompts=_vision_prompts(cfg, task, policy.vision),
                          owner=owner)
        log.info("task %s: %s", task.name, task.description)
        if resumed is not None:
            _restore_resumed(cfg, trainer, resumed)
        owner.record_config(cfg, trainer.step)
        on_failure.pop_all()  # started: from here the trainer owns the pool, and Trainer.run closes it
    return trainer


def _setup_task(cfg: TrainConfig) -> tuple[Task | EnvTask, list[EvalSet]]:
    """The task with its reward, and the named evaluation sets (``evaluation.sets``; empty: ``run.eval_*`` on the
    task's held-out split). Needs a validated config; checks every option that depends on the task's kind."""
    task = build_task(cfg)
    return task, build_eval_sets(cfg, task)


def _setup_objective(cfg: TrainConfig, task: Task | EnvTask) -> algos.Algorithm:
    """The objective, built as the openrlhf backend builds it, and the checks of the local loop's settings against
    it: a refusal is one line, a setting that works against it a warning."""
    algo = build_algorithm(cfg, task.multi_turn)
    if cfg.model.lora_rank and cfg.sft.steps and reference_needed(algo, cfg):
        raise UserError("config: model.lora_rank with sft.steps and a reference model: the reference would be the "
                         "base before the warm-up, not the warmed-up policy; use a full fine-tune or no KL")
    if algo.on_policy_only and cfg.optim.epochs * cfg.optim.minibatches > 1:
        log.warning("%s has no importance ratio: with %d updates per rollout it is off-policy after the first",
                    algo.name, cfg.optim.epochs * cfg.optim.minibatches)
    modified = {"rollout.top_k": cfg.rollout.top_k != 0,
                "rollout.repetition_penalty": cfg.rollout.repetition_penalty != 1.0}
    for name, is_set in modified.items():
        if is_set and task.multi_turn:
            raise UserError(f"config: {name} is not available for multi-turn tasks on the local backend (its "
                             f"episode sampler draws from the tempered policy and top_p only)")
    if cfg.rollout.top_p < 1 or any(modified.values()):
        log.warning("rollout.top_p < 1, rollout.top_k > 0 or rollout.repetition_penalty != 1: responses are sampled "
                    "from a modified distribution but scored under the full one; ratio-free objectives (gpg, gvpo) "
                    "get a biased gradient")
    return algo


def _read_resumed(cfg: TrainConfig, owner: RunDir) -> tuple[Path, dict[str, Any], list[Path]] | None:
    """With ``run.resume``, the newest usable checkpoint of the claimed directory as (path, state, unreadable newer
    ones); None for a fresh run. Read before any model is built: a checkpoint that cannot be used (damaged, an
    older mmrl's) fails in seconds."""
    return load_latest(owner.path) if cfg.run.resume else None


def _setup_seeds(cfg: TrainConfig) -> None:
    """CPU threads (``model.threads``) and every random generator seeded from ``run.seed``, before any weight or
    sample is drawn."""
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)


@dataclasses.dataclass
class Policy:
    """What the policy phase builds: the model to train and everything that turns samples into its tokens."""

    model: torch.nn.Module  # float32 master weights on ``device``, in train mode, LoRA-wrapped when asked
    tokenizer: Any
    device: torch.device
    compute_dtype: torch.dtype  # the forward passes' precision (``model.dtype``)
    vision: Any  # the VisionProcessor of a task with images, else None
    renderer: TurnRenderer | None  # multi-turn tasks: the chat-template pieces of an episode
    prompt_cache: dict[int, list[int]]  # text tasks: every training prompt's ids, encoded and checked at start
    routers: list[tuple[str, Any]]  # an MoE's router modules (empty for a dense model)
    lora: LoraSettings | None  # the adapters ``model`` trains (None: a full fine-tune)


def _setup_policy(cfg: TrainConfig, task: Task | EnvTask) -> Policy:
    """Device, vision processor, tokenizer and prompt checks, then the model with its MoE router options, gradient
    checkpointing and LoRA adapters. Needs the task (its prompts are checked against ``rollout.*`` budgets before the
    model loads)."""
    device = pick_device(cfg.model.device)
    vision = load_vision(cfg, task)  # None for a text task
    tokenizer = load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
    renderer, prompt_cache = _setup_prompts(cfg, task, tokenizer, vision)
    model = load_policy(cfg, device)
    routers = _setup_routers(cfg, model)
    model.train()  # train mode only for gradient checkpointing; dropout is off
    if cfg.model.gradient_checkpointing:  # transformers 5.24 renamed it; older releases know only the old name
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    lora = lora_settings(cfg)
    if lora is not None:  # only the adapters train; the frozen base is the reference (_setup_reference)
        model = add_lora(model, lora, cfg.model.gradient_checkpointing)
    return Policy(model, tokenizer, device, getattr(torch, cfg.model.dtype), vision, renderer, prompt_cache, routers,
                  lora)


def _setup_prompts(cfg: TrainConfig, task: Task | EnvTask, tokenizer,
                   vision) -> tuple[TurnRenderer | None, dict[int, list[int]]]:
    """(episode renderer, prompt cache): a multi-turn task's first game must leave room for a turn; a text task's
    prompts are encoded now, failing on the first one longer than ``rollout.max_prompt_tokens``; image prompts are
    encoded lazily (their lengths were checked by ``load_vision``)."""
    if task.multi_turn:
        renderer = TurnRenderer(tokenizer, task.system_prompt)
        check_episode_budget(task, renderer, cfg)
        return renderer, {}
    if vision is not None:
        return None, {}
    return None, encode_all_prompts(task, tokenizer, cfg.rollout.max_prompt_tokens)


def _setup_routers(cfg: TrainConfig, model: torch.nn.Module) -> list[tuple[str, Any]]:
    """An MoE's routers with the ``moe.*`` options applied (routing replay checked, routers frozen); ``moe.*`` set on
    a dense model is one line."""
    routers = moe.find_routers(model)
    if not routers and cfg.moe != type(cfg.moe)():
        raise UserError(f"config: moe.* options are set but {cfg.model.name!r} has no MoE router")
    if routers and cfg.moe.routing_replay:
        moe.check_replayable(model)
    if routers and cfg.moe.freeze_router:
        moe.freeze_routers(model)
    return routers


def _vision_prompts(cfg: TrainConfig, task: Task | EnvTask, vision) -> PromptCache | None:
    """The training split's image prompts, encoded lazily through ``vision`` (None for a text task)."""
    return None if vision is None else PromptCache(vision, task.train, "train", cfg.rollout.max_prompt_tokens)


def _setup_sft_warmup(cfg: TrainConfig, task: EnvTask, policy: Policy, owner: RunDir) -> None:
    """The supervised warm-up (``sft.steps``) of a fresh run's policy, in place; its losses go to ``sft.jsonl``."""
    demos = run_demonstrations(cfg, task, policy.tokenizer)
    owner.record("sft.jsonl")
    autocast = lambda: torch.autocast(policy.device.type, dtype=policy.compute_dtype,  # noqa: E731
                                      enabled=policy.compute_dtype != torch.float32)
    warm_up(cfg, demos, policy.tokenizer, policy.model, owner.path / "sft.jsonl", autocast)


def _setup_reference(cfg: TrainConfig, algo: algos.Algorithm, policy: Policy) -> torch.nn.Module | None:
    """The frozen initial policy when the objective reads reference log-probs or KL to it is tracked (None
    otherwise): the LoRA base under the adapters, or a copy of the (warmed-up) model."""
    if not reference_needed(algo, cfg):
        return None
    if policy.lora is not None:
        return FrozenBase(policy.model)
    return copy.deepcopy(policy.model).requires_grad_(False).eval()


def _setup_optimizer(cfg: TrainConfig, model: torch.nn.Module
                     ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over the trainable parameters and its schedule (``optim.*``), one scheduler step per optimizer step:
    ``run.steps`` × epochs × mini-batches in all."""
    o = cfg.optim
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=o.lr, betas=o.betas,
                                  weight_decay=o.weight_decay)
    scheduler = build_scheduler(optimizer, o.schedule, o.warmup_steps, cfg.run.steps * o.epochs * o.minibatches,
                                o.min_lr_ratio)
    return optimizer, scheduler


def _setup_env_pool(cfg: TrainConfig, task: Task | EnvTask):
    """The worker processes that run a multi-turn task's envs (``rollout.env_workers``); None to run them in this
    process."""
    if not (task.multi_turn and cfg.rollout.env_workers):
        return None
    from mmrl.envs.pool import EnvPool

    return EnvPool(task.env_class, cfg.rollout.env_workers, step_timeout=cfg.rollout.env_step_timeout)


def _restore_resumed(cfg: TrainConfig, trainer: Trainer, resumed: tuple[Path, dict[str, Any], list[Path]]) -> None:
    """The state of the checkpoint ``_read_resumed`` found, loaded into ``trainer``; the unreadable newer ones are
    set aside, and a resume of a run that is already finished is one line."""
    existing, state, unreadable = resumed
    for path in unreadable:
        log.warning("set aside as %s", set_aside(path))
    trainer.restore(state, existing)
    refuse_finished(cfg, trainer.step, existing)
    log.info("resumed from %s at step %d", existing, trainer.step)


def train(cfg: TrainConfig) -> tuple[dict[str, Any], Trainer]:
    """Build and run; returns the last step's metrics and the trainer (``trainer.stop_signal`` if interrupted)."""
    trainer = build_trainer(cfg)
    last = trainer.run()
    if trainer.stop_signal is not None and trainer.step < cfg.run.steps:
        print(f"interrupted by signal {trainer.stop_signal} at step {trainer.step}; "
              f"{checkpoint_note(latest_checkpoint(trainer.run_dir))}", file=sys.stderr)
    return last, trainer
