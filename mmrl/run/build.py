"""The build layer: a resolved `TrainConfig` into the objects of a run, the same for both backends.

config → task (with its reward; `build_task`), evaluation sets, objective (`build_algorithm`), all three resolved in
one order by `resolve_run`; model and tokenizer (`load_policy`),
vision processor (`load_vision`), plus the start-up checks that need them. The local backend (mmrl/trainer/local.py)
and the OpenRLHF backend (mmrl/openrlhf/) both import this module and neither imports the other, so an objective, a
task or a reward is built one way whatever runs it. Which model a task wants by default is the task's declaration
(``register_task(..., config_defaults=...)``), applied when the config is resolved (`mmrl.run.config`).
"""

from __future__ import annotations

import asyncio
import dataclasses

import torch
from tqdm import tqdm

import mmrl.algos as algos
from mmrl.envs.base import EnvError
from mmrl.envs.episode import TurnRenderer
from mmrl.errors import UserError
from mmrl.models import is_embedded, load_model
from mmrl.models.loading import load_vision_processor
from mmrl.models.lora import LoraSettings, parse_targets
from mmrl.rewards import RewardModelScorer, weighted
from mmrl.run.config import ModelConfig, RolloutConfig, TrainConfig, validate
from mmrl.run.eval_sets import EvalSet, build_eval_sets
from mmrl.run.prompts import check_prompts, encode_prompt, task_has_images
from mmrl.tasks import Task, get_task
from mmrl.tasks.base import EnvTask, checked_rows, options_for_model, sample_place


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
    """What a config trains and measures, before any model is loaded."""

    task: Task | EnvTask  # with its reward
    eval_sets: list[EvalSet]  # evaluation.sets; empty: run.eval_* on the task's held-out split
    algo: algos.Algorithm  # the objective, as every backend trains it


def resolve_run(cfg: TrainConfig) -> ResolvedRun:
    """The config checked, then its task, evaluation sets and objective, in that order on every backend, so a config
    with several faults is refused for the same one first whatever runs it."""
    validate(cfg)
    task = build_task(cfg)
    eval_sets = build_eval_sets(cfg, task)
    return ResolvedRun(task, eval_sets, build_algorithm(cfg, task.multi_turn))


def build_task(cfg: TrainConfig) -> Task | EnvTask:
    """The task ``task.name`` with its options, its reward (plus ``task.reward_model`` when given) and the checks of
    options that depend on its kind. A model that is not embedded gets the task's ``pretrained_options`` under the
    user's (the chat a real instruct model follows); the resolved options are written back to ``cfg`` so that the
    run's config.json records them."""
    cfg.task.options = options_for_model(cfg.task.name, cfg.task.options, is_embedded(cfg.model.name))
    task = get_task(cfg.task.name, **cfg.task.options)
    if task.multi_turn and cfg.task.reward_model:
        raise UserError(f"config: task.reward_model is for single-turn tasks; {task.name!r} is scored by its env")
    if not task.multi_turn and cfg.sft.steps:
        raise UserError(f"config: sft.steps (--sft-warmup) needs a multi-turn task with demonstrations, not "
                         f"{task.name!r}")
    if cfg.task.reward_model:
        scorer = RewardModelScorer(cfg.task.reward_model)
        task.reward = weighted([(task.reward, 1.0), (scorer.as_reward(), cfg.task.reward_model_weight)],
                               f"{task.reward.name}+reward_model")
    return task


def response_budget(cfg: TrainConfig, multi_turn: bool) -> int:
    """The most tokens one trained response can hold: ``rollout.max_new_tokens``, or for a multi-turn task in the
    episode layout (whose response is a whole episode) ``rollout.max_episode_tokens``; in the turn layout a response
    is one turn."""
    whole_episode = multi_turn and cfg.rollout.agent_layout == "episode"
    return cfg.rollout.max_episode_tokens if whole_episode else cfg.rollout.max_new_tokens


def build_algorithm(cfg: TrainConfig, multi_turn: bool) -> algos.Algorithm:
    """The objective of ``cfg`` for a task of this kind (``task.multi_turn``), as every backend trains it: its
    hyper-parameters, and its constant length normaliser (Dr.GRPO's) set from the task's response budget. What the
    objective needs of the agent layout (``needs_steps``, ``trains_turns``) is checked here, once for both."""
    algo = algos.get(cfg.algo.name, **cfg.algo.params).with_length_budget(response_budget(cfg, multi_turn))
    layout = cfg.rollout.agent_layout
    if multi_turn and algo.needs_steps and layout != "turn":
        raise UserError(f"config: --algo {algo.name} needs the per-step rewards and observations of each turn; "
                         f"train it with --rollout.agent_layout turn")
    if multi_turn and layout == "turn" and not algo.trains_turns:
        raise UserError(f"config: --algo {algo.name} needs whole responses to one prompt in a group; "
                         f"--rollout.agent_layout turn gives turns with different prompts (use episode)")
    if multi_turn and algo.overlong_buffer:
        raise UserError(f"config: --algo.overlong_buffer shapes the reward of single-turn responses by their length; "
                         f"{algo.name} on a multi-turn task has episodes (set it to 0)")
    if not multi_turn and layout != "episode":
        raise UserError("config: rollout.agent_layout turn is for multi-turn (agent) tasks")
    return algo


