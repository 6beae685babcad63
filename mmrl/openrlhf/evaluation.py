"""``evaluation.sets`` on the OpenRLHF backend: what the driver exports per set, and how a set's samples are scored.

The launcher writes one prompt file per set (``eval_<name>.jsonl``) and hands the actors each set's sampling
(`set_spec`); mmrl's PPO trainer generates each set from its own file with those settings through OpenRLHF's own
``generate_eval_samples`` and scores it with `set_metrics`. Correctness is the reward's accuracy component that
mmrl's reward function reports per response (``mmrl/accuracy``; ``won`` for ALFWorld's agent), not the summed reward,
so a format term never counts as a solved problem. Pure: no OpenRLHF import.
"""

from __future__ import annotations

from typing import Any

from mmrl.run.eval_sets import EvalSet
from mmrl.run.scoring import pass_at_k

CORRECT_KEYS = {False: "mmrl/accuracy", True: "won"}  # by task.multi_turn: what the reward / agent logs per response


def set_spec(s: EvalSet, file: str, max_new_tokens: int) -> dict[str, Any]:
    c = s.config
    return {"name": s.name, "file": file, "samples": c.samples, "temperature": c.temperature, "top_p": c.top_p,
            "repetition_penalty": c.repetition_penalty, "max_new_tokens": max_new_tokens, "metric": c.metric,
            "correct_key": CORRECT_KEYS[s.task.multi_turn]}


def rollout_top_k(top_k: int) -> int:
    """``rollout.top_k`` as vLLM's ``SamplingParams.top_k`` (-1 = off; mmrl's 0 = off)."""
    return top_k or -1


def set_generate_kwargs(spec: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """OpenRLHF's generate kwargs for one set: the run's, with the set's sampling (temperature 0 = greedy in vLLM);
    no top-k and the set's own repetition penalty, as the local backend evaluates (the rollout's ``rollout.top_k``
    and ``rollout.repetition_penalty`` are for training)."""
    return {**base, "top_k": -1, "repetition_penalty": spec.get("repetition_penalty", 1.0),
            "temperature": spec["temperature"], "top_p": spec["top_p"],
            "max_new_tokens": spec["max_new_tokens"], "n_samples_per_prompt": spec["samples"]}


def set_metrics(spec: dict[str, Any], correct: list[float]) -> dict[str, float]:
    """``<set>/pass@1``, ``<set>/pass@k``, ``<set>/avg@k`` from per-response correctness, in generation order
    (``samples`` consecutive responses per problem, as OpenRLHF generates them)."""
    n, name = spec["samples"], spec["name"]
    if not correct or len(correct) % n:
        raise ValueError(f"evaluation set {name!r}: {len(correct)} responses are not {n} per problem")
    solved = [sum(x >= 1.0 for x in correct[i:i + n]) for i in range(0, len(correct), n)]
    problems = len(solved)
    return {f"{name}/problems": float(problems),
            f"{name}/pass@1": sum(pass_at_k(n, c, 1) for c in solved) / problems,
            f"{name}/pass@{n}": sum(pass_at_k(n, c, n) for c in solved) / problems,
            f"{name}/avg@{n}": sum(c / n for c in solved) / problems}


def average(specs: list[dict[str, Any]], logs: dict[str, float]) -> float:
    """The mean over sets of each set's headline metric (what the papers' "Avg." columns report)."""
    return sum(logs[f"{s['name']}/{s['metric']}"] for s in specs) / len(specs)
