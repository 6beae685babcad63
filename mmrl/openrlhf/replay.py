"""GVPO's historical replay (``rollout.replay_historical k``) on the openrlhf backend, by the rule of `mmrl.replay`.

The store lives in OpenRLHF's PPO trainer actor, which holds both the samples generator and the experience maker and
sees each rollout step whole. What it holds: each prompt's ``samples_per_prompt`` most recent fresh samples (OpenRLHF's
single-sample ``Experience``: tokens, masks, reward, label), at most ``samples_per_prompt`` per training row, with
their behaviour log-probs once their own step has computed them. A prompt is its rendered text and its label (the
row's reward context), so identical rows share one history. Per rollout step:

1. ``MmrlSamplesGenerator`` asks the vLLM engines for ``samples_per_prompt - k`` responses of each prompt that has
   ``k`` stored, ``samples_per_prompt`` of the others (:meth:`SampleReplay.fresh_count`);
2. :meth:`SampleReplay.mix` cuts what the engines returned (each prompt's responses are consecutive) into groups by
   those counts, appends to each group copies of its ``k`` replayed samples, then stores the fresh ones: every group
   has ``samples_per_prompt`` samples again, as OpenRLHF's experience maker and mmrl's group ids expect;
3. the policy actors compute π_old of every sample with the current weights, replayed ones included (the local
   trainer's π_θ', recomputed at the start of the step); :meth:`SampleReplay.record_logprobs` keeps each fresh
   sample's π_old with it in the store, its behaviour log-probs, and reports how far the policy moved on the replayed
   ones (``replay/logprob_shift``: the mean of log π_θ'(y) − log π_behaviour(y), summed over a response's tokens).

Communication: none; the samples are already in this actor.

Checkpoints: with each policy checkpoint the store is saved in the tag's folder (:meth:`SampleReplay.save`,
`mmrl.openrlhf.checkpoint.write_replay_store`): every stored sample's fields but those its own step computed
(:data:`STEP_ONLY`), its behaviour log-probs included. ``--resume`` loads the store of the tag DeepSpeed resumes
(:meth:`SampleReplay.restore`), so the resumed run replays what the uninterrupted one would; a missing or damaged
store stops it at start with one line (:func:`read_store`, also run by the launcher before Ray starts).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from mmrl.errors import UserError
from mmrl.openrlhf.checkpoint import (
    ACTOR_DIR,
    REPLAY_DIR,
    checkpoint_folder,
    read_replay_store,
    write_replay_store,
)
from mmrl.openrlhf.grouping import runs_of_groups
from mmrl.replay import ReplayStore

# What a sample's own step computes on it: a replayed copy's step computes them again, and no checkpoint stores them.
# Its π_old (``action_log_probs``) is computed again too, but is stored: it is the sample's behaviour log-probs.
STEP_ONLY = ("base_action_log_probs", "values", "advantages", "returns", "kl", "index")


def check_replay_flags(args, replayed: int) -> None:
    """OpenRLHF's dynamic filtering drops generated groups after the store decided their counts: refused with replay.
    (Samples generated for a later step, ``--rollout.vllm_generate_batch_size`` above the batch size, need OpenRLHF's
    async trainer, which mmrl refuses.)"""
    if replayed and args.algo.dynamic_filtering_enable:
        raise UserError("config: rollout.replay_historical cannot be combined with --algo.dynamic_filtering_enable "
                         "(filtered groups would leave the replay's group counts behind)")


def prompt_key(sample) -> tuple[str, str]:
    """The prompt a single-sample experience answers: its rendered prompt and its label."""
    return str(sample.prompts[0]), str(sample.labels[0])


def replayed_copy(stored):
    """A stored sample as a new rollout sample: the same tokens, masks and reward, no log-probs (its π_old is
    computed again in this step; its sampler's, an older policy's, are NaN: unknown to the rollout correction, which
    compares a step's trainer with that step's sampler) and its own ``info`` (the step writes its group id there)."""
    sampled = stored.rollout_log_probs
    return dataclasses.replace(stored, action_log_probs=None, **dict.fromkeys(STEP_ONLY), info=dict(stored.info),
                               rollout_log_probs=None if sampled is None else torch.full_like(sampled, math.nan))


def stored_fields(sample) -> dict[str, Any]:
    """A stored sample as a checkpoint keeps it: its fields but :data:`STEP_ONLY`."""
    return {f.name: getattr(sample, f.name) for f in dataclasses.fields(sample) if f.name not in STEP_ONLY}


def stored_samples(state: dict[str, Any], group_size: int, replayed: int) -> list[tuple[tuple[str, str], list]]:
    """(prompt key, its samples' fields, oldest first) of a saved store, in the store's order; ValueError when the
    state is not a store of groups of ``group_size`` replaying ``replayed``."""
    if (state.get("group_size"), state.get("replayed")) != (group_size, replayed):
        raise ValueError(f"it holds groups of {state.get('group_size')} replaying {state.get('replayed')}, this run "
                         f"groups {group_size} replaying {replayed}")
    out = []
    for entry in state["prompts"]:
        samples = entry["samples"]
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise ValueError(f"the samples of prompt {len(out)} are not a list of fields")
        out.append(((str(entry["prompt"]), str(entry["label"])), samples))
    return out


def read_store(tag_folder: str | Path, group_size: int, replayed: int) -> list[tuple[tuple[str, str], list]]:
    """The store saved with the checkpoint ``tag_folder`` as :func:`stored_samples`; UserError, one line naming the
    store, when it is missing, damaged or another run's."""
    state = read_replay_store(tag_folder)
    try:
        return stored_samples(state, group_size, replayed)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{Path(tag_folder) / REPLAY_DIR} is not this run's GVPO replay store ({exc})") from None


def check_resumed_store(args, replayed: int) -> None:
    """Before Ray starts: a ``--resume`` with replay needs the store of the checkpoint DeepSpeed will load (the tag
    named by ``latest``); a missing or damaged one stops the launch with one line. Without replay nothing is read."""
    actor_dir = Path(args.ckpt.path) / ACTOR_DIR
    if replayed and args.ckpt.load_enable and (actor_dir / "latest").is_file():
        read_store(checkpoint_folder(actor_dir, None), args.rollout.n_samples_per_prompt, replayed)


class SampleReplay:
    def __init__(self, group_size: int, replayed: int) -> None:
        if not 0 < replayed < group_size:
            raise ValueError(f"replay of {replayed} responses in groups of {group_size}")
        self.group_size, self.k = group_size, replayed
        self.store: ReplayStore[Any] = ReplayStore(group_size)
        self.replayed: dict[int, Any] = {}  # id of a replayed copy in the current step -> its stored sample
        self.metrics: dict[str, float] = {}

    def fresh_count(self, prompt: str, label: str) -> int:
        return self.store.fresh_count((str(prompt), str(label)), self.group_size, self.k)

    def start_step(self) -> None:
        self.replayed = {}

    def state_dict(self) -> dict[str, Any]:
        """The store as a checkpoint's state: each prompt's samples (:func:`stored_fields`), oldest first."""
        return {"group_size": self.group_size, "replayed": self.k,
                "prompts": [{"prompt": prompt, "label": label, "samples": [stored_fields(s) for s in samples]}
                            for (prompt, label), samples in self.store.by_prompt.items()]}

    def save(self, tag_folder: str | Path) -> Path:
        """The store, saved with the policy checkpoint ``tag_folder`` (inside it)."""
        return write_replay_store(tag_folder, self.state_dict())

    def restore(self, tag_folder: str | Path, sample_type: type) -> None:
        """The store saved with the checkpoint ``tag_folder``, each sample rebuilt as ``sample_type`` (OpenRLHF's
        ``Experience``); UserError naming the store when it cannot be."""
        store: ReplayStore[Any] = ReplayStore(self.group_size)
        for key, samples in read_store(tag_folder, self.group_size, self.k):
            try:
                store.add(key, [sample_type(**fields) for fields in samples])
            except TypeError as exc:
                raise UserError(f"{Path(tag_folder) / REPLAY_DIR} holds a sample {sample_type.__name__} cannot "
                                 f"hold ({exc})") from None
        self.store, self.replayed = store, {}

    def mix(self, samples: list) -> list:
        """One generation round's samples (each prompt's fresh responses consecutive) as whole groups: fresh first,
        replayed after; then the round's fresh samples are stored."""
        keys = [prompt_key(s) for s in samples]
        groups = []
        for start, end in runs_of_groups(keys, lambda key: self.store.fresh_count(key, self.group_size, self.k)):
            copies = []
            for stored in self.store.take(keys[start], self.k):
                copy = replayed_copy(stored)
                self.replayed[id(copy)] = stored
                copies.append(copy)
            groups.append((keys[start], samples[start:end], copies))
        for key, fresh, _ in groups:
            self.store.add(key, fresh)
        return [s for _, fresh, copies in groups for s in fresh + copies]

    @torch.no_grad()
    def record_logprobs(self, rollout_samples: list, experiences: list) -> None:
        """After the step's π_old: each fresh sample keeps its own (behaviour log-probs); each replayed one is
        measured against its behaviour log-probs (``metrics``)."""
        shifts = []
        replayed = 0
        for e in experiences:
            for row, position in enumerate(e.index):
                sample = rollout_samples[position]
                width = sample.action_mask.shape[1]
                logprobs = e.action_log_probs[row:row + 1, :width].float()
                stored = self.replayed.pop(id(sample), None)
                if stored is None:
                    sample.action_log_probs = logprobs.clone()
                    continue
                replayed += 1
                if stored.action_log_probs is not None:  # None: its own step never trained on it
                    mask = sample.action_mask.float()
                    shifts.append(float(((logprobs - stored.action_log_probs) * mask).sum()))
        self.metrics = {"replay/responses": float(replayed), "replay/stored": float(len(self.store))}
        if shifts:
            self.metrics["replay/logprob_shift"] = sum(shifts) / len(shifts)
