"""The named evaluation sets of a run (config ``evaluation.sets``), built once at start.

A set is a task whose ``eval`` rows are the set's problems and whose reward scores them, plus its sampling
(`EvalSetConfig`). ``path: ""`` is the run task's own held-out split (options may rebuild it, e.g. another ALFWorld
split); a ``path`` is read by the run's task with the set's options over the run's (columns, template, hub split), as
training data is, and all its rows are problems. Both backends evaluate the same sets with the same settings.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from mmrl.errors import UserError
from mmrl.run.config import EvalSetConfig, TrainConfig, eval_set_configs
from mmrl.tasks import TASKS, Task, get_task
from mmrl.tasks.base import EnvTask


@dataclasses.dataclass(frozen=True)
class EvalSet:
    config: EvalSetConfig
    task: Task | EnvTask  # ``task.eval``: the problems; ``task.reward``: their scorer

    @property
    def name(self) -> str:
        return self.config.name

    def max_new_tokens(self, cfg: TrainConfig) -> int:
        return self.config.max_new_tokens or cfg.rollout.max_new_tokens


def _rebuild(cfg: TrainConfig, options: dict[str, Any], where: str, read_path: bool = False) -> Task | EnvTask:
    try:
        return get_task(cfg.task.name, **options)
    except ValueError as exc:
        # the task reads the set's file as its task.path; the user wrote it as the set's path, so that is named
        if read_path and str(exc).startswith("task.path: "):
            raise UserError(f"config: {where}.path: {str(exc).removeprefix('task.path: ')}") from exc
        raise UserError(f"config: {where}: {exc}") from exc


def build_eval_sets(cfg: TrainConfig, task: Task | EnvTask) -> list[EvalSet]:
    """The run's evaluation sets; empty when ``evaluation.sets`` is (the trainer then uses ``run.eval_*``)."""
    sets = []
    accepted = set(inspect.signature(TASKS[cfg.task.name]).parameters)
    for i, es in enumerate(eval_set_configs(cfg)):
        where = f"evaluation.sets[{i}] ({es.name})"
        if not es.path:
            built = _rebuild(cfg, {**cfg.task.options, **es.options}, where) if es.options else task
        elif task.multi_turn or not {"path", "eval_path", "eval_fraction"} <= accepted:
            raise UserError(f"config: {where}.path: task {cfg.task.name!r} does not read problems from a file; "
                             f"choose its games or split with {where}.options instead")
        else:
            read = _rebuild(cfg, {**cfg.task.options, "path": es.path, "eval_path": "", "eval_fraction": 0.0,
                                  **es.options}, where, read_path=True)
            built = dataclasses.replace(read, eval=read.train)
        if built.multi_turn and es.repetition_penalty != 1.0:
            raise UserError(f"config: {where}.repetition_penalty: the episodes of multi-turn task "
                             f"{cfg.task.name!r} are sampled without a repetition penalty; leave it at 1.0")
        rows = built.eval[: es.max_problems] if es.max_problems else built.eval
        if not rows:
            raise UserError(f"config: {where} has no problems")
        sets.append(EvalSet(es, dataclasses.replace(built, eval=rows)))
    return sets
