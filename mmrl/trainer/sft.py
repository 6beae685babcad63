"""Supervised warm-start of an agent on expert demonstrations (``--sft-warmup STEPS``), before RL.

A tiny model cannot act from scratch: with rewards only on a win, RL from random actions finds no signal. So the run
first clones a scripted expert. Each demonstration is *played through the real env* by the task's expert player
(``expert(row, seed)``: from the env's observation and info to the turn text, e.g.
``<think>…</think><action>…</action>``) with the same :func:`~mmrl.trainer.episodes.run_episodes` driver as RL
rollouts, so a demonstration is token for token the sequence an RL episode that took those actions would be: same
prompt, same feedback turns, same masks. The loss is the mean negative log-likelihood of the expert's tokens (loss
mask 1), conditioned on everything before them.

Only demonstrations that the env scores as won are kept (the others are counted in a warning).
:func:`run_demonstrations` and :func:`warm_up` are the local trainer's warm-up phase: a run's demonstrations, then
its steps with a progress bar and its ``sft.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmrl.batch import Group, collate
from mmrl.envs.episode import TurnRenderer
from mmrl.errors import UserError
from mmrl.run.config import RolloutConfig, SFTConfig
from mmrl.tasks.base import EnvTask
from mmrl.trainer.episodes import Episode, run_episodes
from mmrl.trainer.rollout import ROW_BY_ROW_MIN_WIDTH, response_logprobs
from mmrl.trainer.turn_sampler import Turn

log = logging.getLogger("mmrl")


def expert_policy(tokenizer, players: dict[int, Callable[[str, dict[str, Any]], str]]):
    """A policy where ``players[id(episode)]`` (the task's ``expert(row, seed)``) writes each episode's next turn
    from the env's last observation and info; each turn is closed by the tokenizer's stop token."""
    stop = tokenizer.eos_token_id

    def policy(episodes: list[Episode]) -> list[Turn]:
        turns = []
        for ep in episodes:
            text = players[id(ep)](ep.observations[-1], ep.info)
            turns.append(Turn(tokenizer(text, add_special_tokens=False)["input_ids"] + [stop], text, True))
        return turns

    return policy


def render_demonstrations(task: EnvTask, tokenizer, rows: list[dict[str, Any]], max_episode_tokens: int,
                          seed: int = 0, per_row: int = 1, layout: str = "episode") -> list[Group]:
    """``per_row`` expert demonstrations of each row (players seeded ``seed * per_row + k``), each as a
    one-response :class:`Group` (in the turn ``layout``: a group of its turn-samples, each with its own prompt);
    won episodes only."""
    if task.expert is None:
        raise UserError(f"sft.steps > 0 but task {task.name!r} has no expert demonstrations")
    renderer = TurnRenderer(tokenizer, task.system_prompt)
    starts = [(row, seed * per_row + k) for row in rows for k in range(per_row)]
    episodes = [Episode(partial(task.make_env, row, layout), seed=seed, layout=layout) for row, _ in starts]
    players = {id(ep): task.expert(row, player_seed) for ep, (row, player_seed) in zip(episodes, starts, strict=True)}
    run_episodes(episodes, renderer, expert_policy(tokenizer, players), max_episode_tokens)
    groups = [Group(n // per_row, row, ep.prompt_ids,  # sample_index: the row's position in rows
                    ep.turn_responses(n) if layout == "turn" else [ep.response()])
              for n, (ep, (row, _)) in enumerate(zip(episodes, starts, strict=True)) if ep.won]
    lost = [(row, ep.summary()) for ep, (row, _) in zip(episodes, starts, strict=True) if not ep.won]
    if lost:
        log.warning("%d of %d demonstrations not won (left out), e.g. %s (%s)", len(lost), len(episodes), *lost[0])
    if not groups:
        raise UserError(f"task {task.name!r}: no expert demonstration was won; cannot warm up")
    return groups


def demonstration_loss(model, groups: list[Group], pad_id: int, row_by_row_min_width: int = 0) -> torch.Tensor:
    """Mean NLL per expert token (loss mask 1) of ``groups``, through the trainer's own scoring path
    (``row_by_row_min_width`` as in :func:`~mmrl.trainer.rollout.response_logprobs`)."""
    batch = collate(groups, pad_id)
    logprobs, _ = response_logprobs(model, batch, temperature=1.0, row_by_row_min_width=row_by_row_min_width)
    mask = batch.response_mask.to(logprobs.device)
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1)


def sft_warmup(model, demos: list[Group], pad_id: int, steps: int, lr: float, batch_size: int, seed: int = 0,
               autocast=None, on_step=None, row_by_row_min_width: int = ROW_BY_ROW_MIN_WIDTH) -> list[float]:
    """``steps`` AdamW steps of behaviour cloning on random batches of ``demos``; returns the loss per step.

    ``on_step(step, loss)`` is called after each step (logging). A non-finite loss skips the step. Demonstrations are
    whole episodes: by default batches this wide are scored one row at a time on the CPU (0 = padded batches).
    """
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    was_training = model.training
    model.train()
    losses = []
    for step in range(steps):
        picked = [demos[i] for i in rng.sample(range(len(demos)), min(batch_size, len(demos)))]
        with autocast() if autocast else contextlib.nullcontext():
            loss = demonstration_loss(model, picked, pad_id, row_by_row_min_width)
        optimizer.zero_grad(set_to_none=True)
        if torch.isfinite(loss):
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
        losses.append(float(loss.detach()))
        if on_step:
            on_step(step, losses[-1])
    model.train(was_training)
    return losses


def run_demonstrations(cfg_sft: SFTConfig, cfg_rollout: RolloutConfig, task: EnvTask, tokenizer,
                       seed: int) -> list[Group]:
    """The demonstrations a run's warm-up trains on (``sft.demos`` training games, ``sft.demos_per_row`` each, players
    seeded from ``seed``, ``run.seed``), in its agent layout and episode budget (``rollout.agent_layout``,
    ``rollout.max_episode_tokens``)."""
    s = cfg_sft
    rows = task.train[: s.demos] if s.demos else task.train
    t0 = time.perf_counter()
    demos = render_demonstrations(task, tokenizer, rows, cfg_rollout.max_episode_tokens, seed=seed,
                                  per_row=s.demos_per_row, layout=cfg_rollout.agent_layout)
    log.info("sft warm-up: %d demonstrations rendered in %.1f s; %d steps", len(demos), time.perf_counter() - t0,
             s.steps)
    return demos


def warm_up(cfg_sft: SFTConfig, demos: list[Group], tokenizer, model, log_path: Path, autocast, *, seed: int,
            progress: bool, row_by_row: bool) -> list[float]:
    """A run's SFT warm-up (``sft.*``) of ``model`` on ``demos`` (:func:`run_demonstrations`); returns the loss per
    step, each also written to ``log_path`` (the run's ``sft.jsonl``) as it is made. ``autocast``: a factory of the
    run's mixed-precision context; ``seed`` (``run.seed``) draws the batches, ``progress`` (``run.progress``) shows a
    bar, ``row_by_row`` (``optim.row_by_row``) scores wide batches one row at a time as the RL update does."""
    s = cfg_sft
    # a warm-up runs for minutes before the first RL step: the same progress bar as the RL loop shows it moving
    bar = tqdm(total=s.steps, disable=not progress, desc="sft warm-up", unit="step", dynamic_ncols=True)
    with log_path.open("w") as out, bar:
        def write(step: int, loss: float) -> None:
            out.write(json.dumps({"sft_step": step, "loss": loss}) + "\n")
            out.flush()  # a long warm-up can be watched
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

        return sft_warmup(model, demos, tokenizer.pad_token_id, s.steps, s.lr, s.batch_size, seed=seed,
                          autocast=autocast, on_step=write,
                          row_by_row_min_width=ROW_BY_ROW_MIN_WIDTH if row_by_row else 0)
