"""``metrics.jsonl`` of the openrlhf backend: one line per step with the local trainer's headline names, an
evaluation in the line of the step it followed, and a resumed run replacing the lines after its checkpoint."""

from __future__ import annotations

import json
import math

from mmrl.openrlhf.metrics import StepMetrics


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_one_line_per_step_with_its_evaluation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    m = StepMetrics(str(path), resume=False)
    m.write(1, {"policy_loss": 0.5, "rollout/reward_mean": 0.25, "timing/x": 1, "generated_samples": ["text"]})
    m.write(2, {"policy_loss": float("nan")})
    m.write_eval(2, {"eval_arithmetic_pass1": 0.4})
    m.flush()
    got = lines(path)
    assert [r["step"] for r in got] == [1, 2]
    assert got[0]["loss"] == 0.5 and got[0]["reward"] == 0.25 and "generated_samples" not in got[0]
    assert got[1]["loss"] is None and got[1]["reward"] is None  # non-finite values are written as null
    assert got[1]["eval_arithmetic_pass1"] == 0.4 and m.last_step == 2
    # resumed from the step-1 checkpoint: step 2 is re-run and replaces the old line
    m = StepMetrics(str(path), resume=True)
    m.write(2, {"policy_loss": 0.1, "rollout/reward_mean": 0.5})
    m.flush()
    got = lines(path)
    assert [r["step"] for r in got] == [1, 2] and got[1]["loss"] == 0.1 and math.isfinite(got[1]["reward"])


def test_rollout_top_k_reaches_vllm_but_not_the_evaluation_sets():
    """``rollout.top_k`` is vLLM's ``top_k`` in training (0, off, is vLLM's -1); each evaluation set samples as the
    local backend evaluates, without it."""
    from mmrl.openrlhf.evaluation import rollout_top_k, set_generate_kwargs

    assert rollout_top_k(50) == 50 and rollout_top_k(0) == -1
    spec = {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 8, "samples": 2}
    kwargs = set_generate_kwargs(spec, {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "max_len": 64})
    assert kwargs["top_k"] == -1 and kwargs["temperature"] == 0.6 and kwargs["max_len"] == 64
