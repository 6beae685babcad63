"""benchmarks/config_runs.py: the summary of a documented config's runs, read from finished run folders (no run
starts here): per seed, the held-out metric before and after, and with ``--algos`` each objective's rise over the
first one's, seed by seed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "config_runs.py"


def finished_run(run: Path, start: float, end: float, wall: float, extra: dict | None = None) -> None:
    """A run folder as mmrl.train leaves it after 2 steps with evaluations at step 0 and after the last step."""
    run.mkdir(parents=True)
    records = [{"step": 0, "eval/pass@1": start, **(extra or {})}, {"step": 1, "reward": 1.0},
               {"step": 2, "reward": 1.0, "eval/pass@1": end, **(extra or {})}]
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
    paired = rows[("gigpo", "held-out eval/pass@1 rise minus grpo's rise (same seed)")]
    assert abs(paired["values"]["0"] - 0.2) < 1e-9 and abs(paired["values"]["1"] + 0.1) < 1e-9
    # two seeds: mean 0.05, standard error 0.15, t(0.975, 1) = 12.706
    assert paired["ci"] == pytest.approx([0.05 - 12.706 * 0.15, 0.05 + 12.706 * 0.15], abs=1e-3)
    assert not any(" minus " in metric for algo, metric in rows if algo == "grpo")
    assert rows[("grpo", "wall time of the run")]["values"] == {"0": 60.0, "1": 61.0}
    assert "--model.threads 1" in rows[("grpo", "held-out eval/pass@1 rise")]["label"]
    assert summary["notes"].endswith("Side by side.")


def test_every_evaluation_set_headline_is_reported_with_what_one_game_is_worth(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  steps: 2\nevaluation:\n  sets:\n    - {name: greedy, temperature: 0.0}\n"
                      "    - {name: sampled, samples: 4, temperature: 0.7, metric: pass@1}\n")
    out = tmp_path / "sets"
    for seed, (greedy, sampled) in {0: (0.25, 0.5), 1: (0.5, 0.25), 2: (0.75, 0.5)}.items():
        logged = {"eval/greedy/pass@1": greedy, "eval/greedy/games": 96, "eval/greedy/episodes_per_game": 1,
                  "eval/sampled/pass@1": sampled, "eval/sampled/games": 96, "eval/sampled/episodes_per_game": 4}
        finished_run(out / "runs" / f"seed{seed}", 0.0, 0.0, wall=1.0, extra=logged)
    done = subprocess.run([sys.executable, str(SCRIPT), "--config", str(config), "--seeds", "0,1,2", "--out",
                           str(out)], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "sets.json").read_text())
    metrics = {r["metric"]: r for r in summary["rows"]}
    assert metrics["held-out eval/greedy/pass@1 after step 2"]["values"] == {"0": 0.25, "1": 0.5, "2": 0.75}
    assert metrics["held-out eval/sampled/pass@1 at step 0"]["values"] == {"0": 0.5, "1": 0.25, "2": 0.5}
    assert "held-out eval/pass@1 at step 0" not in metrics  # the config names its sets: their headlines only
    assert "eval/greedy/pass@1: 96 held-out problems × 1 sample, one problem is 0.0104" in summary["notes"]
    assert "eval/sampled/pass@1: 96 held-out problems × 4 samples" in summary["notes"]


def test_a_run_without_every_set_logged_at_its_last_step_is_not_finished(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_config_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    finished_run(tmp_path / "run", 0.1, 0.2, wall=1.0, extra={"eval/greedy/pass@1": 0.3})
    assert module.finished(tmp_path / "run", 2, ["eval/greedy/pass@1"]) is not None
    assert module.finished(tmp_path / "run", 2, ["eval/greedy/pass@1", "eval/sampled/pass@1"]) is None


def test_each_seed_draws_its_own_training_game_order():
    """What the paired comparison rests on: run.seed alone draws the local trainer's game order, so runs of one seed
    (one per objective) play the same games in the same order and another seed plays another order."""
    from mmrl.trainer.collect import PromptSampler

    def order(seed: int) -> list[int]:
        return PromptSampler(64, seed).take(3 * 64)  # three passes over 64 training games

    assert order(0) == order(0) and order(1) == order(1)
    assert order(0)[:64] != order(1)[:64] and sorted(order(0)[:64]) == list(range(64))
    assert order(0)[:64] != order(0)[64:128]  # each pass is a new shuffle


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
