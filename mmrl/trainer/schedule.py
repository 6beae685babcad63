"""Learning-rate schedules, the same on both backends: transformers' schedulers, which OpenRLHF 0.11 also builds
(``--actor.lr_scheduler``, ``--actor.lr_warmup_ratio``, ``--actor.min_lr_ratio``, in ``openrlhf/utils/deepspeed``).

``optim.schedule`` names the shape after ``optim.warmup_steps`` optimizer steps of linear warm-up from 0:

* ``constant``: the peak lr to the end (transformers' ``constant_with_warmup``);
* ``linear``: linear decay to 0 at the last optimizer step (``linear``, the HF Trainer's default);
* ``cosine``: half a cosine down to ``optim.min_lr_ratio`` × lr (``cosine_with_min_lr``, Open-RS's schedule).
"""

from __future__ import annotations

from mmrl.errors import UserError

SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine_with_min_lr"}


def transformers_name(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise UserError(f"config: optim.schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return SCHEDULES[schedule]


def build_scheduler(optimizer, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float):
    """The scheduler of ``total_steps`` optimizer steps (stepped once per optimizer step)."""
    from transformers import get_scheduler

    name = transformers_name(schedule)
    extra = {"min_lr_rate": min_lr_ratio} if schedule == "cosine" else {}
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=max(total_steps, 1),
                         scheduler_specific_kwargs=extra)
