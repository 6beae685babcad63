#!/usr/bin/env python
"""AIME 2024's 30 problems, an evaluation set of the GVPO and CW-GRPO recipes.

    python examples/cluster/prepare_aime24.py --source DIR      (--help: the download and the checks)
"""

from __future__ import annotations

from prepare_common import ANSWER, TEXT, Dataset, table_script

DATASET = Dataset(
    name="aime24", hub="HuggingFaceH4/aime_2024", split="train", rows=30,
    fields={"problem": TEXT, "answer": ANSWER}, out="/data/benchmarks/aime24.jsonl",
    recipes="the GVPO and CW-GRPO recipes and their GRPO baselines (evaluation set aime24)",
    layout="hf download --repo-type dataset HuggingFaceH4/aime_2024 --local-dir DIR: "
           "DIR/data/train-00000-of-00001.parquet, columns id, problem, solution, answer, url, year",
    counted="count, split and columns from HuggingFaceH4/aime_2024's dataset card (train, num_examples 30; id, "
            "problem, solution, answer, url, year) and Open-RS's logs/evals results (custom|aime24 on split train, "
            "original_num_docs 30)")

if __name__ == "__main__":
    table_script(DATASET)
