#!/usr/bin/env python
"""The 83 AMC 2022-23 problems of AI-MO/aimo-validation-amc, the GVPO recipe's AMC evaluation set. The CW-GRPO recipe's
AMC23 is another file, the 40 problems of knoveleng/AMC-23 (prepare_amc23.py).

    python examples/cluster/prepare_amc.py --source DIR      (--help: the download and the checks)
"""

from __future__ import annotations

from prepare_common import ANSWER, TEXT, Dataset, table_script

DATASET = Dataset(
    name="amc", hub="AI-MO/aimo-validation-amc", split="train", rows=83,
    fields={"problem": TEXT, "answer": ANSWER}, out="/data/benchmarks/amc.jsonl",
    recipes="gvpo_math_qwen2.5-math-7b.yaml and its GRPO baseline (evaluation set amc)",
    layout="hf download --repo-type dataset AI-MO/aimo-validation-amc --local-dir DIR: "
           "DIR/data/train-00000-of-00001.parquet, columns id, problem, answer, url",
    counted="count and split from AI-MO/aimo-validation-amc's dataset viewer (train, 83 rows) and the file "
            "data/train-00000-of-00001.parquet from its file list; the columns are unverified (copies of its card "
            "list problem, answer, url)")

if __name__ == "__main__":
    table_script(DATASET)
