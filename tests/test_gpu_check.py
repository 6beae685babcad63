"""benchmarks/gpu_check.py, the one-command check for a GPU machine, run at tiny sizes on the CPU: every section's
logic works before a GPU is lent, and a CPU run never reports GPU figures.

The tiny check runs as docs/gpu.md gives it, with its default arguments, in a copy of the tracked files made into a
fresh git repository (as a fresh clone): trying it, or another benchmark, leaves the checkout as it was. A default run
writes under runs/bench/ (git ignores it), never into benchmarks/results/; publishing is the explicit --publish."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def run_check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=mmrl-test", "-c", "user.email=test@localhost", *args], cwd=cwd,
                          capture_output=True, text=True, check=True, timeout=120).stdout


def untidy(checkout: Path) -> str:
    """Every change git sees: modified tracked files and untracked files it does not ignore."""
    return git(checkout, "status", "--porcelain", "--untracked-files=all")


def python(checkout: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` from the root of ``checkout``, importing its own mmrl and benchmarks; one torch thread."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The tracked files as they are in this working tree, committed into a new repository."""
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(REPO), "rev-parse"],
                                                     capture_output=True).returncode != 0:
        pytest.skip("needs git and a git checkout of mmrl")
    copy = tmp_path_factory.mktemp("clone")
    for name in git(REPO, "ls-files", "-z").split("\0"):
        source = REPO / name
        if name and source.is_file():  # a tracked file deleted in this tree is not part of it
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name, follow_symlinks=False)
    git(copy, "init", "-q")
    git(copy, "add", "-A")
    git(copy, "commit", "-q", "-m", "copy")
    assert untidy(copy) == ""
    return copy


