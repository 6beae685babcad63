"""Generation, re-scoring and reward for the local trainer.

All log-probabilities are of the *tempered* policy (logits / temperature), the distribution responses were sampled
from, as verl does; ``temperature=1`` gives the raw policy. Sampling overrides every logits processor a checkpoint's
``generation_config`` may ship (repetition penalty, top-k, min-p, ...), so that the sampler is exactly the policy
being scored; only ``top_p < 1``, ``top_k > 0`` or a ``repetition_penalty`` other than 1 (explicitly asked for) makes
them differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from tqdm import tqdm

from mmrl import moe
from mmrl.batch import Group, Response, RolloutBatch
from mmrl.errors import UserError
from mmrl.rewards.base import Reward
from mmrl.run.config import SAMPLERS
from mmrl.trainer.logprobs import token_logprobs
from mmrl.trainer.text_sampler import sample_texts

# Neutral values for every logits processor a checkpoint's generation_config could switch on.
NEUTRAL_SAMPLING = {"top_k": 0, "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
                    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                    "min_length": 0, "min_new_tokens": None, "bad_words_ids": None, "suppress_tokens": None,
                    "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None}


def eos_ids(tokenizer, model) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def generate(model, tokenizer, prompts: Sequence[list[int]], max_new_tokens: int, temperature: float, top_p: float,
             batch_size: int = 64, progress: str | None = None, vision=None,
             return_logprobs: bool = False, sampler: str = "mmrl", top_k: int = 0,
             repetition_penalty: float = 1.0) -> list[Response]:
    """One sampled response per prompt (repeat a prompt to get a group). Greedy when ``temperature == 0``.

    ``progress``: a label to show a progress bar over the generation batches (long evaluations).
    ``vision``: a `mmrl.vision.inputs.VisionBatch` with one row per prompt (the prompts' images), or None.
    ``return_logprobs``: also keep the sampler's log-prob of each token (``Response.logprobs``).
    ``sampler``: ``"mmrl"``, the own loop of `mmrl.trainer.text_sampler` (text prompts; images always go through
    ``generate``), or ``"hf"``, ``transformers``' ``generate``.
    ``top_k``: sample from the k most likely tokens only (0: off), on either sampler.
    ``repetition_penalty``: transformers' repetition penalty over each row's prompt and response tokens (1.0: off),
    greedy or sampled, on either sampler.
    """
    if sampler not in SAMPLERS:
        raise UserError(f"rollout.sampler: must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    was_training = model.training
    model.eval()
    stop = eos_ids(tokenizer, model)
    pad = tokenizer.pad_token_id
    device = next(model.parameters()).device
    out: list[Response] = []
    bar = tqdm(total=len(prompts), desc=progress, unit="response", dynamic_ncols=True, disable=not progress)
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        if vision is None and sampler == "mmrl":
            for s in sample_texts(model, chunk, max_new_tokens, temperature, top_p, stop,
                                  pad if pad is not None else stop[0], top_k, repetition_penalty):
                out.append(Response(s.token_ids, tokenizer.decode(s.token_ids, skip_special_tokens=True),
                                    truncated=s.truncated, logprobs=s.logprobs if return_logprobs else None))
            bar.update(len(chunk))
            continue
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, width - len(p) :] = torch.tensor(p)
            attn[i, width - len(p) :] = 1
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k} if temperature > 0 \
            else {"do_sample": False, "temperature": None, "top_p": None}
        options = {**NEUTRAL_SAMPLING, **sampling, "repetition_penalty": repetition_penalty}
        if vision is not None:  # the chunk's images; vision placeholder tokens are never sampled (see mmrl.vision)
            options.update(vision.select(range(start, start + len(chunk))).model_inputs(ids, device, model),
                           suppress_tokens=list(vision.tokens.blocked))
        seqs = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), max_new_tokens=max_new_tokens,
                              pad_token_id=pad, eos_token_id=stop, use_cache=True, **options,
                              output_scores=return_logprobs, return_dict_in_generate=return_logprobs)
        sampled_logprobs = None
        if return_logprobs:  # the processed scores are the (tempered) distribution each token was sampled from
            seqs, scores = seqs.sequences, seqs.scores
            # one step's [batch, V] scores at a time: stacking every step first is a float32 copy of them all
            sampled_logprobs = torch.stack(
                [torch.log_softmax(step.float(), -1).gather(-1, seqs[:, width + i, None]).squeeze(-1)
                 for i, step in enumerate(scores)], dim=1).tolist()
        for b, row in enumerate(seqs[:, width:].tolist()):
            tokens, truncated = [], True
            for t in row:
                tokens.append(t)
                if t in stop:
                    truncated = False
                    break
            # A row without a stop token ran every step of the batch, so all its tokens were sampled (generate pads
            # only rows that stopped); a pad id among them is a sampled token and stays.
            out.append(Response(tokens, tokenizer.decode(tokens, skip_special_tokens=True), truncated=truncated,
                                logprobs=sampled_logprobs[b][: len(tokens)] if sampled_logprobs else None))
        bar.update(len(chunk))
    bar.close()
    model.train(was_training)
    return out


def score_groups(groups: list[Group], reward: Reward) -> None:
    """Fill ``response.reward`` for every response that has none (historical ones keep theirs)."""
    todo = [(g, r) for g in groups for r in g.responses if r.reward is None]
    if not todo:
        return
    results = reward([r.text for _, r in todo], [g.sample for g, _ in todo])
    for (_, resp), result in zip(todo, results, strict=True):
        resp.reward = result


# Scoring one row at a time pays off from this width (tokens) on the CPU. Measured with the embedded agent model
# (ALFWorld episodes of 1,300-2,900 tokens, 8 rows): one padded forward + backward took 16.5 s, the same rows one at
# a time 4.3 s (padding columns cost attention quadratically, and a mask with zeros moves SDPA off its causal
# kernel); below ~256 tokens batching wins (4 rows of 100 tokens: 0.05 s vs 0.07 s). On a GPU a padded batch keeps
# the device busy and a loop over rows would not, so rows are only split on the CPU.
ROW_BY_ROW_MIN_WIDTH = 512


def response_logprobs(model, batch: RolloutBatch, temperature: float, with_entropy: bool = False,
                      rows: torch.Tensor | None = None, row_by_row_min_width: int = 0,
                      entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[n, T]`` of the response tokens of ``rows`` under ``model`` (and token entropy, detached unless
    ``entropy_grad``: an entropy bonus in the loss needs its gradient).

    Only the last T+1 positions' logits are computed (``logits_to_keep``): prompts cost no vocabulary projection.
    Padding positions get exactly 0. ``row_by_row_min_width`` > 0: a text batch at least that many tokens wide, on
    the CPU, is scored one row at a time, each row on its own unpadded tokens (the same values; see
    ``ROW_BY_ROW_MIN_WIDTH``); 0 (the default) = one padded batch, the shape hooks such as MoE routing expect.
    """
    sub = batch if rows is None else batch.select(rows)
    device = next(model.parameters()).device
    if 0 < row_by_row_min_width <= sub.input_ids.shape[1] and device.type == "cpu" and sub.vision is None:
        return _row_by_row_logprobs(model, sub, temperature, with_entropy, entropy_grad)
    t = sub.response_mask.shape[1]
    inputs = {"input_ids": sub.input_ids.to(device), "attention_mask": sub.attention_mask.to(device),
              "position_ids": sub.position_ids.to(device), "use_cache": False}
    images = sub.vision.model_inputs(sub.input_ids, device, model) if sub.vision is not None else {}
    if images:  # Qwen-VL builds its 3-D (M-RoPE) positions from these, as generate() did at pre-fill
        inputs.pop("position_ids")
        inputs.update(images)
    logits = _response_logits(model, inputs, t)
    if sub.vision is not None:  # the tokens generation suppressed have probability 0 under the sampled policy
        logits = sub.vision.mask_blocked(logits)
    return token_logprobs(logits, sub.input_ids[:, -t:].to(device), sub.response_mask.to(device) > 0, temperature,
                          with_entropy, entropy_grad)


def _response_logits(model, inputs: dict, t: int) -> torch.Tensor:
    """Logits ``[n, t, V]`` predicting the last ``t`` tokens of ``inputs``, in the dtype the model computed them in
    (:func:`token_logprobs` upcasts them a block at a time)."""
    try:
        logits = model(**inputs, logits_to_keep=t + 1).logits
    except TypeError:  # a model class without logits_to_keep
        logits = model(**inputs).logits
    return logits[:, -(t + 1) : -1]


def _row_by_row_logprobs(model, sub: RolloutBatch, temperature: float, with_entropy: bool,
                         entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_logprobs` of a text batch, one forward per row on the row's own tokens (no padding, no
    attention mask: causal attention alone). Rows are right-padded past their response to ``[n, T]`` with zeros.
    Each row must be attended on one contiguous span that starts in the prompt (``collate``'s layout)."""
    device = next(model.parameters()).device
    p, t = sub.prompt_width, sub.response_mask.shape[1]
    logprob_rows, entropy_rows = [], []
    for i in range(sub.size):
        attended = sub.attention_mask[i].nonzero().squeeze(1)
        if len(attended) == 0 or int(attended[0]) >= p or len(attended) != int(attended[-1] - attended[0]) + 1:
            raise ValueError(f"response_logprobs: row {i} is not a prompt followed by its response on one "
                             f"contiguous attended span (mmrl.batch.collate's layout)")
        start = int(attended[0])
        # At least one response column, so that every row has a graph; an empty response's column is masked to 0.
        span = max(int(attended[-1]) + 1 - p, 1)
        ids = sub.input_ids[i : i + 1, start : p + span].to(device)
        positions = torch.arange(ids.shape[1], device=device)[None]
        logits = _response_logits(model, {"input_ids": ids, "position_ids": positions, "use_cache": False}, span)
        mask = sub.response_mask[i : i + 1, :span].to(device) > 0
        logprobs, entropy = token_logprobs(logits, ids[:, -span:], mask, temperature, with_entropy, entropy_grad)
        logprob_rows.append(torch.nn.functional.pad(logprobs, (0, t - span)))
        if with_entropy:
            entropy_rows.append(torch.nn.functional.pad(entropy, (0, t - span)))
    return torch.cat(logprob_rows), torch.cat(entropy_rows) if with_entropy else None


@torch.no_grad()
def batch_logprobs(model, batch: RolloutBatch, temperature: float, micro_batch: int = 64,
                   record_routing: bool = False,
                   row_by_row_min_width: int = 0) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Log-probs of every response in ``batch`` (on the CPU), ``micro_batch`` rows per forward; with
    ``record_routing`` (MoE) also every token's experts, ``[N, P + T, k]`` per router layer (what replay reuses).
    ``row_by_row_min_width``: as in :func:`response_logprobs` (ignored while recording routing)."""
    was_training = model.training
    model.eval()
    step = micro_batch or batch.size
    width = batch.input_ids.shape[1]
    split_from = 0 if record_routing else row_by_row_min_width  # the hooks expect the padded batch's shape
    parts, routing = [], []
    for start in range(0, batch.size, step):
        rows = torch.arange(start, min(start + step, batch.size))
        hooks = moe.RouterHooks(model, (len(rows), width))
        with hooks.active() if record_routing else contextlib.nullcontext():
            parts.append(response_logprobs(model, batch, temperature, rows=rows,
                                           row_by_row_min_width=split_from)[0].cpu())
        routing.append(hooks.routing_cpu())
    model.train(was_training)
    layers = [torch.cat(layer) for layer in zip(*routing, strict=True)] if record_routing else None
    return torch.cat(parts), layers
