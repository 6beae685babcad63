"""benchmarks/alfworld_layouts.py: its summary, read from finished run folders (no run starts here): greedy and
sampled held-out success per pair, each pair's rise minus the first pair's seed by seed with a t-interval, and what
one held-out game is worth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "alfworld_layouts.py"


def finished_run(run: Path, greedy: tuple[float, float], sampled: tuple[float, float]) -> None:
    """A run folder as the benchmark leaves it after 2 steps: metrics with evaluations at step 0 and 2, and its cost."""
    run.mkdir(parents=True)
    step = {"step_time": 10.0, "batch_tokens": 900, "truncated_episodes": 0.0, "episode_length": 7.0}

    def evaluation(i: int) -> dict:
        return {"eval/greedy/pass@1": greedy[i], "eval/greedy/games": 96, "eval/greedy/episodes_per_game": 1,
                "eval/sampled/pass@1": sampled[i], "eval/sampled/games": 96, "eval/sampled/episodes_per_game": 4}

    records = [{"step": 0, **evaluation(0)}, {"step": 1, **step}, {"step": 2, **step, **evaluation(1)}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "cost.json").write_text(json.dumps({"wall_s": 100.0, "peak_rss_mib": 900.0}))


def test_pairs_are_compared_with_the_first_seed_by_seed_on_greedy_and_sampled_success(tmp_path):
    out = tmp_path / "layouts"
    runs = {"grpo-episode": {0: ((0.50, 0.55), (0.40, 0.42)), 1: ((0.45, 0.45), (0.41, 0.40)),
                             2: ((0.50, 0.50), (0.39, 0.41))},
            "gigpo-turn": {0: ((0.50, 0.60), (0.40, 0.47)), 1: ((0.45, 0.50), (0.41, 0.44)),
                           2: ((0.50, 0.60), (0.39, 0.45))}}
    for pair, seeds in runs.items():
        for seed, (greedy, sampled) in seeds.items():
            finished_run(out / "runs" / f"{pair}-s{seed}", greedy, sampled)
    done = subprocess.run([sys.executable, str(SCRIPT), "--pairs", "grpo:episode,gigpo:turn", "--seeds", "0,1,2",
                           "--steps", "2", "--out", str(out)], capture_output=True, text=True, cwd=tmp_path,
                          check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "layouts.json").read_text())
    rows = {(r["label"], r["metric"]): r for r in summary["rows"]}
    greedy = rows[("gigpo, turn layout", "held-out greedy success rise minus grpo, episode layout's (same seed)")]
    assert greedy["values"] == pytest.approx({"0": 0.05, "1": 0.05, "2": 0.1})
    low, high = greedy["ci"]
    assert low < greedy["mean"] < high and greedy["ci_level"] == 0.95
    assert ("gigpo, turn layout", "held-out sampled success rise minus grpo, episode layout's (same seed)") in rows
    assert not any(" minus " in metric for label, metric in rows if label.startswith("grpo"))
    assert rows[("grpo, episode layout", "held-out sampled success after step 2")]["values"] == {
        "0": 0.42, "1": 0.40, "2": 0.41}
    assert "greedy: 96 games × 1 episode, one game is 0.0104 of success" in summary["notes"]
    assert "sampled: 96 games × 4 episodes" in summary["notes"]
