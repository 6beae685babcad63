"""docs/results.md is generated from the committed benchmark summaries, and is never stale against them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


report = _module("report")
summary = _module("summary")


def test_the_results_page_is_what_the_committed_summaries_render():
    assert report.main(["--check"]) == 0, "run `python benchmarks/report.py` and commit docs/results.md"


def test_every_committed_summary_is_small_and_complete():
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        assert path.stat().st_size < summary.MAX_BYTES, path
        loaded = report.load(path)
        assert loaded["command"].startswith("python "), path
        for row in loaded["rows"]:
            assert row["n"] == len(row["values"]), (path, row["label"])


def test_no_benchmark_writes_anything_but_a_summary_into_the_results_folder_by_default():
    """benchmarks/results/*.json is what the results page renders: a benchmark whose default ``--out`` were a JSON
    file there would leave a file that is not a summary, and the page could no longer be built."""
    import re

    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        for default in re.findall(r'"--out",\s*default="([^"]+)"', script.read_text()):
            assert not default.endswith(".json"), f"{script.name}: --out {default}, not a folder for <out>.json"


def test_a_written_summary_renders_with_its_command_mean_and_standard_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [summary.result_row("gpg", "held-out pass@1 lift", {0: 0.1, 1: 0.2, 2: 0.3})]
    path = summary.write_summary(tmp_path / "demo", "A demo claim", rows, seeds=[0, 1, 2],
                                 command="python benchmarks/vision.py curves --seeds 0,1,2")
    assert path == tmp_path / "demo.json"
    row = json.loads(path.read_text())["rows"][0]
    assert row["mean"] == pytest.approx(0.2) and row["se"] == pytest.approx(0.1 / 3**0.5)
    page = report.render(tmp_path)
    assert '<a id="demo"></a>' in page and "## A demo claim" in page
    assert "python benchmarks/vision.py curves --seeds 0,1,2" in page
    commit = json.loads(path.read_text())["commit"]  # the code that measured: this checkout's HEAD
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert commit.split("+")[0] == head.stdout.strip() and f"code at commit {commit}" in page
    assert "| gpg | held-out pass@1 lift | 0.200 | 0.058 | 0.100 … 0.300 | 3 |" in page


def test_a_broken_summary_is_named_with_its_missing_field(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"schema": report.SCHEMA, "title": "t"}))
    with pytest.raises(ValueError, match=r"bad\.json: field 'command' is missing"):
        report.render(tmp_path)


def test_a_non_finite_value_is_refused():
    with pytest.raises(ValueError, match="not finite"):
        summary.result_row("x", "lift", {0: float("nan")})


@pytest.mark.parametrize(("df", "table"), [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)])
def test_the_t_quantile_matches_the_tables(df, table):
    assert summary.t_quantile(0.975, df) == pytest.approx(table, abs=1e-3)


def test_a_paired_row_is_the_seed_by_seed_difference_with_its_t_interval(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arm, base = {0: 0.30, 1: 0.25, 2: 0.40, 3: 0.9}, {0: 0.20, 1: 0.25, 2: 0.20}  # seed 3 has no partner
    row = summary.paired_row("gigpo", "success minus grpo's (same seed)", arm, base, algo="gigpo")
    assert row["values"] == pytest.approx({"0": 0.1, "1": 0.0, "2": 0.2}) and row["n"] == 3
    half = 4.303 * 0.1 / 3**0.5  # t(0.975, 2) × standard error
    assert row["ci"] == pytest.approx([0.1 - half, 0.1 + half], abs=1e-3) and row["ci_level"] == 0.95
    assert "ci" not in summary.paired_row("one seed", "difference", {0: 0.3}, {0: 0.2})
    summary.write_summary(tmp_path / "paired", "A paired claim", [row], seeds=[0, 1, 2], command="python x.py")
    assert "| 0.100 (95% CI -0.148 … 0.348) |" in report.render(tmp_path)
