"""The openrlhf backend's device checks, without starting a training job: a real run on a machine without GPUs is
refused at once, a rehearsal on a machine with GPUs says so and runs, the rehearsal's flags and layout defaults, and
an unplaceable placement group is named within its timeout instead of pending forever."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmrl.openrlhf.launch import check_devices, resolve_launch
from mmrl.openrlhf.network import local_ray_options
from mmrl.openrlhf.rehearsal import gpu_note
from mmrl.train import parse_config

REPO = Path(__file__).resolve().parents[1]
DASHBOARD_PORT = 8265  # Ray's default


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without GPUs")
def test_a_real_run_without_gpus_is_refused_at_once_and_writes_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mmrl.train", "--backend", "openrlhf", "--algo", "gpg", "--steps",
                           "2", "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: cluster: this machine has no GPU") and "--cluster.rehearsal true" in lines[-1]
    assert not (tmp_path / "run").exists()
    assert time.monotonic() - start < 120  # an import-bound start, never a hang (not a benchmark)


def test_a_rehearsal_on_a_machine_with_gpus_gets_a_one_line_note(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    note = gpu_note()
    assert note is not None and "\n" not in note and "8 GPU" in note and "rehearsal" in note
    cfg = parse_config(["--backend", "openrlhf", "--cluster.rehearsal", "true"])
    assert check_devices(cfg) == note  # a note, not an error: it runs as asked


def test_the_rehearsal_layout_and_flags(tmp_path, embedded_model_dir):
    cfg = parse_config(["--backend", "openrlhf", "--cluster.rehearsal", "true", "--algo", "gpg", "--out",
                        str(tmp_path)])
    assert (cfg.cluster.nodes, cfg.cluster.gpus_per_node, cfg.cluster.vllm_engines) == (1, 1, 1)
    args = resolve_launch(cfg, write=False).args
    assert args.ds.attn_implementation == "sdpa" and args.vllm.sync_backend == "gloo"
    assert not args.ds.enable_sleep and args.train.colocate_all and args.vllm.enable_sleep
    # flags still override the rehearsal's defaults (a 2-rank layout rehearsed as asked)
    cfg = parse_config(["--backend", "openrlhf", "--cluster.rehearsal", "true", "--cluster.gpus_per_node", "2",
                        "--cluster.vllm_engines", "2", "--out", str(tmp_path)])
    assert cfg.cluster.gpus_per_node == 2
    # without the rehearsal nothing changes: OpenRLHF's own defaults (flash attention, nccl)
    args = resolve_launch(parse_config(["--backend", "openrlhf", "--out", str(tmp_path)]), write=False).args
    assert args.ds.attn_implementation != "sdpa" and args.vllm.sync_backend == "nccl"
    assert args.eval.steps == -1  # run.eval_every 0: OpenRLHF never evaluates mid-run; mmrl's trainer does at the end


@pytest.mark.slow  # starts a local Ray cluster
def test_an_unplaceable_layout_is_named_within_the_timeout():
    ray = pytest.importorskip("ray")
    from openrlhf_stubs import openrlhf_importable
    from ray.util.placement_group import placement_group

    with openrlhf_importable():
        from mmrl.openrlhf.driver import wait_placed

    ray.init(num_cpus=2, num_gpus=1, object_store_memory=100 * 1024 ** 2, **local_ray_options())
    try:
        pg = placement_group([{"GPU": 1, "CPU": 1} for _ in range(2)], strategy="PACK")
        start = time.monotonic()
        with pytest.raises(ValueError, match=r"missing GPU \(needs 2, 1 free\)"):
            wait_placed(pg, timeout=2)
        assert time.monotonic() - start < 60
    finally:
        ray.shutdown()


def test_a_local_ray_that_the_backend_starts_listens_on_loopback_only(tmp_path):
    """What a rehearsal launch without cluster.ray_address starts (driver.start_ray): GCS, raylet, object manager,
    agents and a worker actor, all on 127.0.0.1, with no dashboard (docs/security.md)."""
    ray = pytest.importorskip("ray")
    from listeners import exposed, listeners
    from openrlhf_stubs import openrlhf_importable

    with openrlhf_importable():
        from mmrl.openrlhf.driver import start_ray

    assert start_ray("", rehearsal_gpus=1)
    try:
        worker = ray.remote(num_cpus=1)(lambda: os.getpid())
        pid = ray.get(worker.remote())
        assert pid in {p for p, *_ in listeners()}  # the worker's own server is among those checked
        assert not exposed(), "\n".join(exposed())
        assert DASHBOARD_PORT not in {port for *_, port in listeners()}
    finally:
        ray.shutdown()
