"""The local trainer: one process, CPU or one GPU, readable top to bottom.

    for step in steps:
        groups  = sample prompts -> generate n responses each -> rewards        (collect_rollouts: collect.py)
        batch   = collate(groups); old (and ref) log-probs; advantages; batch stats   (prepare_batch: learner.py)
        for epoch in K: for mini-batch of whole groups: loss -> backward -> clip -> AdamW step   (update: learner.py)
        record  = the step's metrics                                              (step_record: step_metrics.py)
        maybe evaluate; maybe checkpoint; stop on a signal                        (run; stop.py)

Multi-turn tasks (``task.multi_turn``, e.g. ALFWorld) differ only in how groups are made: a group is n episodes of one
game played turn by turn (mmrl/trainer/episodes.py). In the episode layout each episode is one response whose env
tokens are masked out of the loss; in the turn layout (``rollout.agent_layout turn``) each env step is a row of its
own. The rest of the loop is the same. They may start with a supervised warm-up on expert demonstrations
(mmrl/trainer/sft.py).

The run's objects (task and reward, objective, model, tokenizer, vision processor) come from the backend-neutral
build layer (mmrl/run/build.py), as for the OpenRLHF backend. This file knows no objective by name: what one needs
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
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import mmrl.algos as algos
from mmrl import moe
from mmrl.batch import Group, RolloutBatch
from mmrl.envs.episode import TurnRenderer
from mmrl.errors import Interrupted, UserError, checkpoint_note
from mmrl.models import load_tokenizer
from mmrl.models.lora import FrozenBase, add_lora, load_policy_weights, policy_weights
from mmrl.run.build import (
    check_episode_budget,
    encode_all_prompts,
    load_policy,
    load_vision,
    lora_settings,
    pick_device,
    reference_needed,
    resolve_run,
)
from mmrl.run.checkpoint import latest_checkpoint, load_latest, save_checkpoint, set_aside, set_rng_state
from mmrl.run.config import ModelConfig, MoEConfig, OptimConfig, RolloutConfig, RunConfig, SFTConfig, TrainConfig
from mmrl.run.eval_sets import EvalSet
from mmrl.run.loggers import RunLoggers
from mmrl.run.masking import masked_config
from mmrl.run.metrics import MetricsLog, plot_curves, read_metrics
from mmrl.run.run_dir import RunDir, claim, refuse_edited_config, refuse_finished
from mmrl.run.schedule import build_scheduler
from mmrl.samples import SAMPLES_FILE, RunSamples, group_records
from mmrl.tasks import Task
from mmrl.tasks.base import EnvTask, GeneratedRows
from mmrl.trainer.collect import PromptSampler, ReplayHistory, Rollouts
from mmrl.trainer.episodes import episode_metrics
from mmrl.trainer.evaluate import evaluate_episode_groups, evaluate_groups
from mmrl.trainer.learner import Learner
from mmrl.trainer.policy import Policy
from mmrl.trainer.sft import run_demonstrations, warm_up
from mmrl.trainer.step_metrics import step_record
from mmrl.trainer.stop import StopSignals
from mmrl.trainer.vision_prompts import PromptCache

log = logging.getLogger("mmrl")


@dataclasses.dataclass
class Trainer:
    """A run: the policy, its rollout and learner parts, the stop signals. Built by :func:`build_trainer`;
    :meth:`run` is the loop, :meth:`train_step` one step of it."""

    cfg: TrainConfig
    algo: algos.Algorithm
    task: Task | EnvTask
    policy: Policy
    rollouts: Rollouts  # sampling, the replay history, the env pool
    learner: Learner  # the batch prepared for the update, the update
    run_dir: Path
    step: int = 0
    stops: StopSignals = dataclasses.field(default_factory=StopSignals)
    owner: RunDir | None = None  # the run directory's lock, held from build until run() ends
    eval_sets: list[EvalSet] = dataclasses.field(default_factory=list)  # evaluation.sets; empty: run.eval_* on task

    # the parts' objects a caller reads most, by their plain names
    model = property(lambda self: self.policy.model)
    tokenizer = property(lambda self: self.policy.tokenizer)
    optimizer = property(lambda self: self.learner.optimizer)
    scheduler = property(lambda self: self.learner.scheduler)
    stop_signal = property(lambda self: self.stops.signal)

    def collect_rollouts(self) -> tuple[list[Group], dict[str, float]]:
        return self.rollouts.collect(self.step)

    def prepare_batch(self, groups: list[Group]) -> tuple[RolloutBatch, dict[str, Any]]:
        return self.learner.prepare_batch(groups)

    def update(self, batch: RolloutBatch, stats: dict[str, Any]) -> dict[str, float]:
        return self.learner.update(batch, stats, self.step)

    def train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        groups, rollout_info = self.collect_rollouts()
        t_gen = time.perf_counter() - t0
        failed, self.rollouts.failed_episodes = self.rollouts.failed_episodes, []
        if not groups:  # every env of the step failed: nothing to learn from, the run goes on
            log.warning("step %d: every episode's env failed; no update", self.step + 1)
            return {"step": self.step + 1, "reward": float("nan"), "accuracy": float("nan"), "response_length": 0.0,
                    "updates": 0.0, **episode_metrics(failed)}
        t1 = time.perf_counter()
        batch, stats = self.prepare_batch(groups)
        t2 = time.perf_counter()
        update_metrics = self.update(batch, stats)
        elapsed = time.perf_counter() - t0
        times = {"step": elapsed, "generation": t_gen, "rescoring": t2 - t1, "update": elapsed - (t2 - t0)}
        return step_record(self.step, self.task, groups, batch, stats, failed, times,
                           self.optimizer.param_groups[0]["lr"], self.rollouts.turn_layout, self.policy.moe_experts,
                           rollout_info, update_metrics)

    def checkpoint(self) -> Path:
        state = {**policy_weights(self.policy.model, self.policy.lora), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "sampler": self.rollouts.sampler.state_dict(),
                 "history": self.rollouts.history.state_dict(),
                 # the config the weights are trained under: a resume refuses a config.json edited since
                 "config": masked_config(self.cfg.to_dict())}
        self.stops.writing_checkpoint = True
        try:
            path = save_checkpoint(self.run_dir, self.step, state, self.cfg.run.keep_checkpoints)
        finally:
            self.stops.writing_checkpoint = False
        if self.owner is not None:  # the checkpoints pruned by keep_checkpoints leave the record with it
            self.owner.record(path, prune=path.parent)
        if self.stops.after_write is not None:
            raise Interrupted(self.stops.after_write, path)
        return path

    def restore(self, state: dict[str, Any], path: Path) -> None:
        if bool(state.get("lora")) != (lora_settings(self.cfg.model) is not None):
            raise UserError(f"config: {path} was written {'with' if state.get('lora') else 'without'} LoRA "
                             f"adapters; resume with the model.lora_* settings it was written with")
        load_policy_weights(self.policy.model, state, path)
        self.learner.optimizer.load_state_dict(state["optimizer"])
        self.learner.scheduler.load_state_dict(state["scheduler"])
        self.rollouts.sampler.load_state_dict(state["sampler"])
        self.rollouts.history.load_state_dict(state["history"])
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
        with self.policy.autocast():
            if task.multi_turn:
                return evaluate_episode_groups(
                    self.policy.model, self.policy.tokenizer, task, k=k, temperature=temperature, top_p=top_p,
                    max_new_tokens=max_new_tokens, max_episode_tokens=rc.max_episode_tokens, seed=self.cfg.run.seed,
                    batch_size=rc.generation_batch_size, env_factory=self.rollouts.env_factory,
                    kv_cache=rc.episode_kv_cache and not self.rollouts.turn_layout, layout=rc.agent_layout)
            return evaluate_groups(
                self.policy.model, self.policy.tokenizer, task, k=k, temperature=temperature, top_p=top_p,
                max_new_tokens=max_new_tokens, max_prompt_tokens=rc.max_prompt_tokens, seed=self.cfg.run.seed,
                batch_size=rc.generation_batch_size, vision=self.policy.vision, sampler=rc.sampler,
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
                with self.stops.evaluation():
                    start = {"step": 0, **self.evaluate()}
                metrics.write(start)
                loggers.write(start)
            while self.step < cfg.run.steps and self.stops.signal is None:
                record = self.train_step()
                self.step += 1
                if (cfg.run.eval_every and self.step % cfg.run.eval_every == 0) or self.step == cfg.run.steps:
                    with self.stops.evaluation():
                        record.update(self.evaluate(samples))
                metrics.write(record)
                loggers.write(record)
                last = record
                bar.update(1)
                bar.set_postfix(reward=f"{record['reward']:.3f}", acc=f"{record['accuracy']:.2f}",
                                len=f"{record['response_length']:.1f}")
                due = cfg.run.checkpoint_every and self.step % cfg.run.checkpoint_every == 0
                if due or self.stops.signal is not None or self.step == cfg.run.steps:
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
            if self.rollouts.env_pool is not None:
                self.rollouts.env_pool.close()
            if self.owner is not None:
                self.owner.lock.release()
        return last

    def _request_stop(self, signum, frame) -> None:
        self.stops.request(signum, self.step, self.cfg.run.steps, self.run_dir)

    def stop_message(self) -> str:
        return self.stops.message(self.step, self.cfg.run.steps)


# ----------------------------------------------------------------------------------------------- building
#
# build_trainer runs the set-up phases below in this order. Everything that can be refused without a model is
# refused before the run directory is claimed; the claim comes before the first model load (a second run into the
# same --out stops in seconds), and a start refused after the claim leaves no new folder behind.


def build_trainer(cfg: TrainConfig) -> Trainer:
    """The run of ``cfg``, ready to :meth:`~Trainer.run`; bad input fails with one line."""
    run = resolve_run(cfg)
    task, eval_sets, algo = run.task, run.eval_sets, run.algo
    _check_objective(cfg, task, algo)
    owner = claim(cfg)  # locked for this run; refuses a foreign folder or a resume that changes what is trained
    try:
        return _build_claimed(cfg, task, eval_sets, algo, owner)
    except BaseException:
        owner.abandon()  # a start refused after the claim leaves no new folder behind
        raise


def _build_claimed(cfg: TrainConfig, task: Task | EnvTask, eval_sets: list[EvalSet], algo: algos.Algorithm,
                   owner: RunDir) -> Trainer:
    """The phases that run in the claimed directory ``owner``, in order."""
    resumed = _read_resumed(cfg.run, owner)
    _setup_seeds(cfg.run.seed, cfg.model.threads)
    device = pick_device(cfg.model.device)  # first: a device that is not there is refused before anything loads
    prompts = _setup_prompts(cfg.model, cfg.rollout, task, cfg.run.seed)
    policy = _setup_policy(cfg.model, cfg.moe, device, prompts)
    if not cfg.run.resume:  # a fresh run must never resume or prune into an earlier one's checkpoints
        owner.clear_previous()  # only what that run recorded; anything else stays (and is named)
    if cfg.sft.steps and not cfg.run.resume:  # before the reference copy: RL starts from (and is anchored to) SFT
        _setup_sft_warmup(cfg.sft, cfg.rollout, task, policy, owner, seed=cfg.run.seed, progress=cfg.run.progress,
                          row_by_row=cfg.optim.row_by_row)
    ref_model = _setup_reference(reference_needed(algo, cfg), policy)
    optimizer, scheduler = _setup_optimizer(cfg.optim, policy.model, cfg.run.steps)
    with contextlib.ExitStack() as on_failure:
        env_pool = _setup_env_pool(cfg.rollout, task)  # last: a refusal before it leaves no worker processes to stop
        if env_pool is not None:  # a refused resume or a failed config.json write leaves no worker behind
            on_failure.callback(env_pool.close)
        sampler = PromptSampler(len(task.train), cfg.run.seed, endless=isinstance(task.train, GeneratedRows))
        rollouts = Rollouts(cfg, algo, task, policy, sampler,
                            ReplayHistory(cfg.rollout.samples_per_prompt if cfg.rollout.replay_historical else 0),
                            _vision_prompts(cfg.rollout, task, policy.vision), env_pool)
        learner = Learner(cfg, algo, policy, ref_model, optimizer, scheduler, rollouts.turn_layout)
        trainer = Trainer(cfg, algo, task, policy, rollouts, learner, owner.path, owner=owner, eval_sets=eval_sets)
        log.info("task %s: %s", task.name, task.description)
        if resumed is not None:
            _restore_resumed(cfg.run, trainer, resumed)
        owner.record_config(cfg, trainer.step)
        on_failure.pop_all()  # started: from here the trainer owns the pool, and Trainer.run closes it
    return trainer


def _check_objective(cfg: TrainConfig, task: Task | EnvTask, algo: algos.Algorithm) -> None:
    """The checks of the local loop's settings against the objective (`mmrl.run.build.resolve_run` built it, as
    for the openrlhf backend): a refusal is one line, a setting that works against it a warning."""
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


def _read_resumed(cfg_run: RunConfig, owner: RunDir) -> tuple[Path, dict[str, Any], list[Path]] | None:
    """With ``run.resume``, the newest usable checkpoint of the claimed directory as (path, state, unreadable newer
    ones); None for a fresh run. Read before any model is built: a checkpoint that cannot be used (damaged, an
    older mmrl's) fails in seconds."""
    return load_latest(owner.path) if cfg_run.resume else None


def _setup_seeds(seed: int, threads: int) -> None:
    """CPU threads (``model.threads``) and every random generator seeded from ``run.seed``, before any weight or
    sample is drawn."""
    if threads:
        torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _Prompts(NamedTuple):
    """What turns the task's samples into the policy's tokens, set up and checked before the model loads."""

    tokenizer: Any
    vision: Any  # the VisionProcessor of a task with images, else None
    renderer: TurnRenderer | None  # multi-turn tasks: the chat-template pieces of an episode
    cache: dict[int, list[int]]  # text tasks: every training prompt's ids


def _setup_prompts(cfg_model: ModelConfig, cfg_rollout: RolloutConfig, task: Task | EnvTask, seed: int) -> _Prompts:
    """The vision processor and tokenizer of ``model.*``, and the task's prompts checked against the ``rollout.*``
    budgets before the model loads: a multi-turn task's first game (reset with ``seed``, ``run.seed``) must leave room
    for a turn; a text task's prompts are encoded now, failing on the first one longer than
    ``rollout.max_prompt_tokens``; image prompts are encoded lazily (their lengths were checked by ``load_vision``)."""
    vision = load_vision(cfg_model, task, cfg_rollout.max_prompt_tokens)  # None for a text task
    tokenizer = load_tokenizer(cfg_model.name, cfg_model.trust_remote_code)
    if task.multi_turn:
        renderer = TurnRenderer(tokenizer, task.system_prompt)
        check_episode_budget(task, renderer, cfg_rollout, seed)
        return _Prompts(tokenizer, vision, renderer, {})
    if vision is not None:
        return _Prompts(tokenizer, vision, None, {})
    return _Prompts(tokenizer, vision, None, encode_all_prompts(task, tokenizer, cfg_rollout.max_prompt_tokens))


def _setup_policy(cfg_model: ModelConfig, cfg_moe: MoEConfig, device: torch.device, prompts: _Prompts) -> Policy:
    """The model of ``model.*`` on ``device`` with its MoE router options (``moe.*``), gradient checkpointing and
    LoRA adapters, with the tokenizer, vision processor and prompt cache of :func:`_setup_prompts`."""
    model = load_policy(cfg_model, device)
    routers = _setup_routers(cfg_moe, model, cfg_model.name)
    model.train()  # train mode only for gradient checkpointing; dropout is off
    if cfg_model.gradient_checkpointing:  # transformers 5.24 renamed it; older releases know only the old name
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    lora = lora_settings(cfg_model)
    if lora is not None:  # only the adapters train; the frozen base is the reference (_setup_reference)
        model = add_lora(model, lora, cfg_model.gradient_checkpointing)
    return Policy(model, prompts.tokenizer, device, getattr(torch, cfg_model.dtype), prompts.vision, prompts.renderer,
                  prompts.cache, routers, lora)


def _setup_routers(cfg_moe: MoEConfig, model: torch.nn.Module, model_name: str) -> list[tuple[str, Any]]:
    """An MoE's routers with the ``moe.*`` options applied (routing replay checked, routers frozen); ``moe.*`` set on
    a dense model is one line."""
    routers = moe.find_routers(model)
    if not routers and cfg_moe != type(cfg_moe)():
        raise UserError(f"config: moe.* options are set but {model_name!r} has no MoE router")
    if routers and cfg_moe.routing_replay:
        moe.check_replayable(model)
    if routers and cfg_moe.freeze_router:
        moe.freeze_routers(model)
    return routers


def _vision_prompts(cfg_rollout: RolloutConfig, task: Task | EnvTask, vision) -> PromptCache | None:
    """The training split's image prompts, encoded lazily through ``vision`` (None for a text task)."""
    return None if vision is None else PromptCache(vision, task.train, "train", cfg_rollout.max_prompt_tokens)


def _setup_sft_warmup(cfg_sft: SFTConfig, cfg_rollout: RolloutConfig, task: EnvTask, policy: Policy, owner: RunDir,
                      *, seed: int, progress: bool, row_by_row: bool) -> None:
    """The supervised warm-up (``sft.*``) of a fresh run's policy, in place, on demonstrations in the run's agent
    layout and episode budget (``rollout.*``); its losses go to ``sft.jsonl``. ``seed`` is ``run.seed``,
    ``progress`` ``run.progress``, ``row_by_row`` ``optim.row_by_row``."""
    demos = run_demonstrations(cfg_sft, cfg_rollout, task, policy.tokenizer, seed)
    owner.record("sft.jsonl")
    warm_up(cfg_sft, demos, policy.tokenizer, policy.model, owner.path / "sft.jsonl", policy.autocast, seed=seed,
            progress=progress, row_by_row=row_by_row)


def _setup_reference(needed: bool, policy: Policy) -> torch.nn.Module | None:
    """The frozen initial policy when ``needed`` (the objective reads reference log-probs or KL to it is tracked;
    `mmrl.run.build.reference_needed`), else None: the LoRA base under the adapters, or a copy of the (warmed-up)
    model."""
    if not needed:
        return None
    if policy.lora is not None:
        return FrozenBase(policy.model)
    return copy.deepcopy(policy.model).requires_grad_(False).eval()


def _setup_optimizer(cfg_optim: OptimConfig, model: torch.nn.Module, steps: int
                     ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW over the trainable parameters and its schedule (``optim.*``), one scheduler step per optimizer step:
    ``steps`` (``run.steps``) × epochs × mini-batches in all."""
    o = cfg_optim
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=o.lr, betas=o.betas,
                                  weight_decay=o.weight_decay)
    scheduler = build_scheduler(optimizer, o.schedule, o.warmup_steps, steps * o.epochs * o.minibatches,
                                o.min_lr_ratio)
    return optimizer, scheduler


def _setup_env_pool(cfg_rollout: RolloutConfig, task: Task | EnvTask):
    """The worker processes that run a multi-turn task's envs (``rollout.env_workers``: -1 one per usable core); None
    to run them in this process. An engine holds the GIL for a whole reset or step, so only processes run envs side by
    side: in one process 300 ALFWorld resets awaited together load one after another."""
    if not (task.multi_turn and cfg_rollout.env_workers):
        return None
    from mmrl.envs.pool import EnvPool

    workers = cfg_rollout.env_workers if cfg_rollout.env_workers > 0 else None  # None: EnvPool's one per core
    return EnvPool(task.env_class, workers, step_timeout=cfg_rollout.env_step_timeout)


def _restore_resumed(cfg_run: RunConfig, trainer: Trainer, resumed: tuple[Path, dict[str, Any], list[Path]]) -> None:
    """The state of the checkpoint ``_read_resumed`` found, loaded into ``trainer``; the unreadable newer ones are
    set aside, and a resume of a run that is already finished (at ``run.steps``) is one line."""
    existing, state, unreadable = resumed
    for path in unreadable:
        log.warning("set aside as %s", set_aside(path))
    refuse_edited_config(trainer.run_dir, state.get("config"), existing)
    trainer.restore(state, existing)
    refuse_finished(cfg_run.steps, trainer.run_dir, trainer.step, existing)
    log.info("resumed from %s at step %d", existing, trainer.step)


def train(cfg: TrainConfig) -> tuple[dict[str, Any], Trainer]:
    """Build and run; returns the last step's metrics and the trainer (``trainer.stop_signal`` if interrupted)."""
    trainer = build_trainer(cfg)
    last = trainer.run()
    if trainer.stop_signal is not None and trainer.step < cfg.run.steps:
        print(f"interrupted by signal {trainer.stop_signal} at step {trainer.step}; "
              f"{checkpoint_note(latest_checkpoint(trainer.run_dir))}", file=sys.stderr)
    return last, trainer
