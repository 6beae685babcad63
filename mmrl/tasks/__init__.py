"""Tasks: prompts + a reward. ``get_task(name, **options)``; ``TASKS`` lists them."""

from mmrl.tasks import (  # noqa: F401  (registers the tasks)
    alfworld,
    arithmetic,
    arithmetic_stream,
    classification,
    countdown,
    grounding,
    math,
    visual_choice,
)

# isort: split
from mmrl.tasks import geometry3k, geoqa  # noqa: F401  (the geometry vision tasks)
from mmrl.tasks.base import TASK_CONFIG_DEFAULTS, TASKS, GeneratedRows, Task, get_task, register_task

__all__ = ["TASKS", "TASK_CONFIG_DEFAULTS", "GeneratedRows", "Task", "get_task", "register_task"]
