"""benchmarks/real_model.py train: its runs are summarised for the results page, seed by seed, per objective and
mode (no training here: the rows are what its runs report)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_runs_are_summarised_per_objective_and_mode(tmp_path, monkeypatch):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import real_model
        import report
    finally:
        sys.path.remove(str(BENCHMARKS))
    args = argparse.Namespace(algos="grpo,gpg", steps=10, eval_k=8, prompts=4, group=4, max_new_tokens=24, threads=1,
                              note="Two runs at a time.")
    rows = [{"algorithm": algo, "mode": mode, "seed": seed, "pass@1_start": 0.4, "pass@1_end": 0.5 + seed / 100,
             "lift": [0.1, 0.11, 0.12][seed], "wall_s": 600.0 + seed, "peak_rss_mb": 3000.0}
            for algo in ("grpo", "gpg") for mode in ("lora", "full") for seed in (0, 1, 2)]
    # tabulated from finished runs: the command recorded is the one that makes them
    monkeypatch.setattr(sys, "argv", ["benchmarks/real_model.py", "train", "--seeds", "0,1,2", "--finished-only"])
    real_model.write_train_summary(args, rows, tmp_path / "real_model")
    summary = report.load(tmp_path / "real_model.json")
    by = {(r["label"], r["metric"]): r for r in summary["rows"]}
    rise = by[("gpg, full fine-tune, 10 steps", "held-out pass@1 rise")]
    assert rise["values"] == {"0": 0.1, "1": 0.11, "2": 0.12} and rise["n"] == 3
    assert ("grpo, LoRA, 10 steps", "wall time of the run") in by and summary["seeds"] == [0, 1, 2]
    assert "real_model" in report.section("real_model", summary)
    assert summary["command"] == "python benchmarks/real_model.py train --seeds 0,1,2"
    assert summary["notes"].endswith(" Two runs at a time.")
    assert json.loads((tmp_path / "real_model.json").read_text())["figure"] is None  # not the repository's own
