"""What mmrl's Ray actors need beside OpenRLHF's own arguments: one typed record, ``args.mmrl``.

The driver resolves it once (`mmrl.openrlhf.launch.resolve_launch`) and OpenRLHF hands ``args`` to every actor. A
frozen dataclass rather than a dict of string keys: a misspelt or missing field fails when the driver builds it, and a
field a worker reads that does not exist fails the test that reads the workers' code (tests/test_openrlhf_launch.py),
not hours later on a GPU node. Pure: no OpenRLHF import.
"""

from __future__ import annotations

import dataclasses
from typing import Any

_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool}


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """The objective (rebuilt in each actor as ``algos.get(algo, **params)``, the same one the driver built), the
    rollout's sampling beyond OpenRLHF's flags, the evaluation sets and the run's bookkeeping."""

    algo: str  # the objective's registered name
    params: dict[str, Any]  # every resolved hyper-parameter of it (Dr.GRPO's constant normaliser included)
    samples_per_prompt: int  # responses per group
    uses_reference: bool  # the objective reads reference log-probs
    kl_coef: float  # its KL-to-reference coefficient
    entropy_coef: float  # its entropy bonus
    freeze_router: bool  # moe.freeze_router
    top_k: int  # rollout.top_k (0: off); evaluations sample without it
    repetition_penalty: float  # rollout.repetition_penalty; each evaluation set has its own
    eval_sets: tuple[dict[str, Any], ...]  # evaluation.sets as `mmrl.openrlhf.evaluation.set_spec` exports them
    metrics_path: str  # where metrics.jsonl goes
    resume: bool  # it continues an earlier run's lines
    steps: int  # run.steps: rollout steps
    optimizer_steps: int  # the lr schedule's length
    env_workers: int  # rollout.env_workers: the env pool of multi-turn rollouts
    trust_remote_code: bool  # model.trust_remote_code, for the rehearsal's rollout actors
    replay_historical: int  # GVPO's replayed responses per group (rollout.replay_historical)
    target_kl: float  # optim.target_kl: a step's updates end once their measured KL to π_old leaves it (0: off)
    # algo.rollout_correction and its thresholds, as the fields of mmrl.algos.rollout_correction.RolloutCorrection
    rollout_correction: dict[str, Any]

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            kind = _TYPES.get(str(field.type))
            value = getattr(self, field.name)
            if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                raise TypeError(f"ActorSpec.{field.name}: expected {field.type}, got {value!r}")
