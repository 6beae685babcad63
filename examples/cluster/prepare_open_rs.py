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
           "columns problem, solution, answer (the answer extracted from the solution)")

if __name__ == "__main__":
    table_script(DATASET)
