"""benchmarks/gpu_check.py, the one-command check for a GPU machine, run at tiny sizes on the CPU: every section's
logic works before a GPU is lent, and a CPU run never reports GPU figures."""

from __future__ import annotations

import json
import os
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


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "result.json"
    proc = run_check("--device", "cpu", "--tiny", "--threads", "1", "--json", str(out))
    return proc, out


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
