"""An optimizer step held inside a KL band (``optim.target_kl``): after the step, the KL of the new policy to the
rollout policy π_old is measured on the tokens the step trained on; while it exceeds the target, the step is halved
(the weights move half as far from where the step started), and after ``optim.kl_halvings`` halvings it is undone.

A clip on the probability ratio bounds only the tokens whose advantage pushes past it; it does not bound how far one
Adam step moves a near-deterministic policy, whose first step moves every weight by about the learning rate whatever
the gradient's size. Measuring the KL after the step and shrinking the step bounds the move itself, for every
objective (a backtracking line search as in TRPO, on the step the optimizer proposed). The optimizer's moments keep
the full gradient; only the weights move less.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class BandedStep:
    """What :func:`hold_in_band` did: the KL (mean, max over tokens) measured at the weights it kept, the halvings
    it made, and whether it undid the step."""

    kl: float
    kl_max: float
    halvings: int
    undone: bool


def hold_in_band(params: Sequence[torch.Tensor], before: Sequence[torch.Tensor],
                 measure: Callable[[], tuple[float, float]], target: float, max_halvings: int) -> BandedStep:
    """Keep the step from ``before`` to ``params`` (already taken, in place) only as far as ``measure()``'s mean KL
    stays at or below ``target``: halve it up to ``max_halvings`` times, then undo it. ``measure`` returns the
    (mean, max) KL at the current weights."""
    if target <= 0:
        raise ValueError(f"hold_in_band: target must be > 0, got {target}")
    kl, kl_max = measure()
    halvings = 0
    while kl > target and halvings < max_halvings:
        with torch.no_grad():
            for p, start in zip(params, before, strict=True):
                p.copy_(start + (p - start) * 0.5)
        halvings += 1
        kl, kl_max = measure()
    if kl <= target:
        return BandedStep(kl, kl_max, halvings, False)
    with torch.no_grad():
        for p, start in zip(params, before, strict=True):
            p.copy_(start)
    kl, kl_max = measure()  # the KL of the updates before this step, which were kept inside the band
    return BandedStep(kl, kl_max, halvings, True)
