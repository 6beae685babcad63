"""One command for a machine with one CUDA GPU: is mmrl correct there, does it learn there, how fast is it next to TRL.

    python benchmarks/gpu_check.py                      # the whole check on cuda (about 6-8 min on one H100)
    python benchmarks/gpu_check.py --device cpu --tiny  # the same code at tiny sizes on the CPU (a test runs it)

Four sections, each a block of the printed table and of the JSON (docs/gpu.md says what each line means):

1. environment: device name and memory, torch / CUDA / transformers / TRL versions, the GPU's bf16 matmul peak
   (spec sheet, and measured on one large matmul).
2. correctness, float32 and bfloat16 (autocast, as ``--model.dtype bfloat16`` trains):
   - mmrl's text sampler against transformers' ``generate``, greedy: the same tokens (float32: every row; bfloat16:
     a row may part only where the two best tokens' logits are closer than bfloat16 can tell apart);
   - the sampler's recorded log-probs against re-scoring the finished responses (max / mean difference);
   - Qwen-VL image features computed once per prompt against once per response (logits and vision-tower gradients);
   - a checkpoint written on the device: the resumed steps equal the uninterrupted run's, every RNG state (CUDA's
     included) round-trips exactly, the weights come back on the device.
3. learning: ``--task arithmetic`` GRPO (100 steps, mean reward of the first 5 against the last 20) and the geoqa demo
   (GPG, 40 steps, held-out pass@1 at step 0 and 40); on a GPU the same two runs go on the CPU beside it, in a child
   process, as the reference lift.
4. throughput: mmrl's local trainer against TRL's ``GRPOTrainer`` (benchmarks/trl_compare.py's workers, interleaved
   step by step, each in its own process) on a policy of Qwen2.5-0.5B's shape built from its config with random
   weights (nothing can be downloaded on such a machine), bfloat16 on both: steps/s, generated tokens/s, peak memory,
   and mmrl's update alone in tokens/s and as model FLOPs utilisation against the bf16 peak.

``--tiny`` keeps every section but shrinks it (tiny models, a few steps) so that the whole logic runs in well under a
minute on a CPU. A figure is labelled with the device it was measured on: a CPU run reports no GPU and no MFU.
Writes one JSON (``--json``, default ``runs/bench/gpu_check-<device>-<UTC time>.json``, which git ignores); the
results page shows a check only once it is published on purpose (``--from <json> --publish``, docs/gpu.md). Exit
status 0 when every check passes, 1 when one fails, 2 when the command line asks for what cannot be (``--device cuda``
without CUDA).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

# cuBLAS needs this before its first handle for deterministic matmuls, which the checkpoint check switches on.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a GPU machine here has no internet; nothing is downloaded

import torch  # noqa: E402
from summary import RUNS, add_out_arguments, command_line  # noqa: E402

from mmrl.cache import EMBEDDED_NAME, EMBEDDED_VL_NAME  # noqa: E402

SECTIONS = ("environment", "correctness", "learning", "throughput")
DTYPES = ("float32", "bfloat16")

# Tolerances of the correctness checks, by compute dtype. float32 is the exact path (CPU tests hold it to 1e-5; CUDA
# kernels for a one-token decode and a full-sequence forward differ in summation order). bfloat16 keeps 8 bits of
# mantissa: a logit near 10 is known to ~0.04, so a log-prob moves by a few hundredths, and two tokens whose logits are
# closer than TIE are a tie that either path may break its own way.
TOLERANCES = {
    "float32": {"logprob_max": 1e-4, "logprob_mean": 1e-5, "tie": 0.0, "image_logits": 1e-4, "image_grads": 1e-3},
    "bfloat16": {"logprob_max": 0.25, "logprob_mean": 0.02, "tie": 0.25, "image_logits": 0.05, "image_grads": 0.05},
}
CHECKPOINT_LOSS_TOL = {"cpu": 0.0, "cuda": 1e-5}  # resumed vs uninterrupted loss; CPU runs are bit-identical

# Dense bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s, matched in order against the device name.
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.5), ("GH200", 989.4), ("H200", 989.4), ("H100", 989.4),
                    ("H800", 989.4), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.1), ("L4", 121.0),
                    ("B200", 2250.0))

# Qwen2.5-0.5B's published config; the throughput policy has this shape and random weights.
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
TINY_POLICY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512, rms_norm_eps=1e-6,
                   tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4})

FULL = {
    "check_prompts": 16, "check_tokens": 16, "checkpoint_steps": 4,
    "arithmetic": {"algo.name": "grpo", "run.steps": 100, "run.eval_samples": 8, "rollout.max_new_tokens": 12},
    "geoqa": {"algo.name": "gpg", "task.name": "geoqa", "run.steps": 40, "run.eval_every": 20},
    "head_tail": (5, 20),
    "throughput": {"warmup": 1, "steps": 8, "prompts": 16, "group": 8, "max_new_tokens": 64, "lr": 1e-6,
                   "temperature": 1.0, "policy": QWEN25_05B},
}
TINY = {
    "check_prompts": 4, "check_tokens": 8, "checkpoint_steps": 2,
    "arithmetic": {"algo.name": "grpo", "run.steps": 2, "run.eval_samples": 1, "rollout.max_new_tokens": 8,
                   "rollout.prompts_per_step": 4, "rollout.samples_per_prompt": 4},
    "geoqa": {"algo.name": "gpg", "task.name": "geoqa", "run.steps": 2, "run.eval_every": 2, "task.n_samples": 20,
              "algo.max_resample": 0, "run.eval_samples": 1, "rollout.prompts_per_step": 2,
              "rollout.samples_per_prompt": 2},
    "head_tail": (1, 1),
    "throughput": {"warmup": 1, "steps": 1, "prompts": 2, "group": 2, "max_new_tokens": 4, "lr": 1e-6,
                   "temperature": 1.0, "policy": TINY_POLICY},
}
SMALL_RUN = {"rollout.prompts_per_step": 4, "rollout.samples_per_prompt": 4, "rollout.max_new_tokens": 8,
             "run.eval_samples": 1}  # the checkpoint check's runs


def autocast(device: torch.device, dtype: str):
    return torch.autocast(device.type, dtype=getattr(torch, dtype), enabled=dtype != "float32")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------- environment


def spec_peak_tflops(name: str) -> float | None:
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in name.lower():
            return tflops
    return None


def measured_matmul_tflops(device: torch.device, n: int = 8192, repeats: int = 20) -> float:
    """bf16 TFLOP/s of one large square matmul, the best this device reaches on the operation transformers use."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def environment(device: torch.device, sizes: dict) -> dict[str, Any]:
    import transformers
    from summary import machine

    host = machine()
    env: dict[str, Any] = {"device": str(device), "python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "machine": platform.machine(),
                           "cpus": os.cpu_count(), "cores": host["cores"], "cpu": host["cpu"],
                           "cpu_flags": host["flags"],
                           "torch_threads": torch.get_num_threads()}
    try:
        import trl

        env["trl"] = trl.__version__
    except ImportError as exc:  # the throughput section reports it as its failure
        env["trl"] = f"not importable: {exc}"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_gb=props.total_memory / 2**30, cuda=torch.version.cuda,
                   capability=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count(),
                   bf16_peak_tflops_spec=spec_peak_tflops(props.name),
                   bf16_matmul_tflops_measured=measured_matmul_tflops(device))
    else:
        env.update(gpu=None, cuda=None, bf16_peak_tflops_spec=None, bf16_matmul_tflops_measured=None)
    return env


