#!/usr/bin/env python
"""MATH-500, the 500-problem MATH test subset of Lightman et al., an evaluation set of the GVPO and CW-GRPO recipes.

    python examples/cluster/prepare_math500.py --source DIR      (--help: the download and the checks)
"""

from __future__ import annotations

from prepare_common import ANSWER, TEXT, Dataset, table_script

DATASET = Dataset(
    name="math500", hub="HuggingFaceH4/MATH-500", split="test", rows=500,
    fields={"problem": TEXT, "solution": TEXT, "answer": ANSWER}, out="/data/benchmarks/math500.jsonl",
    recipes="the GVPO and CW-GRPO recipes and their GRPO baselines (evaluation set math500)",
    layout="hf download --repo-type dataset HuggingFaceH4/MATH-500 --local-dir DIR: DIR/test.jsonl, columns "
           "problem, solution, answer, subject, level, unique_id",
    counted="count and split from Open-RS's logs/evals results (custom|math_500: HuggingFaceH4/MATH-500, "
            "split test, original_num_docs 500) and its src/open_r1/evaluate.py (columns problem, solution); the "
            "answer column and the file name test.jsonl are unverified: no card listing them was found")

if __name__ == "__main__":
    table_script(DATASET)
