"""Geometry3K in the EasyR1 / verl layout: ``images`` (a list), ``problem`` with ``<image>`` markers, ``answer``;
the model thinks in ``<think>`` and puts the final answer in ``\\boxed{}``.

With no ``path`` the bundled synthetic diagrams (`mmrl.tasks.geo_synthetic`) are used in this layout. With ``path``:
a local jsonl/json/parquet/csv file (parquet image cells are HF ``{"bytes", "path"}`` dicts) or ``hiyouga/geometry3k``
when online (its ``test`` split is the held-out set when ``eval_path`` names it).

Reward = ``geoqa_accuracy`` on the last ``\\boxed{}`` (math-verify, exact-match fallback) + ``format_weight`` ×
``think_boxed_format``; EasyR1's math reward weights the format 0.1.
"""

from __future__ import annotations

from mmrl.tasks.base import Task, register_task
from mmrl.tasks.geoqa import geometry_task
from mmrl.tasks.vision_data import IMAGE_TASK_DEFAULTS

BOXED_TEMPLATE = "{problem} You FIRST think about the reasoning process as an internal monologue and then provide " \
                 "the final answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final " \
                 "answer MUST BE put in \\boxed{}."


@register_task("geometry3k", config_defaults=IMAGE_TASK_DEFAULTS)
def geometry3k_task(path: str = "", eval_path: str = "", image_key: str = "images", problem_key: str = "problem",
                    answer_key: str = "answer", template: str = BOXED_TEMPLATE, format_weight: float = 0.1,
                    system_prompt: str = "", eval_fraction: float = 0.1, max_samples: int = 0, n_samples: int = 1200,
                    seed: int = 0, allow_outside_images: bool = False) -> Task:
    return geometry_task(geometry3k_task, locals(), "think_boxed_format")
