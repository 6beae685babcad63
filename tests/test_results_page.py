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


def committed_summaries() -> list[Path]:
    """The summaries git tracks in benchmarks/results/ (every one there outside a git checkout): what the page is
    built from, whatever else a user's own runs may have left in the folder."""
    results = ROOT / "benchmarks" / "results"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", "benchmarks/results"],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        return sorted(results.glob("*.json"))
    paths = [ROOT / name for name in listed.stdout.split("\0") if name]
    return sorted(p for p in paths if p.parent == results and p.suffix == ".json" and p.is_file())


def test_the_results_page_is_what_the_committed_summaries_render():
    page = report.PAGE.read_text()
    assert page == report.render(summaries=committed_summaries()), (
        "run `python benchmarks/report.py` and commit docs/results.md with the summaries it renders")


def test_every_committed_summary_is_small_and_complete():
    assert committed_summaries(), "no committed summary found"
    for path in committed_summaries():
        assert path.stat().st_size < summary.MAX_BYTES, path
        loaded = report.load(path)
        assert loaded["command"].startswith("python "), path
        for row in loaded["rows"]:
            assert row["n"] == len(row["values"]), (path, row["label"])


def test_every_benchmark_takes_its_output_folder_from_the_shared_arguments():
    """A default run writes under runs/bench/ and only --publish writes into benchmarks/results/: each benchmark
    with an output folder declares it through summary.add_out_arguments, and none names the results folder itself."""
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        text = script.read_text()
        if script.stem in ("summary", "report") or ("--out" not in text and "write_summary(" not in text):
            continue
        for default in ('default="benchmarks/results', 'Path("benchmarks/results")'):
            assert default not in text, f"{script.name}: {default}... (publish with --publish only)"
        if "write_summary(" in text and script.stem != "config_runs":  # config_runs: --out is always given
            assert "add_out_arguments(" in text, f"{script.name}: declare --out with summary.add_out_arguments"


def test_the_output_arguments_default_to_a_run_folder_and_publish_on_request(tmp_path, monkeypatch):
    import argparse

    monkeypatch.chdir(ROOT)
    parser = argparse.ArgumentParser()
    summary.add_out_arguments(parser, "demo")
    assert parser.parse_args([]).out == "runs/bench/demo"
    assert parser.parse_args(["--publish"]).out == "benchmarks/results/demo"
    assert parser.parse_args(["--out", str(tmp_path / "mine")]).out == str(tmp_path / "mine")
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x", "--publish"])  # argparse: not allowed with argument --out
    helped = parser.format_help()
    assert "runs/bench/demo" in helped and "--publish" in helped and "benchmarks/results/demo.json" in helped
    monkeypatch.chdir(tmp_path)  # run from elsewhere, --publish still names this repository's results folder
    fresh = argparse.ArgumentParser()
    summary.add_out_arguments(fresh, "demo")
    assert fresh.parse_args(["--publish"]).out == str(ROOT / "benchmarks" / "results" / "demo")


def test_a_file_that_is_not_a_summary_is_named_and_refused(tmp_path, capsys, monkeypatch):
    (tmp_path / "gpu_check-cpu-tiny-20261207T000000Z.json").write_text(json.dumps({"device": "cpu", "pass": True}))
    with pytest.raises(ValueError, match=r"gpu_check-cpu-tiny-20261207T000000Z\.json: not a published summary .*"
                                         r"move the file out"):
        report.render(tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert report.main(["--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gpu_check-cpu-tiny-20261207T000000Z.json" in err and "runs/bench/" in err


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
