#!/usr/bin/env python
"""Open-RS's 7,000 training problems, as the CW-GRPO recipe and its GRPO baseline train on them.

    python examples/cluster/prepare_open_rs.py --source DIR      (--help: the download and the checks)
"""

from __future__ import annotations

from prepare_common import ANSWER, TEXT, Dataset, table_script

DATASET = Dataset(
    name="open_rs", hub="knoveleng/open-rs", split="train", rows=7000,
    fields={"problem": TEXT, "answer": ANSWER}, out="/data/open-rs/train.jsonl",
    recipes="cw_grpo_openrs_r1-distill-qwen-1.5b.yaml, grpo_openrs_r1-distill-qwen-1.5b.yaml (task.path)",
    layout="hf download --repo-type dataset knoveleng/open-rs --local-dir DIR: DIR/data/train-*.parquet, "
           "columns problem, solution, answer (the answer extracted from the solution)",
    counted="count from Open-RS's README (\"just 7,000 samples\"; recipes/grpo.yaml: dataset_name "
            "knoveleng/open-rs); Open-RS's own code reads problem and solution (src/open_r1/grpo.py, rewards.py); the "
            "answer column the recipe reads and the file names are unverified")

if __name__ == "__main__":
    table_script(DATASET)
