"""GPG's valid-sample threshold β_th (the GPG paper's Alg. 1 line 1) across OpenRLHF's vLLM engines.

``MmrlSamplesGenerator.generate_samples`` asks OpenRLHF's generator (which spreads prompts over every vLLM engine and
returns each prompt's group consecutively, rewards included) for one rollout step; while fewer than β_th of its
groups are valid (rewards not all equal) it asks for further steps' worth, keeps the valid groups, and stops after
``max_resample`` extra rounds or when the prompt set is exhausted. The step it returns has the usual number of groups:
valid ones first, then all-equal ones from the last round, exactly as the local trainer's ``collect_rollouts``.

Communication: none beyond the generation itself; the decision reads the rewards the engines already return to the
PPO trainer actor. Cost: each extra round is one more full generation pass over ``rollout.batch_size`` prompts.

With GVPO's historical replay (``replay``, a `mmrl.openrlhf.replay.SampleReplay`), each round asks the engines for
fewer responses of the prompts that have stored ones and completes those groups with replayed samples.

In the agent turn layout, the engines return each episode with its turns (mmrl/openrlhf/turns.py): the episode
is what resampling and OpenRLHF's buffering count, and once a step's episodes are final they become its turn rows,
episode after episode, each with its group and step (:func:`mmrl.openrlhf.grouping.lay_out_turns`).

Every request goes out through `EngineDispatch`: OpenRLHF's own dispatch, with one field added to vLLM's
``SamplingParams`` on the way to each engine: ``repetition_penalty`` (``rollout.repetition_penalty``, or an evaluation
set's), which OpenRLHF's version leaves at vLLM's default.
"""

from __future__ import annotations

import copy
import logging

from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

from mmrl.openrlhf.grouping import lay_out_turns
from mmrl.openrlhf.turns import STEP_FIELD, TURNS_KEY

log = logging.getLogger("mmrl.openrlhf")


def split_groups(samples: list, group_size: int) -> list[list]:
    return [samples[i:i + group_size] for i in range(0, len(samples), group_size)]


def group_is_valid(group: list) -> bool:
    """A group carries gradient when its rewards are not all equal (GPG's M counts the others)."""
    return len({float(s.rewards.reshape(-1)[0]) for s in group}) > 1


def keep_valid_first(valid: list[list], last_round: list[list], target: int) -> list[list]:
    kept = valid[:target]
    return kept + [g for g in last_round if not group_is_valid(g)][: target - len(kept)]


class PenalisedRequests:
    """A vLLM engine's ``generate_responses`` handle whose requests carry a repetition penalty: OpenRLHF builds vLLM's
    ``SamplingParams`` without that field, and wrapping the handle adds it to a copy of each request's parameters
    rather than re-implementing OpenRLHF's dispatch (engine choice, batching) beside it."""

    def __init__(self, method, penalty: float) -> None:
        self.method, self.penalty = method, penalty

    def remote(self, *, sampling_params, **request):
        params = copy.copy(sampling_params)  # shared by every prompt of the dispatch: never changed in place
        params.repetition_penalty = self.penalty
        return self.method.remote(sampling_params=params, **request)


class PenalisedEngine:
    """An engine handle as OpenRLHF's dispatch uses it (load query, generation request), with penalised requests."""

    def __init__(self, engine, penalty: float) -> None:
        self.get_num_unfinished_requests = engine.get_num_unfinished_requests
        self.generate_responses = PenalisedRequests(engine.generate_responses, penalty)


class EngineDispatch(SamplesGenerator):
    """OpenRLHF's generator, whose requests carry the sampling's ``repetition_penalty`` to vLLM."""

    def _dispatch_prompts_to_vllm(self, prompts, labels, *, images=None, **generate_kwargs) -> list:
        """OpenRLHF's dispatch, through engine handles that add ``repetition_penalty`` (which its ``SamplingParams``
        omit) to each request; at 1.0 (off) the engines are OpenRLHF's own."""
        penalty = generate_kwargs.get("repetition_penalty", 1.0)
        engines = self.vllm_engines
        if penalty != 1.0:
            self.vllm_engines = [PenalisedEngine(engine, penalty) for engine in engines]
        try:
            return SamplesGenerator._dispatch_prompts_to_vllm(self, prompts, labels, images=images, **generate_kwargs)
        finally:
            self.vllm_engines = engines