# ----------------------------------------------------------------------------------------------- correctness


def check(name: str, dtype: str | None, value: Any, limit: Any, passed: bool, note: str = "") -> dict[str, Any]:
    return {"check": name, "dtype": dtype, "value": value, "limit": limit, "pass": bool(passed), "note": note}


def text_prompts(tokenizer, n: int) -> list[list[int]]:
    """The first held-out arithmetic prompts, as training encodes them."""
    from mmrl.tasks import get_task
    from mmrl.trainer.rollout import encode_prompt

    task = get_task("arithmetic")
    return [encode_prompt(tokenizer, row["messages"], 512) for row in task.eval[:n]]


def greedy_against_generate(model, tokenizer, prompts, tokens: int, device, dtype: str) -> dict[str, Any]:
    """mmrl's sampler and transformers' generate, greedy: rows equal, or parting at a tie (bfloat16 only)."""
    from mmrl.trainer.rollout import generate

    with autocast(device, dtype):
        own = generate(model, tokenizer, prompts, tokens, 0.0, 1.0, sampler="mmrl")
        hf = generate(model, tokenizer, prompts, tokens, 0.0, 1.0, sampler="hf")
    tie = TOLERANCES[dtype]["tie"]
    equal, gaps = 0, []
    for prompt, a, b in zip(prompts, own, hf, strict=True):
        if a.token_ids == b.token_ids:
            equal += 1
            continue
        k = next(i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y)
        ids = torch.tensor([prompt + a.token_ids[:k]], device=device)
        with torch.no_grad(), autocast(device, dtype):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
        gaps.append(abs(float(logits[a.token_ids[k]] - logits[b.token_ids[k]])))
    worst = max(gaps, default=0.0)
    passed = equal == len(prompts) if dtype == "float32" else worst <= tie
    note = f"{equal}/{len(prompts)} rows identical"
    if gaps:
        note += f"; rows that part do so at a logit gap of at most {worst:.3g}"
    return check("greedy sampler = generate", dtype, equal / len(prompts),
                 "all rows" if dtype == "float32" else f"part only at gap <= {tie}", passed, note)


def logprobs_against_rescoring(model, tokenizer, prompts, tokens: int, device, dtype: str) -> list[dict[str, Any]]:
    """Sampled at temperature 1 with groups sharing a pre-fill; every recorded log-prob against re-scoring."""
    from mmrl.batch import Group, collate
    from mmrl.trainer.rollout import batch_logprobs, generate

    rows = prompts * 4
    torch.manual_seed(0)
    with autocast(device, dtype):
        responses = generate(model, tokenizer, rows, tokens, 1.0, 1.0, return_logprobs=True)
        groups = [Group(i, {}, p, [r]) for i, (p, r) in enumerate(zip(rows, responses, strict=True))]
        rescored, _ = batch_logprobs(model, collate(groups, tokenizer.pad_token_id), 1.0)
    diffs = torch.cat([(rescored[i, : len(r.token_ids)].float() - torch.tensor(r.logprobs)).abs()
                       for i, r in enumerate(responses)])
    tol = TOLERANCES[dtype]
    worst, mean = float(diffs.max()), float(diffs.mean())
    note = f"{len(diffs)} tokens of {len(rows)} responses"
    out = [check("log-probs = re-scoring, max |diff|", dtype, worst, tol["logprob_max"], worst <= tol["logprob_max"],
                 note),
           check("log-probs = re-scoring, mean |diff|", dtype, mean, tol["logprob_mean"],
                 mean <= tol["logprob_mean"], note)]
    if dtype != "float32":  # the same batch in float32: bfloat16 must move the log-probs, else it was not in effect
        fp32, _ = batch_logprobs(model, collate(groups, tokenizer.pad_token_id), 1.0)
        moved = float((fp32 - rescored).abs().max())
        out.append(check(f"{dtype} autocast in effect: max |diff| to float32", dtype, moved, "> 0", moved > 0))
    return out


