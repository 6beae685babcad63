"""python -m mmrl.expect: a finished run's held-out figures beside the published per-seed figures of its model."""

from __future__ import annotations

import json

import pytest

from mmrl.expect import main, report
from mmrl.models.recipes.ship import record_expectation
from mmrl.models.shipped import WEIGHTS_DIR, read_manifest

MODEL = "embedded:tiny-qwen2.5-vl"


def write_run(run, steps=40, algo="gpg", options=None):
    run.mkdir()
    config = {"model": {"name": MODEL}, "task": {"name": "geoqa", "options": options or {}},
              "algo": {"name": algo}, "run": {"steps": steps}}
    (run / "config.json").write_text(json.dumps(config))
    records = [{"step": 0, "eval/pass@1": 0.30}, {"step": 5, "reward": 0.4}, {"step": 40, "eval/pass@1": 0.45}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def summary_file(tmp_path):
    tags = {"task": "geoqa", "options": {}, "algo": "gpg", "key": "eval/pass@1", "steps": 40}
    rise = {"label": "geoqa gpg", "metric": "held-out pass@1 rise by step 40", "unit": "", "n": 3, "mean": 0.16,
            "se": 0.02, "min": 0.12, "max": 0.2, "values": {"0": 0.12, "1": 0.16, "2": 0.2},
            "tags": {**tags, "kind": "rise"}}
    path = tmp_path / "demo_geoqa_gpg.json"
    path.write_text(json.dumps({"title": "t", "command": "python benchmarks/vision.py curves", "rows": [rise]}))
    return path


@pytest.fixture
def weights(tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    manifest = {"format": 1, "models": {MODEL: read_manifest(WEIGHTS_DIR)["models"][MODEL]}}
    manifest["models"][MODEL].pop("expected", None)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    record_expectation(MODEL, summary_file(tmp_path), folder)
    return folder


def test_a_matching_run_is_set_beside_the_published_mean_and_range(tmp_path, weights):
    write_run(tmp_path / "run")
    (line,) = report(tmp_path / "run", weights)
    assert "this run +0.150" in line and "published mean +0.160, range +0.120 … +0.200 over 3 seeds" in line
    assert "docs/results.md#demo_geoqa_gpg" in line


@pytest.mark.parametrize("change", [{"steps": 20}, {"algo": "grpo"}, {"options": {"reward": "giou_plus_one"}}])
def test_a_run_unlike_the_published_ones_says_there_is_no_figure(tmp_path, weights, change):
    tags_options = change.pop("options", None)
    write_run(tmp_path / "run", **change, options=tags_options)
    (line,) = report(tmp_path / "run", weights)
    if tags_options is None:
        assert line.startswith("no published figure for embedded:tiny-qwen2.5-vl")
    else:  # an option the published run did not set keeps its match (the figure's tags name only what they set)
        assert "this run" in line


def test_a_summary_without_tagged_rows_is_refused(tmp_path, weights):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"title": "t", "command": "c", "rows": [{"label": "x"}]}))
    with pytest.raises(ValueError, match="no tagged rows"):
        record_expectation(MODEL, bare, weights)


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "cannot read the run's config.json" in capsys.readouterr().err
