"""benchmarks/config_runs.py: the summary of a documented config's runs, read from finished run folders (no run
starts here): per seed, the held-out metric before and after, and with ``--algos`` each objective's rise over the
first one's, seed by seed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "config_runs.py"


def finished_run(run: Path, start: float, end: float, wall: float) -> None:
    """A run folder as mmrl.train leaves it after 2 steps with evaluations at step 0 and after the last step."""
    run.mkdir(parents=True)
    records = [{"step": 0, "eval/pass@1": start}, {"step": 1, "reward": 1.0},
               {"step": 2, "reward": 1.0, "eval/pass@1": end}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "wall.json").write_text(json.dumps({"wall_s": wall}))


def test_objectives_are_compared_seed_by_seed_from_finished_runs(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  steps: 2\n")
    out = tmp_path / "cmp"
    rises = {"grpo": {0: (0.2, 0.3), 1: (0.2, 0.2)}, "gigpo": {0: (0.2, 0.5), 1: (0.2, 0.1)}}
    for algo, seeds in rises.items():
        for seed, (start, end) in seeds.items():
            finished_run(out / "runs" / f"{algo}-seed{seed}", start, end, wall=60.0 + seed)
    done = subprocess.run([sys.executable, str(SCRIPT), "--config", str(config), "--algos", "grpo,gigpo",
                           "--seeds", "0,1", "--out", str(out), "--note", "Side by side.", "--", "--model.threads",
                           "1"], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "cmp.json").read_text())
    rows = {(r["label"].split("--algo ")[1].split()[0], r["metric"]): r for r in summary["rows"]}
    assert rows[("gigpo", "held-out eval/pass@1 rise")]["values"] == {"0": 0.3, "1": -0.1}
    paired = rows[("gigpo", "rise minus grpo's rise (same seed)")]["values"]
    assert abs(paired["0"] - 0.2) < 1e-9 and abs(paired["1"] + 0.1) < 1e-9
    assert not any(metric.startswith("rise minus") for algo, metric in rows if algo == "grpo")
    assert rows[("grpo", "wall time of the run")]["values"] == {"0": 60.0, "1": 61.0}
    assert "--model.threads 1" in rows[("grpo", "held-out eval/pass@1 rise")]["label"]
    assert summary["notes"].endswith("Side by side.")


def test_training_success_and_kl_rows_come_from_the_step_records(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  steps: 4\n")
    out = tmp_path / "kl"
    run = out / "runs" / "seed0"
    run.mkdir(parents=True)
    steps = [{"step": i + 1, "step_time": 1.0, "success_rate": s, "kl_step": k, "kl_step_max": m}
             for i, (s, k, m) in enumerate([(0.0, 0.01, 0.5), (0.25, 0.02, 3.0), (0.5, 0.03, 1.0), (1.0, 0.02, 2.0)])]
    records = [{"step": 0, "eval/pass@1": 0.2}, *steps[:-1], {**steps[-1], "eval/pass@1": 0.4}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, str(SCRIPT), "--config", str(config), "--seeds", "0", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    rows = {r["metric"]: r["values"]["0"] for r in json.loads((tmp_path / "kl.json").read_text())["rows"]}
    # the last 3 steps' mean success minus the first 3's: (0.25 + 0.5 + 1) / 3 - (0 + 0.25 + 0.5) / 3
    assert abs(rows["training success_rate, last 3 steps minus first 3"] - 1 / 3) < 1e-9
    assert abs(rows["kl_step (KL to π_old after a step's updates), mean over steps"] - 0.02) < 1e-9
    assert rows["kl_step_max (largest token's KL to π_old), max over steps"] == 3.0
