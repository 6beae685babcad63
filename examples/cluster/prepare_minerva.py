#!/usr/bin/env python
"""Minerva-Math's 272 problems (knoveleng/Minerva-Math), an evaluation set of the GVPO and CW-GRPO recipes.

    python examples/cluster/prepare_minerva.py --source DIR      (--help: the download and the checks)
"""

from __future__ import annotations

from prepare_common import TEXT, Dataset, table_script

DATASET = Dataset(
    name="minerva", hub="knoveleng/Minerva-Math", split="train", rows=272,
    fields={"problem": TEXT, "solution": TEXT}, out="/data/benchmarks/minerva.jsonl",
    recipes="the GVPO and CW-GRPO recipes and their GRPO baselines (evaluation set minerva; the gold is the "
            "solution's \\boxed{})",
    layout="hf download --repo-type dataset knoveleng/Minerva-Math --local-dir DIR: DIR/data/train-*.parquet "
           "(or DIR/train.jsonl), columns problem, solution, type, idx",
    counted="split and columns from Open-RS's src/open_r1/evaluate.py (knoveleng/Minerva-Math, split train, "
            "problem / solution) and the file data/train-00000-of-00001.parquet from the dataset's file list; "
            "unverified: the count 272 is Minerva-Math's size in other copies (extraordinarylab/minerva-math's card: "
            "272); no source states knoveleng/Minerva-Math's own count")

if __name__ == "__main__":
    table_script(DATASET)
