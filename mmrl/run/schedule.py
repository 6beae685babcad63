"""Learning-rate schedules, the same on both backends: transformers' schedulers, which OpenRLHF 0.11 also builds
(``--actor.lr_scheduler``, ``--actor.lr_warmup_ratio``, ``--actor.min_lr_ratio``, in ``openrlhf/utils/deepspeed``).

``optim.schedule`` names the shape after ``optim.warmup_steps`` optimizer steps of linear warm-up from 0:

* ``constant``: the peak lr to the end (transformers' ``constant_with_warmup``);
* ``linear``: linear decay to 0 at the last optimizer step (``linear``, the HF Trainer's default);
* ``cosine``: half a cosine down to ``optim.min_lr_ratio`` × lr (``cosine_with_min_lr``, Open-RS's schedule).
"""

from __future__ import annotations

import functools
import math

from mmrl.errors import UserError

SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine_with_min_lr"}


def transformers_name(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise UserError(f"config: optim.schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return SCHEDULES[schedule]


def lr_factor(schedule: str, step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """The lr multiplier at optimizer step ``step``: transformers' formula for the schedule, written out here because
    importing transformers' scheduler module imports its trainer stack (and with it peft and bitsandbytes, whose
    import warnings a plain run should not print). tests/test_schedule.py checks it against transformers."""
    transformers_name(schedule)
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * 0.5 * progress))  # half a cosine (transformers' num_cycles 0.5)
    return max(0.0, cosine * (1 - min_lr_ratio) + min_lr_ratio)


def build_scheduler(optimizer, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float):
    """The scheduler of ``total_steps`` optimizer steps (stepped once per optimizer step)."""
    from torch.optim.lr_scheduler import LambdaLR

    total = max(total_steps, 1)
    return LambdaLR(optimizer, functools.partial(lr_factor, schedule, warmup_steps=warmup_steps, total_steps=total,
                                                 min_lr_ratio=min_lr_ratio))