class MmrlSamplesGenerator(EngineDispatch):
    def __init__(self, *args, group_size: int, valid_threshold: float, max_resample: int, max_steps: int = 0,
                 replay=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.replay, self.training_round = replay, False
        self.group_size, self.valid_threshold, self.max_resample = group_size, valid_threshold, max_resample
        self.resample_rounds = 0  # of the last step, for logging
        # run.steps: OpenRLHF's loop runs until its (repeated) prompt set is used up, which can be more steps than
        # asked; reporting "exhausted" after the last step ends it where the local trainer ends (0: no limit)
        self.max_steps, self.steps_done = max_steps, 0
        self.turns: dict[int, list] = {}  # the turn layout: id(episode experience) -> its (turn row, TurnStep)s

    def _process_response_into_experience(self, response, **generate_kwargs):
        experience = super()._process_response_into_experience(response, **generate_kwargs)
        if TURNS_KEY in response:
            self.turns[id(experience)] = [
                (super(MmrlSamplesGenerator, self)._process_response_into_experience(turn, **generate_kwargs),
                 turn[STEP_FIELD]) for turn in response[TURNS_KEY]]
        return experience

    def generate_eval_samples(self, **generate_kwargs):
        samples = super().generate_eval_samples(**generate_kwargs)
        for sample in samples:  # evaluation reads episodes; their turns are not trained
            self.turns.pop(id(sample), None)
        return samples

    def generate_samples(self, **generate_kwargs):
        samples, pass_rate, consumed, exhausted = self._episodes(**generate_kwargs)
        if samples and id(samples[0]) in self.turns:
            samples = lay_out_turns([self.turns.pop(id(s)) for s in samples], self.group_size)
            # only episodes OpenRLHF buffered for a later step keep their turns (resampling drops whole rounds)
            buffered = {id(s) for s in self._sample_buffer}
            self.turns = {k: v for k, v in self.turns.items() if k in buffered}
        return samples, pass_rate, consumed, exhausted

    def _episodes(self, **generate_kwargs):
        if self.max_steps and self.steps_done >= self.max_steps:
            return [], 1.0, 0, True
        if self.replay is not None:
            self.replay.start_step()
        samples, pass_rate, consumed, exhausted = self.generate_round(**generate_kwargs)
        self.resample_rounds = 0
        if samples:  # the call that ends each pass over the prompt set returns none: it is not a step
            self.steps_done += 1
        if self.valid_threshold <= 0 or not samples:
            return samples, pass_rate, consumed, exhausted
        groups = split_groups(samples, self.group_size)
        target, last = len(groups), groups
        valid = [g for g in groups if group_is_valid(g)]
        while len(valid) < self.valid_threshold * target and self.resample_rounds < self.max_resample and not exhausted:
            self.resample_rounds += 1
            more, _, more_consumed, exhausted = self.generate_round(**generate_kwargs)
            consumed += more_consumed
            if not more:
                break
            last = split_groups(more, self.group_size)
            valid += [g for g in last if group_is_valid(g)]
        if len(valid) < self.valid_threshold * target:
            log.warning("only %d/%d valid groups after %d resampling rounds (β_th=%.2f); training on them",
                        len(valid), target, self.resample_rounds, self.valid_threshold)
        kept = keep_valid_first(valid, last, target)
        return [s for g in kept for s in g], pass_rate, consumed, exhausted

    def generate_round(self, **generate_kwargs):
        """One round of OpenRLHF's generation; with replay, each group completed by its replayed samples."""
        if self.replay is None:
            return super().generate_samples(**generate_kwargs)
        self.training_round = True  # evaluation dispatches through the same method and replays nothing
        try:
            samples, pass_rate, consumed, exhausted = super().generate_samples(**generate_kwargs)
        finally:
            self.training_round = False
        return self.replay.mix(samples), pass_rate, consumed, exhausted

    def _dispatch_prompts_to_vllm(self, prompts, labels, *, images=None, **generate_kwargs):
        """OpenRLHF's dispatch, once per distinct number of fresh responses its prompts ask for."""
        if not self.training_round:
            return super()._dispatch_prompts_to_vllm(prompts, labels, images=images, **generate_kwargs)
        counts = [self.replay.fresh_count(p, lab) for p, lab in zip(prompts, labels, strict=True)]
        refs = []
        for n in sorted(set(counts)):
            rows = [i for i, c in enumerate(counts) if c == n]
            refs += super()._dispatch_prompts_to_vllm(
                [prompts[i] for i in rows], [labels[i] for i in rows],
                images=None if images is None else [images[i] for i in rows],
                **{**generate_kwargs, "n_samples_per_prompt": n})
        return refs
