"""GVPO's off-policy π_s (the GVPO paper's Theorem 3.2): a per-prompt store of past responses, replayed into groups.

One rule for both backends: the local trainer's ``ReplayHistory`` (mmrl/trainer/collect.py) stores
`mmrl.batch.Response`s, the openrlhf backend's ``SampleReplay`` (mmrl/openrlhf/replay.py) stores OpenRLHF's
single-sample experiences. This module knows neither; it only decides what is kept and what is replayed.

* **Kept.** Each prompt keeps its ``capacity`` most recent fresh responses (both trainers pass ``samples_per_prompt``)
  in the order they were generated; an older one is dropped when a newer one arrives, and a replayed response is never
  stored again. Memory is bounded by ``capacity`` × the number of distinct prompts trained on, i.e. at most
  ``samples_per_prompt`` responses per row of the training split.
* **Replayed.** A group of prompt x replays the ``k`` (``rollout.replay_historical``) most recent responses of x once
  at least ``k`` are stored, and none before; the group then holds ``samples_per_prompt - k`` fresh responses, listed
  first, and the ``k`` replayed ones after them. Every group of one rollout round sees the store as it was before the
  round: a round's fresh responses are stored after all its groups took theirs.
* A replayed response keeps the reward it was scored with. Its π_θ' log-probs are recomputed by the current policy at
  the start of the step, as every other response's: GVPO's weights compare log π_θ/π_θ' over a group's responses,
  which Theorem 3.2 allows whatever policy sampled them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class ReplayStore(Generic[T]):
    """The most recent ``capacity`` responses of each prompt (``key``); ``capacity`` 0 keeps nothing."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"a replay store's capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.by_prompt: dict[Hashable, deque[T]] = {}

    def replayable(self, key: Hashable, k: int) -> int:
        """How many responses a group of ``key`` replays now: ``k`` once ``k`` are stored, else 0."""
        return k if k > 0 and len(self.by_prompt.get(key, ())) >= k else 0

    def fresh_count(self, key: Hashable, group_size: int, k: int) -> int:
        """How many responses a group of ``key`` generates now: the group size less what it replays."""
        return group_size - self.replayable(key, k)

    def take(self, key: Hashable, k: int) -> list[T]:
        """The ``k`` most recent responses of ``key``, oldest first (none while fewer than ``k`` are stored)."""
        n = self.replayable(key, k)
        return list(self.by_prompt[key])[-n:] if n else []

    def add(self, key: Hashable, responses: Iterable[T]) -> None:
        if self.capacity:
            self.by_prompt.setdefault(key, deque(maxlen=self.capacity)).extend(responses)

    def __len__(self) -> int:
        """Responses held, over every prompt."""
        return sum(len(v) for v in self.by_prompt.values())
