"""The reward contract: pure functions from (completion text, sample) to a score in a declared range.

A reward never raises on model output. Anything malformed scores the range's floor (0 for the built-in rewards) with a
``reason``; an exception inside a reward function is caught here and turned into such a result, so one bad completion
cannot end a run. Rewards are registered by name in ``REWARDS``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mmrl.errors import UserError

Sample = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class RewardResult:
    score: float
    reason: str | None = None  # why the score is not the maximum (None when nothing to say)
    components: Mapping[str, float] = dataclasses.field(default_factory=dict)


class Reward:
    """A batched reward: ``reward(completions, samples) -> list[RewardResult]`` with scores in ``[low, high]``.

    Args:
        name: the registry name (``get_reward(name)``) and the result's component name.
        low, high: the declared score range; scores outside it are clipped, non-finite ones score ``low``.
        batch_fn: ``(completions, samples) -> list[RewardResult]``, one result per completion.
    """

    def __init__(self, name: str, low: float, high: float,
                 batch_fn: Callable[[Sequence[str], Sequence[Sample]], list[RewardResult]]):
        if not low <= high:
            raise UserError(f"reward {name!r}: low {low} > high {high}")
        self.name, self.low, self.high, self._batch_fn = name, low, high, batch_fn

    def __repr__(self) -> str:
        return f"Reward({self.name!r}, range=[{self.low}, {self.high}])"

    def __call__(self, completions: Sequence[str], samples: Sequence[Sample]) -> list[RewardResult]:
        """Score completions; never raises on model output.

        Args:
            completions: the generated texts (the response only, not the prompt).
            samples: the task row of each completion (its answer and metadata), same length as ``completions``.

        Returns:
            One :class:`RewardResult` per completion: ``score`` in ``[low, high]``, a ``reason`` when it is not the
            maximum, and ``components`` (the parts of a weighted sum). An exception inside ``batch_fn`` scores every
            completion of the batch ``low`` with the exception as the reason.
        """
        if len(completions) != len(samples):
            raise ValueError(f"reward {self.name!r}: {len(completions)} completions but {len(samples)} samples")
        try:
            results = self._batch_fn(completions, samples)
        except Exception as exc:  # noqa: BLE001 -- a reward must not end the run; the reason is kept
            floor = self.low if math.isfinite(self.low) else 0.0
            return [RewardResult(floor, f"{self.name}: {type(exc).__name__}: {exc}", {self.name: floor})
                    for _ in completions]
        return [self._checked(r) for r in results]

    def _checked(self, result: RewardResult) -> RewardResult:
        floor = self.low if math.isfinite(self.low) else 0.0
        score = result.score
        if not isinstance(score, (int, float)) or not math.isfinite(score):
            return RewardResult(floor, f"{self.name}: non-finite score {score!r}", {self.name: floor})
        if score < self.low or score > self.high:
            clipped = min(max(score, self.low), self.high)
            return RewardResult(clipped, f"{self.name}: score {score} outside [{self.low}, {self.high}], clipped",
                                {**result.components, self.name: clipped})
        components = dict(result.components) or {self.name: float(score)}
        return RewardResult(float(score), result.reason, components)


REWARDS: dict[str, Reward] = {}


def register_reward(reward: Reward) -> Reward:
    if reward.name in REWARDS:
        raise ValueError(f"reward {reward.name!r} is registered twice")
    REWARDS[reward.name] = reward
    return reward


def reward(name: str, low: float = 0.0, high: float = 1.0, register: bool = True,
           same_score: Callable[[str, Sample], Any] | None = None):
    """Decorator: turn ``fn(completion, sample) -> score | (score, reason)`` into a registered batched `Reward`.

    Exceptions from ``fn`` on one completion score ``low`` with the exception as the reason; the others are kept.
    ``same_score(completion, sample)``: a hashable key such that equal keys give equal scores (e.g. the extracted
    answer and the gold one); ``fn`` then runs once per distinct key of a batch. The responses of a group often
    give the same answer, and math-verify takes 2-3 ms a pair.
    """

    def wrap(fn: Callable[[str, Sample], float | tuple[float, str | None]]) -> Reward:
        def one(text: str, sample: Sample) -> RewardResult:
            try:
                value = fn(text, sample)
            except Exception as exc:  # noqa: BLE001 -- malformed output scores the floor with a reason
                return RewardResult(low, f"{name}: {type(exc).__name__}: {exc}")
            score, why = value if isinstance(value, tuple) else (value, None)
            return RewardResult(float(score), why)

        def batch(completions: Sequence[str], samples: Sequence[Sample]) -> list[RewardResult]:
            out, seen = [], {}
            for text, sample in zip(completions, samples, strict=True):
                text = text if isinstance(text, str) else ""
                if same_score is None:
                    out.append(one(text, sample))
                    continue
                key = same_score(text, sample)
                if key not in seen:
                    seen[key] = one(text, sample)
                out.append(seen[key])
            return out

        r = Reward(name, low, high, batch)
        return register_reward(r) if register else r

    return wrap


def get_reward(name: str) -> Reward:
    if name not in REWARDS:
        raise UserError(f"unknown reward {name!r}; choose one of: {', '.join(sorted(REWARDS))}")
    return REWARDS[name]


def weighted(parts: Sequence[tuple[Reward, float]], name: str | None = None) -> Reward:
    """Σ weight·reward. The range is derived from the parts; each part's score is kept in ``components``."""
    if not parts:
        raise ValueError("weighted() needs at least one (reward, weight) pair")
    low = sum(min(w * r.low, w * r.high) for r, w in parts)
    high = sum(max(w * r.low, w * r.high) for r, w in parts)
    name = name or "+".join(f"{w:g}*{r.name}" for r, w in parts)

    def batch(completions: Sequence[str], samples: Sequence[Sample]) -> list[RewardResult]:
        per_part = [r(completions, samples) for r, _ in parts]
        out = []
        for i in range(len(completions)):
            results = [p[i] for p in per_part]
            score = sum(w * res.score for (_, w), res in zip(parts, results, strict=True))
            reasons = [res.reason for res in results if res.reason]
            components: dict[str, float] = {}
            for (r, _), res in zip(parts, results, strict=True):  # keep nested parts' components (accuracy, ...)
                components.update(res.components)
                components[r.name] = res.score
            out.append(RewardResult(score, "; ".join(reasons) or None, components))
        return out

    return Reward(name, low, high, batch)
