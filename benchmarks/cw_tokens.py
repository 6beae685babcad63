"""Which tokens CW-GRPO's kernel damps on the embedded model's own rollouts of the arithmetic_stream task.

For each seed: 64 training prompts x 8 samples from the embedded text model (temperature 1, 12 tokens), scored by
the task's reward, advantages and covariance weights w̃ as `mmrl.algos.cw_grpo` computes them (``stats_scope
group``, the default). Tokens of responses with a non-zero advantage are split into the answer's digits and the rest
(answer tags, end of turn); the summary gives each kind's share of tokens, mean w̃ and share of tokens the kernel at
least halves, the mean w̃ of unlikely sampled tokens (p < 0.5) in responses pushed down and pushed up, and how much
the per-group σ of the covariance varies between groups of 8.

    python benchmarks/cw_tokens.py [--seeds 0,1,2,3,4] [--max-operand 9]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from summary import add_out_arguments, result_row, write_summary

import mmrl.algos as algos
from mmrl.algos.cw_grpo import covariance_weights, group_covariance_stats
from mmrl.batch import Group
from mmrl.cache import EMBEDDED_NAME
from mmrl.models import load_model, load_tokenizer
from mmrl.run.prompts import encode_prompt
from mmrl.tasks import get_task
from mmrl.trainer.rollout import generate, score_groups

PROMPTS, GROUP = 64, 8


def measure(model, tokenizer, task, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    rows = [task.train[seed * PROMPTS + i] for i in range(PROMPTS)]
    prompts = [encode_prompt(tokenizer, r["messages"], 512) for r in rows]
    out = generate(model, tokenizer, [p for p in prompts for _ in range(GROUP)], 12, 1.0, 1.0, return_logprobs=True)
    groups = [Group(i, rows[i], prompts[i], out[i * GROUP:(i + 1) * GROUP]) for i in range(PROMPTS)]
    score_groups(groups, task.reward)
    responses = [r for g in groups for r in g.responses]
    width = max(len(r.token_ids) for r in responses)
    old, mask = torch.zeros(len(responses), width), torch.zeros(len(responses), width)
    for i, r in enumerate(responses):
        old[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
        mask[i, : len(r.token_ids)] = 1
    rewards = torch.tensor([r.reward.score for r in responses])
    group_ids = torch.arange(PROMPTS).repeat_interleave(GROUP)
    adv = algos.get("cw_grpo").advantages(rewards, group_ids)
    stats = group_covariance_stats(old, adv, mask, group_ids)
    w = covariance_weights(old, adv, mask, stats)
    digits, rest = [], []
    unlikely = {True: [], False: []}  # tokens sampled at probability < 0.5, by whether their response's Â > 0
    for i, r in enumerate(responses):
        a = float(adv[i])
        if a == 0:
            continue
        for t, token in enumerate(r.token_ids):
            (digits if tokenizer.decode([token]).strip().isdigit() else rest).append(float(w[i, t]))
            if float(old[i, t]) < -0.693:
                unlikely[a > 0].append(float(w[i, t]))
    sigma = stats["cov_sigma"].view(PROMPTS, GROUP)[:, 0]
    sigma = sigma[sigma > 0]
    return {"digit_share": len(digits) / (len(digits) + len(rest)), "digit_w": statistics.mean(digits),
            "digit_halved": sum(x < 0.5 for x in digits) / len(digits), "rest_w": statistics.mean(rest),
            "rest_halved": sum(x < 0.5 for x in rest) / len(rest),
            "sigma_cv": float(sigma.std() / sigma.mean()), "sigma_ratio": float(sigma.max() / sigma.min()),
            "unlikely_neg_w": statistics.mean(unlikely[False]), "unlikely_pos_w": statistics.mean(unlikely[True])}


METRICS = {
    "digit_share": "answer-digit tokens: share of the tokens of responses with an advantage",
    "digit_w": "answer-digit tokens: mean weight w̃ (GRPO: 1)",
    "digit_halved": "answer-digit tokens: share whose weight is at most 0.5",
    "rest_w": "other tokens (tags, end of turn): mean weight w̃",
    "rest_halved": "other tokens: share whose weight is at most 0.5",
    "unlikely_neg_w": "tokens sampled at probability < 0.5 in responses with Â < 0 (pushed down): mean w̃",
    "unlikely_pos_w": "tokens sampled at probability < 0.5 in responses with Â > 0 (pushed up): mean w̃",
    "sigma_cv": "σ of the covariance per group of 8: std / mean across the batch's groups",
    "sigma_ratio": "σ of the covariance per group of 8: largest / smallest in the batch",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--max-operand", type=int, default=9)
    add_out_arguments(parser, "cw_tokens")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model(EMBEDDED_NAME), load_tokenizer(EMBEDDED_NAME)
    task = get_task("arithmetic_stream", max_operand=args.max_operand)
    seeds = [int(s) for s in args.seeds.split(",")]
    per_seed = {seed: measure(model, tokenizer, task, seed) for seed in seeds}
    for seed, m in per_seed.items():
        print(seed, {k: round(v, 3) for k, v in m.items()})
    rows = [result_row("cw_grpo", text, {s: m[key] for s, m in per_seed.items()}) for key, text in METRICS.items()]
    write_summary(args.out, "Which tokens CW-GRPO's kernel damps (embedded text model, arithmetic_stream)", rows,
                  seeds=seeds, notes=f"Each seed: {PROMPTS} training prompts x {GROUP} samples of the embedded model "
                  f"before any update, operands 0..{args.max_operand}, stats_scope group. Answer digits are the "
                  "tokens that decide accuracy; the kernel's weights average 1 over each group's tokens, so what "
                  "it takes off the digits goes to the tags and the end of turn.")


if __name__ == "__main__":
    main()
