"""mmrl's own sampling loop for text models: one pre-fill per distinct prompt; finished rows leave the batch.

Why not ``transformers``' ``generate``: on the small models this trainer runs on a CPU, ``generate`` spends more time
in its per-token machinery (logits processors, stopping criteria, input preparation, finished rows kept running as
padding) than in the model, and it pre-fills each of a group's G copies of a prompt on its own. This loop

1. pre-fills every distinct prompt once (left-padded, one forward) and copies its keys and values to the prompt's
   rows (a group's G samples share one pre-fill);
2. decodes one token per forward for the rows still running; a row that samples a stop token leaves the batch (its
   cache row is dropped), so the batch shrinks as responses end.

Positions are each row's count of real tokens and padding is masked, as in a left-padded full-sequence forward, so
the log-prob recorded for a token is what re-scoring the finished response gives (tested against
``mmrl.trainer.rollout.response_logprobs``). Images need the Qwen-VL families' own input preparation (M-RoPE
positions, pixel placement), so vision prompts keep ``generate`` (see ``mmrl.trainer.rollout.generate``).

Sampling is the tempered policy (``logits / temperature``), with optional ``top_k`` (the k highest tempered scores,
ties kept, as transformers' ``TopKLogitsWarper``) and nucleus ``top_p`` (HF's rule: the smallest set of top tokens
whose probability reaches ``top_p``), in transformers' order; greedy at temperature 0. An optional repetition penalty
comes first, as transformers' ``RepetitionPenaltyLogitsProcessor`` and vLLM apply it: every token already in the row
(its prompt's real tokens and its response so far, each counted once; never padding) has its logit divided by the
penalty when positive and multiplied by it otherwise. Every other logits processor is off.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Sequence

import torch


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``logits [B, V]`` with the tokens ``seen [B, V]`` penalised: a positive logit divided by ``penalty``, any other
    multiplied by it (transformers' ``RepetitionPenaltyLogitsProcessor``, vLLM's ``apply_repetition_penalties``)."""
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def draw_tokens(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0,
                seen: torch.Tensor | None = None, repetition_penalty: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A token per row from ``logits [B, V]``, and its log-prob under the distribution it was drawn from.
    ``seen [B, V]``: the tokens already in each row, penalised by ``repetition_penalty`` (1.0: off)."""
    logits = logits.float()
    if seen is not None and repetition_penalty != 1.0:
        logits = penalize_repeats(logits, seen, repetition_penalty)
    if temperature <= 0:
        logprobs = torch.log_softmax(logits, -1)
        tokens = logprobs.argmax(-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    scores = logits / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = scores.sort(-1, descending=False)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - top_p
        drop[:, -1] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    logprobs = torch.log_softmax(scores, -1)
    tokens = torch.multinomial(logprobs.exp(), 1).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


@dataclasses.dataclass
class SampledText:
    token_ids: list[int]  # up to and including the stop token, if one was sampled
    logprobs: list[float]  # of each token, under the distribution it was drawn from
    truncated: bool  # the budget ran out before a stop token


def cache_keyword(model) -> str:
    """The forward argument that takes a KV cache: transformers renamed ``past_key_values`` to ``cache`` (5.24 warns
    on the old name at every run); older releases only know the old one. A PEFT (LoRA) wrapper's forward takes
    ``**kwargs`` and hands them on, so the model it wraps decides."""
    peft = sys.modules.get("peft")  # loaded exactly when a LoRA model exists
    if peft is not None and isinstance(model, peft.PeftModel):
        model = model.get_base_model()
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _forward(model, **inputs):
    try:
        return model(**inputs, logits_to_keep=1).logits[:, -1]
    except TypeError:  # a model class without logits_to_keep
        return model(**inputs).logits[:, -1]


@torch.no_grad()
def sample_texts(model, prompts: Sequence[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 stop: Sequence[int], pad: int, top_k: int = 0, repetition_penalty: float = 1.0) -> list[SampledText]:
    """One sampled response per prompt (repeat a prompt to get a group), in the order of ``prompts``."""
    from transformers import DynamicCache

    if not prompts:
        return []
    device = next(model.parameters()).device
    distinct: dict[tuple[int, ...], int] = {}
    for p in prompts:
        distinct.setdefault(tuple(p), len(distinct))
    source = torch.tensor([distinct[tuple(p)] for p in prompts], dtype=torch.long, device=device)
    width = max(len(p) for p in distinct)
    ids = torch.full((len(distinct), width), pad, dtype=torch.long)
    attention = torch.zeros((len(distinct), width), dtype=torch.long)
    for i, p in enumerate(distinct):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        attention[i, width - len(p):] = 1
    attention = attention.to(device)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    cache_arg = cache_keyword(model)
    logits = _forward(model, input_ids=ids.to(device), attention_mask=attention, position_ids=positions,
                      use_cache=True, **{cache_arg: cache})
    # every row of a prompt starts from the prompt's keys and values
    cache.reorder_cache(source)
    logits = logits.index_select(0, source)
    attention = attention.index_select(0, source)
    next_position = attention.sum(1)
    seen = None  # with a repetition penalty: which tokens each row holds so far, prompt and response
    if repetition_penalty != 1.0:
        seen = torch.zeros((len(distinct), logits.shape[-1]), dtype=torch.bool, device=device)
        for i, p in enumerate(distinct):
            seen[i, torch.tensor(p, dtype=torch.long, device=device)] = True
        seen = seen.index_select(0, source)
    stop_ids = torch.tensor(sorted(set(stop)), dtype=torch.long, device=device)
    running = torch.arange(len(prompts), device=device)  # original index of each row still in the batch
    out = [SampledText([], [], truncated=True) for _ in prompts]
    for step in range(max_new_tokens):
        tokens, logprobs = draw_tokens(logits, temperature, top_p, top_k, seen, repetition_penalty)
        if seen is not None:
            seen[torch.arange(len(tokens), device=device), tokens] = True
        for i, t, lp in zip(running.tolist(), tokens.tolist(), logprobs.tolist(), strict=True):
            out[i].token_ids.append(t)
            out[i].logprobs.append(lp)
        ended = torch.isin(tokens, stop_ids)
        for i in running[ended].tolist():
            out[i].truncated = False
        if step == max_new_tokens - 1 or bool(ended.all()):
            break
        if bool(ended.any()):  # finished rows leave the batch and the cache
            keep = (~ended).nonzero().squeeze(1)
            cache.reorder_cache(keep)
            running, tokens = running[keep], tokens[keep]
            seen = seen[keep] if seen is not None else None
            attention, next_position = attention[keep], next_position[keep]
        attention = torch.cat([attention, attention.new_ones((len(running), 1))], dim=1)
        logits = _forward(model, input_ids=tokens[:, None], attention_mask=attention,
                          position_ids=next_position[:, None], use_cache=True, **{cache_arg: cache})
        next_position = next_position + 1
    return out