@pytest.fixture(scope="module")
def tiny_run(checkout):
    """``python benchmarks/gpu_check.py --device cpu --tiny``, as docs/gpu.md gives it, and its result file."""
    proc = python(checkout, "benchmarks/gpu_check.py", "--device", "cpu", "--tiny")
    written = sorted((checkout / "runs" / "bench").glob("gpu_check-cpu-tiny-*.json"))
    assert len(written) == 1, (written, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc, written[0]


def test_the_tiny_cpu_check_passes_every_section(tiny_run):
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["pass"] and not result["errors"] and not result["failed"] and result["complete"]
    assert not out.with_name(out.name + ".partial").exists()
    checks = {(r["check"], r["dtype"]) for r in result["correctness"]}
    for dtype in ("float32", "bfloat16"):
        assert ("greedy sampler = generate", dtype) in checks
        assert ("log-probs = re-scoring, max |diff|", dtype) in checks
        assert ("image features once per prompt: logits max |diff|", dtype) in checks
    assert ("checkpoint: RNG states round-trip exactly", None) in checks
    learning = result["learning"]
    assert learning["arithmetic"]["steps"] == 2 and learning["geoqa"]["steps"] == 2
    assert len(learning["geoqa"]["pass@1_curve"]) == 2  # held-out pass@1 before and after training
    sides = result["throughput"]["sides"]
    assert set(sides) == {"trl", "mmrl"}
    assert sides["mmrl"]["update_tokens_per_s"] > 0 and sides["trl"]["generated_tokens_per_s"] > 0
    assert "verdict: PASS" in proc.stdout


def test_a_cpu_run_reports_no_gpu_figures(tiny_run):
    proc, out = tiny_run
    result = json.loads(out.read_text())
    env = result["environment"]
    assert result["device"] == "cpu" and env["gpu"] is None and env["bf16_peak_tflops_spec"] is None
    mmrl = result["throughput"]["sides"]["mmrl"]
    assert mmrl["mfu_vs_spec"] is None and mmrl["mfu_vs_measured_matmul"] is None
    assert all(side["peak_device_mb"] is None for side in result["throughput"]["sides"].values())
    assert "CPU (no GPU figures)" in proc.stdout and "peak RSS MB" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_asking_for_cuda_without_one_is_one_line_and_exit_2(tmp_path):
    proc = run_check("--device", "cuda", "--json", str(tmp_path / "never.json"), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("gpu_check: --device cuda: no CUDA device is available")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "never.json").exists()


def test_an_existing_result_file_is_never_overwritten(tmp_path):
    taken = tmp_path / "taken.json"
    taken.write_text("mine")
    proc = run_check("--device", "cpu", "--tiny", "--json", str(taken), timeout=120)
    assert proc.returncode == 2 and "already exists" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert taken.read_text() == "mine"


def test_spec_sheet_peaks_match_the_device_names():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from gpu_check import spec_peak_tflops
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert spec_peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert spec_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert spec_peak_tflops("NVIDIA H200") == 989.4
    assert spec_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert spec_peak_tflops("Some Future GPU") is None


def test_results_of_separate_calls_merge_into_one_summary_for_the_results_page(tiny_run, tmp_path):
    """Runs split over two calls (a lease's time limit) are merged section by section, and the summary carries the
    run's own machine and versions, the correctness checks as cases, and renders on the results page."""
    _, out = tiny_run
    whole = json.loads(out.read_text())
    first = {k: v for k, v in whole.items() if k not in ("throughput", "wall_s", "pass", "failed", "complete")}
    first["environment"] = {**whole["environment"], "gpu": "First GPU"}
    second = {k: v for k, v in whole.items() if k not in ("correctness", "learning")}
    (tmp_path / "first.json").write_text(json.dumps({**first, "complete": False}))
    (tmp_path / "second.json").write_text(json.dumps(second))
    proc = run_check("--from", str(tmp_path / "first.json"), "--from", str(tmp_path / "second.json"),
                     "--summary", str(tmp_path / "gpu_check"), "--note", "two calls", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verdict: PASS" in proc.stdout and "correctness check" in proc.stdout and "throughput:" in proc.stdout
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["machine"]["gpu"] is None  # the environment of the last call that has one: the second's
    assert summary["versions"]["torch"] == whole["environment"]["torch"] and summary["notes"] == "two calls"
    assert {c["case"] for c in summary["cases"]} >= {"greedy sampler = generate (float32)",
                                                     "checkpoint: RNG states round-trip exactly"}
    metrics = {(r["label"].split(":")[0], r["metric"]) for r in summary["rows"]}
    assert ("mmrl", "update: tokens per second") in metrics and ("trl", "steps per second") in metrics
    assert any(m == "reward lift" for _, m in metrics)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import report
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    page = report.section("gpu_check", report.load(tmp_path / "gpu_check.json"))
    assert "max \\|diff\\|" in page  # a pipe inside a cell is escaped, so the table keeps its columns


def test_a_section_done_again_replaces_an_earlier_failure_of_it():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from gpu_check import merge_results
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    first = {"mode": "full", "sections": ["throughput"], "errors": {"throughput": "OutOfMemoryError"},
             "cpu_reference": {"arithmetic": {"lift": 0.2}}}
    second = {"mode": "full", "sections": ["throughput"], "errors": {}, "throughput": {"sides": {}},
              "learning": {"device": "cuda", "arithmetic": {"lift": 0.3}, "geoqa": {"lift": 0.1}}}
    merged = merge_results([first, second])
    assert merged["errors"] == {} and "cpu_reference" not in merged and merged["throughput"] == {"sides": {}}


def test_default_runs_leave_the_checkout_clean_and_the_page_current(checkout, tiny_run):
    """The tiny check and vision_rewards.py, each with its default arguments: nothing git sees changes, each says
    where its result went, and the results page still matches the published summaries."""
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(out.relative_to(checkout)) in proc.stdout
    rewards = python(checkout, "benchmarks/vision_rewards.py")
    assert rewards.returncode == 0, rewards.stderr[-3000:]
    assert "wrote runs/bench/vision_rewards.json" in rewards.stdout
    assert json.loads((checkout / "runs/bench/vision_rewards.json").read_text())["schema"] == "mmrl-result/1"
    assert untidy(checkout) == ""
    check = python(checkout, "benchmarks/report.py", "--check", timeout=120)
    assert check.returncode == 0, check.stderr


def test_a_stray_file_in_the_results_folder_is_named_and_the_tests_still_pass(checkout, tiny_run):
    """A result copied by hand into benchmarks/results/: report.py names it and says to move it, in one line; the
    tests of the results page read what is committed, so they still pass."""
    stray = checkout / "benchmarks" / "results" / "stray.json"
    shutil.copyfile(tiny_run[1], stray)
    try:
        check = python(checkout, "benchmarks/report.py", "--check", timeout=120)
        assert check.returncode == 2 and len(check.stderr.strip().splitlines()) == 1, check.stderr
        assert "stray.json: not a published summary" in check.stderr and "move the file out" in check.stderr
        tests = python(checkout, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_results_page.py")
        assert tests.returncode == 0, tests.stdout[-3000:]
    finally:
        stray.unlink()


def test_publishing_is_the_explicit_step(checkout, tiny_run):
    """--publish writes the published summary, and only it; the page rendered from it passes --check."""
    proc = python(checkout, "benchmarks/gpu_check.py", "--from", str(tiny_run[1]), "--publish", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        assert untidy(checkout).splitlines() == [" M benchmarks/results/gpu_check.json"]
        assert python(checkout, "benchmarks/report.py", "--check", timeout=120).returncode == 1  # the page is stale
        assert python(checkout, "benchmarks/report.py", timeout=120).returncode == 0
        assert python(checkout, "benchmarks/report.py", "--check", timeout=120).returncode == 0
    finally:
        git(checkout, "checkout", "-q", "--", "benchmarks/results", "docs")
    assert untidy(checkout) == ""
