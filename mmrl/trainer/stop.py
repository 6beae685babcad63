"""The stop signals of a local run: SIGINT or SIGTERM finishes the step (or the evaluation) under way, checkpoints and
stops; a second one stops at once, the last checkpoint staying valid, except while a checkpoint is being written,
which it waits for, so a checkpoint is never torn."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

from mmrl.errors import Interrupted
from mmrl.run.checkpoint import latest_checkpoint

log = logging.getLogger("mmrl")


@dataclasses.dataclass
class StopSignals:
    signal: int | None = None  # set by SIGINT/SIGTERM: finish the step, checkpoint, stop
    writing_checkpoint: bool = False  # a second signal now waits for the write (then stops) instead of tearing it
    after_write: int | None = None  # the signal that arrived during the write
    evaluating: bool = False  # in the run's evaluation of the step just trained (or of the model before any step)

    def request(self, signum: int, step: int, steps: int, run_dir: Path) -> None:
        """A signal arrived after ``step`` of ``steps`` steps of the run in ``run_dir``."""
        if self.writing_checkpoint:  # never torn: the first signal stops the loop after it, a second one raises then
            log.warning("signal %d: the checkpoint of step %d is being written; stopping when it is complete",
                        signum, step)
            if self.signal is None:
                self.signal = signum
            else:
                self.after_write = signum
            return
        if self.signal is not None:  # a second signal: stop now, the last checkpoint stays valid
            raise Interrupted(signum, latest_checkpoint(run_dir))
        log.warning("signal %d: %s", signum, self.message(step, steps))
        self.signal = signum

    @contextlib.contextmanager
    def evaluation(self):
        self.evaluating = True
        try:
            yield
        finally:
            self.evaluating = False

    def message(self, step: int, steps: int) -> str:
        """What a first stop signal lets finish. The step counter is advanced before the step's evaluation, so
        during one it already names the step being finished; before the first step nothing is checkpointed."""
        if not self.evaluating and step >= steps:  # after the last step: its files are written
            return f"step {step} was the last; finishing the run's files, then stopping"
        if not self.evaluating:
            return f"finishing step {step + 1}, then checkpointing and stopping"
        if step == 0:
            return "finishing the evaluation before the first step, then stopping"
        if step >= steps:
            return f"finishing the final evaluation (step {step}), then checkpointing and stopping"
        return f"finishing the evaluation of step {step}, then checkpointing and stopping"