def reference_needed(algo: algos.Algorithm, cfg: TrainConfig) -> bool:
    """Whether a run keeps the initial policy: the objective reads reference log-probs, or KL to it is tracked."""
    return algo.uses_reference() or cfg.run.track_kl_to_init


def lora_settings(cfg_model: ModelConfig) -> LoraSettings | None:
    """The LoRA adapters ``model.lora_*`` ask for, or None for a full fine-tune (``model.lora_rank`` 0)."""
    m = cfg_model
    return LoraSettings(m.lora_rank, m.lora_alpha, parse_targets(m.lora_targets)) if m.lora_rank else None


def load_vision(cfg_model: ModelConfig, task: Task | EnvTask, max_prompt_tokens: int):
    """The `VisionProcessor` of a task with images (None for text), after start-up checks of every row's images
    and prompt length (``rollout.max_prompt_tokens``). A text-only ``model.name`` is a one-line error (the task's
    default model is a vision one)."""
    if not task_has_images(task):
        return None
    m = cfg_model
    vision = load_vision_processor(m.name, m.min_pixels, m.max_pixels, m.share_image_features, m.trust_remote_code)
    check_prompts(task, vision, max_prompt_tokens)
    return vision


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"config: model.device is {name!r} but no CUDA device is available")
    return torch.device(name)


def load_policy(cfg_model: ModelConfig, device: torch.device) -> torch.nn.Module:
    """The policy ``model.name``: float32 master weights on ``device``, dropout off. Its tokenizer is
    ``mmrl.models.load_tokenizer(cfg_model.name)``."""
    model = load_model(cfg_model.name, dtype=torch.float32, device=device,
                       trust_remote_code=cfg_model.trust_remote_code)
    disable_dropout(model)  # π_old and π_θ must be the same function at the first update
    return model


def disable_dropout(model: torch.nn.Module) -> None:
    """No dropout and no router jitter: the training forward must be the function π_old was computed with."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for attr in ("attention_dropout", "jitter_noise", "router_jitter_noise", "input_jitter_noise"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, 0.0)


def encode_all_prompts(task: Task, tokenizer, limit: int, max_checked: int = 50_000) -> dict[int, list[int]]:
    """Token ids of the training prompts (the prompt cache), failing at start, naming the row, if a prompt of either
    split is longer than ``rollout.max_prompt_tokens``. Splits beyond ``max_checked`` rows are encoded lazily."""
    cache = {}
    train, held_out = checked_rows(task.train, max_checked), checked_rows(task.eval, max_checked)
    checked = len(train) + len(held_out)
    bar = tqdm(total=checked, desc="checking prompt lengths", unit="row", disable=checked < 2000, mininterval=1)
    for split, rows in (("train", train), ("eval", held_out)):
        for i, row in enumerate(rows):
            bar.update(1)
            try:
                ids = encode_prompt(tokenizer, row["messages"], limit)
            except ValueError as exc:
                raise UserError(f"{exc} ({sample_place(row, split, i)}); raise it or filter the data") from exc
            if split == "train":
                cache[i] = ids
    bar.close()
    return cache


def check_episode_budget(task: EnvTask, renderer: TurnRenderer, cfg_rollout: RolloutConfig, seed: int) -> None:
    """Fail at start if the first training game's prompt (its env reset with ``seed``, ``run.seed``) leaves no room
    for a turn of ``rollout.max_new_tokens`` in ``rollout.max_episode_tokens``."""
    async def first_prompt() -> list[int]:
        env = task.make_env(task.train[0])
        try:
            observation, _ = await env.reset(seed=seed)
            return renderer.prompt_ids(observation)
        finally:
            await env.close()

    try:
        n = len(asyncio.run(first_prompt()))
    except EnvError as exc:
        raise UserError(f"task {task.name}: the first training game does not start: {exc}") from exc
    r = cfg_rollout
    if n + r.max_new_tokens > r.max_episode_tokens:
        raise UserError(f"config: rollout.max_episode_tokens {r.max_episode_tokens} leaves no room for a turn after "
                         f"the first prompt ({n} tokens) and rollout.max_new_tokens {r.max_new_tokens}")