def shared_image_features(vl_spec: str, device, dtype: str) -> list[dict[str, Any]]:
    """Vision-tower output computed once per prompt and repeated for its group against the tower on every row's own
    pixels: the logits and the tower's gradients (2 responses for each of 3 geoqa prompts)."""
    import transformers

    from mmrl.batch import Response, collate
    from mmrl.models import load_model
    from mmrl.models.loading import load_vision_processor
    from mmrl.tasks import get_task
    from mmrl.trainer.vision_prompts import PromptCache
    from mmrl.vision.inputs import takes_encoder_outputs

    processor = load_vision_processor(vl_spec)
    tokenizer = processor.tokenizer
    model = load_model(vl_spec, device=device).eval()
    if not takes_encoder_outputs(model):  # mmrl gives such a model every row's own pixels: nothing is shared
        return [check("image features once per prompt", dtype, None, None, True,
                      f"not used: transformers {transformers.__version__}'s Qwen-VL forward takes no precomputed "
                      f"features, so the tower runs once per response")]
    task = get_task("geoqa", n_samples=20)
    cache = PromptCache(processor, task.train[:3], "train", 512)
    groups = [cache.group(i) for i in range(3)]
    answer = tokenizer("<think>AB is 3</think><answer>3</answer>", add_special_tokens=False)["input_ids"]
    for g in groups:
        g.responses = [Response(answer + [tokenizer.eos_token_id]), Response(answer[:2] + [tokenizer.eos_token_id])]
    batch = collate(groups, tokenizer.pad_token_id)
    ids, attention = batch.input_ids.to(device), batch.attention_mask.to(device)
    outputs = {}
    for shared in (False, True):
        model.zero_grad()
        with autocast(device, dtype):
            extra = batch.vision.model_inputs(batch.input_ids, device, model if shared else None)
            if ("mm_encoder_outputs" in extra) != shared:
                raise RuntimeError(f"image features were {'not ' if shared else ''}shared when they should "
                                   f"{'' if shared else 'not '}be")
            logits = model(input_ids=ids, attention_mask=attention, **extra).logits.float()
        logits.pow(2).mean().backward()
        grads = [p.grad.detach().float().clone() for p in model.model.visual.parameters() if p.grad is not None]
        outputs[shared] = (logits.detach(), grads)
    tol = TOLERANCES[dtype]
    logit_diff = float((outputs[True][0] - outputs[False][0]).abs().max())
    grad_diff = math.inf  # shared features that never reached the tower would leave it without gradients
    if len(outputs[True][1]) == len(outputs[False][1]):
        grad_diff = max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))
                        for a, b in zip(outputs[True][1], outputs[False][1], strict=True))
    note = f"{len(outputs[True][1])} vision-tower tensors with gradients"
    return [check("image features once per prompt: logits max |diff|", dtype, logit_diff, tol["image_logits"],
                  logit_diff <= tol["image_logits"]),
            check("image features once per prompt: tower grads max rel diff", dtype, grad_diff, tol["image_grads"],
                  grad_diff <= tol["image_grads"] and len(outputs[True][1]) == len(outputs[False][1]) > 0, note)]


