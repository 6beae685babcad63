#!/usr/bin/env python
"""MATH's 7,500 training problems (Hendrycks et al.), as the GVPO recipe and its GRPO baseline train on them.

    python examples/cluster/prepare_math_train.py --source DIR      (--help: the download and the checks)
"""

from __future__ import annotations

from prepare_common import TEXT, Dataset, table_script

DATASET = Dataset(
    name="math_train", hub="DigitalLearningGmbH/MATH-lighteval", split="train", rows=7500,
    fields={"problem": TEXT, "solution": TEXT}, out="/data/math/train.jsonl",
    recipes="gvpo_math_qwen2.5-math-7b.yaml, grpo_math_qwen2.5-math-7b.yaml (task.path)",
    layout="hf download --repo-type dataset DigitalLearningGmbH/MATH-lighteval --local-dir DIR: "
           "DIR/data/train-00000-of-00001.parquet, columns problem, level, type, solution (the gold answer is "
           "the solution's last \\boxed{})",
    counted="count: MATH's train split has 7,500 problems (lighteval/MATH's README.txt); columns problem, "
            "level, type, solution as the MATH parquet copies' cards list them; unverified: "
            "DigitalLearningGmbH/MATH-lighteval's own card and file names were not found")

if __name__ == "__main__":
    table_script(DATASET)
