"""mmrl's lr schedules equal transformers' (which the openrlhf backend builds) at every optimizer step."""

from __future__ import annotations

import pytest
import torch

from mmrl.run.schedule import SCHEDULES, build_scheduler


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("warmup, total, floor", [(0, 10, 0.0), (3, 20, 0.1), (5, 5, 0.0), (0, 1, 0.2)])
def test_each_schedule_equals_transformers_at_every_step(schedule, warmup, total, floor):
    from transformers import get_scheduler

    floor = floor if schedule == "cosine" else 0.0

    def lrs(make):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        scheduler = make(optimizer)
        seen = []
        for _ in range(total + 2):
            seen.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return seen

    ours = lrs(lambda opt: build_scheduler(opt, schedule, warmup, total, floor))
    extra = {"min_lr_rate": floor} if schedule == "cosine" else {}
    theirs = lrs(lambda opt: get_scheduler(SCHEDULES[schedule], opt, num_warmup_steps=warmup,
                                           num_training_steps=total, scheduler_specific_kwargs=extra))
    assert ours == pytest.approx(theirs, abs=1e-12)


def test_a_plain_run_does_not_import_the_trainer_stack_of_transformers():
    import subprocess
    import sys

    code = ("import sys, torch; from mmrl.run.schedule import build_scheduler; "
            "build_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1), 'cosine', 1, 5, 0.1); "
            "print(sorted(m for m in ('peft', 'bitsandbytes', 'transformers.trainer_utils') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