def states_equal(a: Any, b: Any) -> bool:
    """Exact equality of RNG states as rng_state() gives them: tensors, NumPy arrays, tuples, lists, dicts."""
    import numpy as np

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def checkpoint_round_trip(device, steps: int, root: Path) -> list[dict[str, Any]]:
    """Run A trains ``steps`` steps; run B trains half, checkpoints and stops, then a new trainer resumes it. The
    resumed trainer's RNG states and weights must be those at the save, and its steps those of run A."""
    from common import run_config

    from mmrl.trainer.checkpoint import rng_state
    from mmrl.trainer.config import resolve_config
    from mmrl.trainer.local import build_trainer
    from mmrl.trainer.metrics import read_metrics

    half = steps // 2
    base = {**SMALL_RUN, "model.device": str(device), "run.steps": steps, "run.checkpoint_every": half,
            "run.seed": 3}
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # run A and the resumed run B must compute alike
    try:
        records_a, _, _ = run_config(base, root / "uninterrupted")
        quiet = {"run.progress": False, "run.plot": False, "run.overwrite": True,
                 "run.out_dir": str(root / "resumed")}
        first = build_trainer(resolve_config([({**base, **quiet}, "gpu_check")]))
        try:
            for _ in range(half):
                first.train_step()
                first.step += 1
            first.checkpoint()
            saved_rng = rng_state()
            saved_weights = {k: v.detach().clone() for k, v in first.model.state_dict().items()}
        finally:
            first.owner.lock.release()
        del first
        resumed = build_trainer(resolve_config([({**base, **quiet, "run.resume": True, "run.overwrite": False},
                                                 "gpu_check")]))
        rng_ok = states_equal(rng_state(), saved_rng)
        weights = resumed.model.state_dict()
        weights_ok = all(torch.equal(weights[k], v) for k, v in saved_weights.items())
        on_device = {p.device.type for p in resumed.model.parameters()} == {device.type}
        optimizer_on_device = all(t.device.type == device.type for s in resumed.optimizer.state.values()
                                  for t in s.values() if isinstance(t, torch.Tensor) and t.dim() > 0)
        resumed.run()
        records_b = read_metrics(root / "resumed" / "metrics.jsonl")
    finally:
        torch.use_deterministic_algorithms(deterministic)
    tail_a = [r for r in records_a if r["step"] > half]  # the updates after the checkpoint
    tail_b = [r for r in records_b if r["step"] > half]
    same_rewards = [r["reward"] for r in tail_a] == [r["reward"] for r in tail_b] and len(tail_a) == steps - half
    loss_diff = max(abs(a.get("loss", 0.0) - b.get("loss", 0.0)) for a, b in zip(tail_a, tail_b, strict=True))
    loss_tol = CHECKPOINT_LOSS_TOL[device.type]
    cuda_note = "torch, Python, NumPy and CUDA generators" if device.type == "cuda" else "torch, Python, NumPy"
    return [check("checkpoint: RNG states round-trip exactly", None, rng_ok, True, rng_ok, cuda_note),
            check("checkpoint: weights resume exactly, on the device", None, weights_ok and on_device,
                  True, weights_ok and on_device and optimizer_on_device,
                  f"parameters on {device.type}; AdamW state on {device.type}: {optimizer_on_device}"),
            check("checkpoint: resumed steps = uninterrupted, loss max |diff|", None, loss_diff, loss_tol,
                  same_rewards and loss_diff <= loss_tol,
                  f"steps {half + 1}-{steps}; rewards equal: {same_rewards}")]


def correctness(device, sizes: dict, vl_spec: str, root: Path) -> list[dict[str, Any]]:
    from mmrl.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(EMBEDDED_NAME)
    model = load_model(EMBEDDED_NAME, device=device).eval()
    prompts = text_prompts(tokenizer, sizes["check_prompts"])
    rows = []
    for dtype in DTYPES:
        rows.append(greedy_against_generate(model, tokenizer, prompts, sizes["check_tokens"], device, dtype))
        rows += logprobs_against_rescoring(model, tokenizer, prompts, sizes["check_tokens"], device, dtype)
    for dtype in DTYPES:
        rows += shared_image_features(vl_spec, device, dtype)
    rows += checkpoint_round_trip(device, sizes["checkpoint_steps"], root / "checkpoint")
    return rows


# ----------------------------------------------------------------------------------------------- learning


def learning(device, sizes: dict, vl_spec: str, root: Path) -> dict[str, Any]:
    """The two runs on ``device``: arithmetic's reward lift and geoqa's held-out pass@1 lift."""
    from common import head_tail, run_config

    head, tail = sizes["head_tail"]
    out: dict[str, Any] = {"device": str(device)}
    records, last, wall = run_config({**sizes["arithmetic"], "model.device": str(device)}, root / "arithmetic")
    start, end = head_tail([r["reward"] for r in records], head, tail)
    out["arithmetic"] = {"reward_start": start, "reward_end": end, "lift": end - start,
                         "eval_pass@1": last.get("eval/pass@1"), "wall_s": wall, "steps": len(records)}
    records, last, wall = run_config({**sizes["geoqa"], "model.name": vl_spec, "model.device": str(device)},
                                     root / "geoqa")
    evals = [r["eval/pass@1"] for r in records if "eval/pass@1" in r]
    out["geoqa"] = {"pass@1_start": evals[0], "pass@1_end": evals[-1], "lift": evals[-1] - evals[0],
                    "pass@1_curve": evals, "wall_s": wall, "steps": sum(1 for r in records if "reward" in r)}
    return out


# How far a device's lift may fall short of the CPU reference's before the check fails: one seed each, and the
# seeds' lifts spread by about this much on the CPU alone (docs/benchmarks.md: arithmetic GRPO per-seed lifts within
# 0.04 at 500 steps, wider early on; geoqa's demo 0.08-0.20 across seeds).
LIFT_MARGIN = {"arithmetic": 0.15, "geoqa": 0.12}


