"""``metrics.jsonl`` of an openrlhf-backend run: one line per rollout step, as the local trainer writes it.

OpenRLHF logs to TensorBoard / W&B; mmrl's PPO trainer also writes each step's status here, with the local
trainer's names for the two headline numbers: ``loss`` (the objective over the whole step, ``policy_loss``) and
``reward`` (the mean reward of the step's rollouts, ``rollout/reward_mean``). An evaluation after a step goes into
that step's line, as the local trainer writes it: a step's line is written when the next step (or the end) comes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mmrl.run.metrics import MetricsLog

HEADLINE = {"loss": "policy_loss", "reward": "rollout/reward_mean"}


def numeric(status: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in status.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[key] = float(value)
    return out


class StepMetrics:
    def __init__(self, path: str, resume: bool) -> None:
        self.path, self.resume = Path(path), resume
        self.log: MetricsLog | None = None
        self.pending: dict[str, Any] | None = None  # the last step's line, until its evaluation (if any) is in
        self.last_step = 0

    def _open(self, step: int) -> MetricsLog:
        if self.log is None:
            # on --resume, lines of steps after the checkpoint are re-run: MetricsLog drops them
            self.log = MetricsLog(self.path, resume_step=step if self.resume else None)
        return self.log

    def write(self, step: int, status: dict[str, Any]) -> None:
        self.flush()
        values = numeric(status)
        record: dict[str, Any] = {"step": step}
        record.update({name: values.get(key, math.nan) for name, key in HEADLINE.items()})
        record.update(values)
        self.pending = record
        self.last_step = step

    def write_eval(self, step: int, logs: dict[str, Any]) -> None:
        scores = {k if k.startswith("eval") else f"eval/{k}": v for k, v in numeric(logs).items()}
        if self.pending is not None and self.pending["step"] == step:
            self.pending.update(scores)
            return
        self.flush()
        self._open(step).write({"step": step, **scores})

    def flush(self) -> None:
        if self.pending is not None:
            self._open(self.pending["step"]).write(self.pending)
            self.pending = None
