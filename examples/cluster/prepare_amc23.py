#!/usr/bin/env python
"""AMC 2023's 40 problems as Open-RS evaluates them (knoveleng/AMC-23), an evaluation set of the CW-GRPO recipe. The
GVPO recipe's AMC is another file, the 83 AMC 2022-23 problems of AI-MO/aimo-validation-amc (prepare_amc.py).

    python examples/cluster/prepare_amc23.py --source DIR      (--help: the download and the checks)
"""

from __future__ import annotations

from prepare_common import ANSWER, TEXT, Dataset, table_script

DATASET = Dataset(
    name="amc23", hub="knoveleng/AMC-23", split="train", rows=40,
    fields={"problem": TEXT, "answer": ANSWER}, out="/data/benchmarks/amc23.jsonl",
    recipes="cw_grpo_openrs_r1-distill-qwen-1.5b.yaml and its GRPO baseline (evaluation set amc23)",
    layout="hf download --repo-type dataset knoveleng/AMC-23 --local-dir DIR: DIR/data/train-*.parquet (or "
           "DIR/train.jsonl), columns problem, answer, ...",
    counted="count and split from Open-RS's logs/evals results (custom|amc23: knoveleng/AMC-23, split train, "
            "original_num_docs 40) and its src/open_r1/evaluate.py (columns problem, answer); the file names are "
            "unverified")

if __name__ == "__main__":
    table_script(DATASET)
