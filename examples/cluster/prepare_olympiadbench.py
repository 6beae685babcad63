#!/usr/bin/env python
"""OlympiadBench's 675 English math problems (knoveleng/OlympiadBench), an evaluation set of the GVPO and CW-GRPO
recipes.

    python examples/cluster/prepare_olympiadbench.py --source DIR      (--help: the download and the checks)
"""

from __future__ import annotations

from prepare_common import ANSWER, TEXT, Dataset, table_script

DATASET = Dataset(
    name="olympiadbench", hub="knoveleng/OlympiadBench", split="train", rows=675,
    fields={"question": TEXT, "answer": ANSWER}, out="/data/benchmarks/olympiadbench.jsonl",
    recipes="the GVPO and CW-GRPO recipes and their GRPO baselines (evaluation set olympiadbench)",
    layout="hf download --repo-type dataset knoveleng/OlympiadBench --local-dir DIR: DIR/data/train-*.parquet "
           "(or DIR/train.jsonl), columns question, answer, ...",
    counted="split and columns from Open-RS's src/open_r1/evaluate.py (knoveleng/OlympiadBench, split train, "
            "question / answer); unverified: the count 675 is the English math subset's size in other copies "
            "(SumanthRH/olympiadbench_qwen_math's viewer: 675 rows); no source states knoveleng/OlympiadBench's own "
            "count, and its file names are unverified")

if __name__ == "__main__":
    table_script(DATASET)