def learning_checks(learn: dict[str, Any], reference: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each run must lift, and by about the CPU reference's lift when one ran beside it."""
    rows = []
    for task in ("arithmetic", "geoqa"):
        lift = learn[task]["lift"]
        rows.append(check(f"{task} lifts on {learn['device']}", None, lift, "> 0", lift > 0))
        if reference:
            floor = reference[task]["lift"] - LIFT_MARGIN[task]
            rows.append(check(f"{task} lift >= CPU reference's - {LIFT_MARGIN[task]}", None, lift, floor,
                              lift >= floor, f"CPU reference lift {reference[task]['lift']:+.3f}"))
    return rows


def collect_reference(reference: subprocess.Popen, root: Path, result: dict[str, Any]) -> None:
    """Wait for the CPU reference and put its learning runs (or why it has none) into ``result``."""
    code = reference.wait()
    ref_json = root / "cpu_reference.json"
    if ref_json.exists():
        ref = json.loads(ref_json.read_text())
        result["cpu_reference"] = ref.get("learning")
        if ref.get("errors"):
            result["errors"]["cpu_reference"] = "\n".join(ref["errors"].values())
    else:
        result["errors"]["cpu_reference"] = f"exit status {code}: " + (root / "cpu_reference.log").read_text()[-2000:]


def start_cpu_reference(args, json_path: Path, log_path: Path) -> subprocess.Popen:
    """The learning section on the CPU in a child process, while the GPU runs its own."""
    command = [sys.executable, str(Path(__file__).resolve()), "--device", "cpu", "--sections", "learning",
               "--json", str(json_path), "--threads", str(max(1, (os.cpu_count() or 2) // 2))]
    if args.tiny:
        command.append("--tiny")
    if args.vl_model:
        command += ["--vl-model", args.vl_model]
    return subprocess.Popen(command, stdout=log_path.open("w"), stderr=subprocess.STDOUT)


# ----------------------------------------------------------------------------------------------- throughput


def build_policy(shape: dict, directory: Path, device) -> dict[str, Any]:
    """A Qwen2 causal LM of ``shape`` with random weights (seed 0) and the embedded tokenizer, saved to ``directory``
    so that both trainers load the same files; (parameter counts for the FLOP count)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmrl.models import load_tokenizer

    tokenizer = load_tokenizer(EMBEDDED_NAME)
    config = Qwen2Config(**shape, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    total = sum(p.numel() for p in model.parameters())
    vocab_params = shape["vocab_size"] * shape["hidden_size"]
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"parameters": total, "body_parameters": total - vocab_params, "vocab_parameters": vocab_params}


def throughput(device, sizes: dict, env: dict, root: Path) -> dict[str, Any]:
    import trl_compare

    s = sizes["throughput"]
    policy_dir = root / "policy"
    counts = build_policy(s["policy"], policy_dir, device)
    settings = {"steps": s["warmup"] + s["steps"], "prompts": s["prompts"], "group": s["group"],
                "max_new_tokens": s["max_new_tokens"], "lr": s["lr"], "temperature": s["temperature"],
                "model": str(policy_dir), "device": str(device), "dtype": "bfloat16"}
    run = trl_compare.run_seed(settings, 0, torch.get_num_threads(), root / "runs")
    out: dict[str, Any] = {"settings": {**settings, "warmup": s["warmup"], "policy": s["policy"]}, **counts,
                           "trl_version": env.get("trl"), "sides": {}}
    for side in trl_compare.SIDES:
        data = run["sides"][side]
        steps = data["steps"][s["warmup"]:]
        wall = sum(r["wall_s"] for r in steps)
        row = {"steps_per_s": len(steps) / wall, "median_step_s": statistics.median(r["wall_s"] for r in steps),
               "generated_tokens_per_s": sum(r["tokens"] for r in steps) / wall,
               "peak_device_mb": data.get("peak_device_mb"), "peak_rss_mb": data["peak_rss_mb"],
               "build_s": data["build_s"]}
        if side == "mmrl":
            update_s = sum(r["update_s"] for r in steps)
            tokens = sum(r["batch_tokens"] for r in steps)
            response_tokens = sum(r["tokens"] for r in steps)
            # forward + backward = 6 FLOPs per parameter and token: the body reads every token, the tied LM head
            # only the response tokens (logits_to_keep); attention's own score FLOPs are left out (~1 % here)
            flops = 6 * counts["body_parameters"] * tokens + 6 * counts["vocab_parameters"] * response_tokens
            row.update(update_tokens_per_s=tokens / update_s, update_tflops=flops / update_s / 1e12)
            spec, measured = env.get("bf16_peak_tflops_spec"), env.get("bf16_matmul_tflops_measured")
            row["mfu_vs_spec"] = row["update_tflops"] / spec if spec else None
            row["mfu_vs_measured_matmul"] = row["update_tflops"] / measured if measured else None
        out["sides"][side] = row
    pairs = [t["wall_s"] / m["wall_s"] for t, m in zip(run["sides"]["trl"]["steps"][s["warmup"]:],
                                                     run["sides"]["mmrl"]["steps"][s["warmup"]:], strict=True)]
    out["median_paired_ratio"] = statistics.median(pairs)  # TRL's step time over mmrl's, step by step
    return out


# ----------------------------------------------------------------------------------------------- table


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0 or 1e-2 <= abs(value) < 1e5:
            return f"{value:.3f}"
        return f"{value:.2e}"
    return str(value)


def print_table(result: dict[str, Any]) -> None:
    env = result.get("environment", {})
    line = "-" * 110
    print(line)
    where = env.get("gpu") or "CPU (no GPU figures)"
    print(f"mmrl GPU check on {result['device']}: {where}; mode {result['mode']}; {result['wall_s']:.0f} s")
    if env:
        mem = f", {env['gpu_memory_gb']:.0f} GiB" if env.get("gpu_memory_gb") else ""
        print(f"  torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, TRL {env['trl']}, "
              f"Python {env['python']}{mem}")
        print(f"  bf16 peak TFLOP/s: spec {fmt(env['bf16_peak_tflops_spec'])}, measured matmul "
              f"{fmt(env['bf16_matmul_tflops_measured'])}")
    rows = result.get("correctness", [])
    if rows:
        print(line)
        print(f"{'correctness check':58s} {'dtype':8s} {'value':>10s} {'limit':>22s}  pass")
        for r in rows:
            print(f"{r['check']:58s} {r['dtype'] or '':8s} {fmt(r['value']):>10s} {fmt(r['limit']):>22s}  "
                  f"{'PASS' if r['pass'] else 'FAIL'}" + (f"   ({r['note']})" if r["note"] else ""))
    learn = result.get("learning")
    if learn:
        print(line)
        ref = result.get("cpu_reference") or {}
        print(f"{'learning':46s} {'on ' + result['device']:>18s} {'CPU reference':>18s}")
        a, g = learn["arithmetic"], learn["geoqa"]
        ra, rg = ref.get("arithmetic", {}), ref.get("geoqa", {})
        head, tail = result["sizes"]["head_tail"]
        for label, mine, theirs in (
                (f"arithmetic GRPO reward first {head} -> last {tail}", f"{a['reward_start']:.3f} -> "
                 f"{a['reward_end']:.3f}", f"{ra['reward_start']:.3f} -> {ra['reward_end']:.3f}" if ra else "n/a"),
                ("arithmetic lift", f"{a['lift']:+.3f}", f"{ra['lift']:+.3f}" if ra else "n/a"),
                ("arithmetic held-out pass@1 at the end", fmt(a["eval_pass@1"]), fmt(ra.get("eval_pass@1"))),
                ("geoqa demo GPG held-out pass@1 start -> end", f"{g['pass@1_start']:.3f} -> {g['pass@1_end']:.3f}",
                 f"{rg['pass@1_start']:.3f} -> {rg['pass@1_end']:.3f}" if rg else "n/a"),
                ("geoqa lift", f"{g['lift']:+.3f}", f"{rg['lift']:+.3f}" if rg else "n/a"),
                ("wall s (arithmetic, geoqa)", f"{a['wall_s']:.0f}, {g['wall_s']:.0f}",
                 f"{ra['wall_s']:.0f}, {rg['wall_s']:.0f}" if ra else "n/a")):
            print(f"{label:46s} {mine:>18s} {theirs:>18s}")
        for r in result.get("learning_checks", []):
            print(f"{r['check']:58s} {'':8s} {fmt(r['value']):>10s} {fmt(r['limit']):>22s}  "
                  f"{'PASS' if r['pass'] else 'FAIL'}" + (f"   ({r['note']})" if r["note"] else ""))
    thr = result.get("throughput")
    if thr:
        print(line)
        st = thr["settings"]
        print(f"throughput: {thr['parameters'] / 1e6:.0f} M-parameter Qwen2 (random weights), bf16 autocast, "
              f"{st['prompts']} prompts x {st['group']} samples, {st['max_new_tokens']} new tokens, "
              f"{st['steps'] - st['warmup']} steps after {st['warmup']} warm-up, TRL {thr['trl_version']}")
        memory = "peak CUDA MB" if result["device"].startswith("cuda") else "peak RSS MB"
        print(f"{'trainer':8s} {'steps/s':>8s} {'median s/step':>13s} {'gen tok/s':>10s} {memory:>12s} "
              f"{'update tok/s':>12s} {'update TFLOP/s':>14s} {'MFU (spec)':>10s} {'MFU (matmul)':>12s}")
        for side, m in thr["sides"].items():
            peak = m["peak_device_mb"] if result["device"].startswith("cuda") else m["peak_rss_mb"]
            print(f"{side:8s} {m['steps_per_s']:8.3f} {m['median_step_s']:13.3f} {m['generated_tokens_per_s']:10.0f} "
                  f"{peak:12.0f} {fmt(m.get('update_tokens_per_s')):>12s} {fmt(m.get('update_tflops')):>14s} "
                  f"{fmt(m.get('mfu_vs_spec')):>10s} {fmt(m.get('mfu_vs_measured_matmul')):>12s}")
        print(f"mmrl / TRL step throughput, median of interleaved pairs: {thr['median_paired_ratio']:.2f}x")
    for name, error in result.get("errors", {}).items():
        print(line)
        print(f"{name}: FAILED with {error.splitlines()[-1]}")
    print(line)
    print(f"verdict: {'PASS' if result['pass'] else 'FAIL'}; JSON: {result['json']}")


# ----------------------------------------------------------------------------------------------- summary


def judge(result: dict[str, Any]) -> None:
    """Set ``learning_checks`` (full mode), ``failed`` and the verdict ``pass`` of ``result``."""
    if result["mode"] == "full" and result.get("learning"):
        result["learning_checks"] = learning_checks(result["learning"], result.get("cpu_reference"))
    failed = [r["check"] for r in result.get("correctness", []) + result.get("learning_checks", []) if not r["pass"]]
    learn = result.get("learning")
    if learn and not math.isfinite(learn["arithmetic"]["lift"]):
        failed.append("arithmetic lift is not finite")
    result["failed"] = failed
    result["pass"] = not failed and not result["errors"]


def merge_results(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the runs of several calls (e.g. ``--sections correctness,learning`` on one GPU machine and
    ``--sections environment,throughput`` on the next): each section from the last run that has it."""
    merged: dict[str, Any] = {**results[0], "errors": {}, "commands": []}
    for result in results:
        if "learning" in result:  # a reference is only comparable with the learning runs it ran beside
            merged.pop("cpu_reference", None)
        for key in ("environment", "correctness", "learning", "cpu_reference", "learning_checks", "throughput"):
            if key in result:
                merged[key] = result[key]
                merged["errors"].pop(key, None)  # a section done again replaces an earlier failure of it
        merged["errors"].update(result.get("errors", {}))
        merged["commands"].append(result.get("command") or "python benchmarks/gpu_check.py --sections "
                                  + ",".join(result.get("sections", SECTIONS)))
    merged["wall_s"] = sum(r.get("wall_s") or sum(r.get("section_wall_s", {}).values()) for r in results)
    merged["json"] = ", ".join(r.get("json", "?") for r in results)
    judge(merged)
    return merged


def write_gpu_summary(result: dict[str, Any], out: Path, notes: str = "") -> Path:
    """The check as a summary for docs/results.md (benchmarks/summary.py): learning and throughput figures as rows
    (one run each: n = 1), the correctness checks as cases, the machine and versions those of the device's run."""
    from summary import result_row, write_summary

    env, rows = result["environment"], []
    learn, ref = result.get("learning"), result.get("cpu_reference")
    head, tail = result["sizes"]["head_tail"]
    for device, runs in ((learn and learn["device"], learn), ("cpu (reference)", ref)):
        if not runs:
            continue
        a, g = runs["arithmetic"], runs["geoqa"]
        label = f"arithmetic GRPO, {a['steps']} steps, on {device}"
        rows += [result_row(label, f"mean reward of the first {head} steps", {0: a["reward_start"]}),
                 result_row(label, f"mean reward of the last {tail} steps", {0: a["reward_end"]}),
                 result_row(label, "reward lift", {0: a["lift"]}),
                 result_row(label, "held-out pass@1 at the end", {0: a["eval_pass@1"]}),
                 result_row(label, "wall time", {0: a["wall_s"]}, unit="s")]
        label = f"geoqa demo GPG, {g['steps']} steps, on {device}"
        rows += [result_row(label, "held-out pass@1 at step 0", {0: g["pass@1_start"]}),
                 result_row(label, f"held-out pass@1 after step {g['steps']}", {0: g["pass@1_end"]}),
                 result_row(label, "held-out pass@1 lift", {0: g["lift"]}),
                 result_row(label, "wall time", {0: g["wall_s"]}, unit="s")]
    thr = result.get("throughput")
    if thr:
        st = thr["settings"]
        shape = (f"GRPO step, {thr['parameters'] / 1e6:.0f} M-parameter Qwen2 (random weights), bf16, "
                 f"{st['prompts']} x {st['group']} x {st['max_new_tokens']} tokens")
        for side, m in thr["sides"].items():
            label = f"{side}: {shape}"
            peak = ("peak CUDA memory", m["peak_device_mb"]) if m["peak_device_mb"] else ("peak RSS", m["peak_rss_mb"])
            rows += [result_row(label, "steps per second", {0: m["steps_per_s"]}),
                     result_row(label, "generated tokens per second", {0: m["generated_tokens_per_s"]}),
                     result_row(label, peak[0], {0: peak[1]}, unit="MB")]
            if side == "mmrl":
                rows += [result_row(label, "update: tokens per second", {0: m["update_tokens_per_s"]}),
                         result_row(label, "update: TFLOP/s", {0: m["update_tflops"]})]
                if m.get("mfu_vs_spec") is not None:
                    rows.append(result_row(label, "update: MFU against the data sheet's bf16 peak",
                                           {0: m["mfu_vs_spec"]}))
        rows.append(result_row(f"mmrl / TRL: {shape}", "step throughput, median of interleaved step pairs",
                               {0: thr["median_paired_ratio"]}, unit="x"))
    cases = [{"case": f"{r['check']}" + (f" ({r['dtype']})" if r["dtype"] else ""), "what": fmt(r["value"]),
              "outcome": "PASS" if r["pass"] else "FAIL",
              "detail": f"limit {fmt(r['limit'])}" + (f"; {r['note']}" if r["note"] else "")}
             for r in result.get("correctness", []) + result.get("learning_checks", [])]
    # the GPU machine runs a copy of the working tree without git: its commit is what its result recorded, if any
    measured_on = {"date": result.get("date") or time.strftime("%Y-%m-%d", time.gmtime()),
                   "commit": result.get("commit"),
                   "machine": {"arch": env["machine"], "cores": env.get("cores", env["cpus"]),
                               "cpu": env.get("cpu", ""), "flags": env.get("cpu_flags", []), "gpu": env.get("gpu")},
                   "versions": {"python": env["python"], "torch": env["torch"], "cuda": env.get("cuda"),
                                "transformers": env["transformers"], "trl": env.get("trl")}}
    title = f"GPU check on one {env.get('gpu') or 'CPU'}: correctness, learning and throughput against TRL"
    commands = result.get("commands") or [result.get("command", "python benchmarks/gpu_check.py")]
    return write_summary(out, title, rows, seeds=[0], notes=notes, command="\n".join(commands), cases=cases,
                         measured_on=measured_on)


# ----------------------------------------------------------------------------------------------- main


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available (torch {torch.__version__}, built for CUDA "
                         f"{torch.version.cuda})")
    if name not in ("cpu", "cuda", "cuda:0"):  # TRL's Trainer would put its model on cuda:0 whatever was asked
        raise ValueError(f"--device must be cuda, cpu or auto, got {name!r} (pick a GPU with CUDA_VISIBLE_DEVICES)")
    return torch.device(name)


def tiny_vl_model(directory: Path) -> str:
    """The embedded vision model's tokenizer, processor and architecture, untrained (seed 0), saved as a local
    checkpoint: ``--tiny`` runs exercise the vision code paths without its minutes of pre-training."""
    from mmrl.models.embedded_vl import vl_tokenizer
    from mmrl.vision.embedded import build_processor, tiny_qwen2_5_vl

    tokenizer = vl_tokenizer()
    processor = build_processor(tokenizer)
    tiny_qwen2_5_vl(tokenizer).save_pretrained(directory)
    processor.save_pretrained(directory)
    return str(directory)


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` whole or not at all: a reader sees the last section's state, never half a file.
    ``complete`` is false until every section and the verdict are in."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"complete": False, **result}, indent=1, default=str))
    os.replace(partial, path)


def default_json(device: torch.device, tiny: bool) -> Path:
    label = "cpu"
    if device.type == "cuda":
        label = "cuda-" + re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return RUNS / f"gpu_check-{label}{'-tiny' if tiny else ''}-{stamp}.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default), cpu or auto")
    parser.add_argument("--tiny", action="store_true", help="tiny models and a few steps: the logic, not the figures")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--json", help=f"where to write the result (default: {RUNS}/gpu_check-<device>-<UTC "
                        "time>.json, a folder of yours that git ignores)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--vl-model", default="", help="the Qwen-VL model of the image and geoqa checks (default: "
                        f"{EMBEDDED_VL_NAME}; with --tiny an untrained one of its shape)")
    parser.add_argument("--no-cpu-reference", action="store_true",
                        help="on a GPU, skip the learning runs on the CPU beside it")
    add_out_arguments(parser, "gpu_check", option="--summary", default="",
                      what="also write a summary for docs/results.md: OUT gives OUT.json")
    parser.add_argument("--from", dest="from_json", action="append", default=[], metavar="JSON",
                        help="run nothing: print the table of these results (several: each section from the last "
                             "one that has it), and with --summary summarise them")
    parser.add_argument("--note", default="", help="with --summary or --publish: a paragraph for the summary's notes")
    args = parser.parse_args()
    if args.from_json:
        result = merge_results([json.loads(Path(f).read_text()) for f in args.from_json])
        print_table(result)
        if args.summary:
            write_gpu_summary(result, Path(args.summary), args.note)
        return 0
    try:
        device = pick_device(args.device)
        sections = [s.strip() for s in args.sections.split(",") if s.strip()]
        unknown = [s for s in sections if s not in SECTIONS]
        if unknown:
            raise ValueError(f"--sections: unknown {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
        json_path = Path(args.json) if args.json else default_json(device, args.tiny)
        if json_path.exists():
            raise ValueError(f"--json {json_path} already exists; name a new file")
    except ValueError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = TINY if args.tiny else FULL
    result: dict[str, Any] = {"device": str(device), "mode": "tiny" if args.tiny else "full", "sections": sections,
                              "sizes": {"head_tail": sizes["head_tail"]}, "tolerances": TOLERANCES, "errors": {},
                              "section_wall_s": {}, "json": str(json_path), "command": command_line(),
                              "date": time.strftime("%Y-%m-%d", time.gmtime())}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        root = Path(tmp)
        vl_spec = args.vl_model or EMBEDDED_VL_NAME
        if args.tiny and not args.vl_model and {"correctness", "learning"} & set(sections):
            vl_spec = tiny_vl_model(root / "tiny-vl")
        result["vl_model"] = vl_spec if not args.tiny or args.vl_model else "untrained tiny Qwen2.5-VL"
        reference = None
        if "learning" in sections and device.type == "cuda" and not args.no_cpu_reference:
            reference = start_cpu_reference(args, root / "cpu_reference.json", root / "cpu_reference.log")
        env = environment(device, sizes)
        result["environment"] = env
        jobs = {"correctness": lambda: correctness(device, sizes, vl_spec, root),
                "learning": lambda: learning(device, sizes, vl_spec, root / "learning"),
                "throughput": lambda: throughput(device, sizes, env, root / "throughput")}
        for name in SECTIONS[1:]:
            if name not in sections:
                continue
            if name == "throughput" and reference is not None:  # timings only once the CPU reference is done
                collect_reference(reference, root, result)
                write_result(json_path, result)
                reference = None
            t0 = time.perf_counter()
            print(f"gpu_check: {name} ...", flush=True)
            try:
                result[name] = jobs[name]()
            except Exception:  # noqa: BLE001 -- one section's failure is recorded and the others still run
                result["errors"][name] = traceback.format_exc()
                print(result["errors"][name], file=sys.stderr, flush=True)
            result["section_wall_s"][name] = time.perf_counter() - t0
            write_result(json_path, result)  # a run cut short by its machine's time limit keeps what it measured
        if reference is not None:
            collect_reference(reference, root, result)
    result["wall_s"] = time.perf_counter() - start
    judge(result)
    result["complete"] = True
    write_result(json_path, result)
    print_table(result)
    if args.summary:
        write_gpu_summary(result, Path(args.summary), args.note)
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
