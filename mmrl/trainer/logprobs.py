"""Per-token log-probabilities and entropy from a batch of logits, in float32, one block of tokens at a time.

A policy with a large vocabulary makes the logits the largest tensors of an update: 128 responses of 64 tokens over
Qwen2.5's 151,936 words are 4.6 GiB in float32. Upcasting them whole, then letting autograd keep that copy and build
same-sized temporaries for ``logsumexp``, ``gather``, the entropy and their gradients, held several such tensors at
once. Here the logits stay in the dtype the model produced (bfloat16 under autocast); each block of at most
``CHUNK_ELEMENTS`` is upcast, reduced and dropped, and the backward pass recomputes one block's softmax at a time.
Every token's arithmetic is the plain float32 one, so values and gradients are the whole-tensor expression's (a test
compares them).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

# float32 elements of one block of logits (256 MiB): a few rows of a 150k vocabulary, a whole batch of a small one.
CHUNK_ELEMENTS = 1 << 26


def _blocks(n: int, t: int, vocab: int, budget: int):
    """(row slice, token slice) pairs covering ``[n, t]``, each at most ``budget`` logits (one token at least)."""
    if t * vocab <= budget:
        step = budget // max(t * vocab, 1)
        for i in range(0, n, step):
            yield slice(i, min(i + step, n)), slice(None)
        return
    step = max(1, budget // vocab)  # one response longer than the budget: cut along its tokens too
    for i in range(n):
        for j in range(0, t, step):
            yield slice(i, i + 1), slice(j, min(j + step, t))


def _tempered(block: torch.Tensor, temperature: float) -> torch.Tensor:
    """``block`` in float32, divided by ``temperature``. A token generation never samples (a vision placeholder) has
    the dtype's lowest logit: divided by a temperature below 1 it would overflow to -inf, and the entropy's p · z
    would be 0 · -inf = NaN; it is held at float32's lowest value, where its probability is still exactly 0."""
    z = block.float()
    if temperature != 1.0:
        z = z / temperature
    return z.clamp_min(torch.finfo(torch.float32).min)


class _TokenLogProbs(torch.autograd.Function):
    """(log p(target), entropy or None) of ``logits [N, T, V]`` / ``temperature``, each ``[N, T]`` in float32."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy, entropy_grad, budget):
        n, t, vocab = logits.shape
        logprobs = torch.empty(n, t, dtype=torch.float32, device=logits.device)
        log_norm = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else None
        for rows, tokens in _blocks(n, t, vocab, budget):
            z = _tempered(logits[rows, tokens], temperature)
            norm = torch.logsumexp(z, dim=-1)
            log_norm[rows, tokens] = norm
            logprobs[rows, tokens] = z.gather(-1, targets[rows, tokens, None]).squeeze(-1) - norm
            if with_entropy:
                entropy[rows, tokens] = norm - (torch.softmax(z, dim=-1) * z).sum(-1)
        ctx.temperature, ctx.budget = temperature, budget
        ctx.save_for_backward(logits, targets, log_norm, entropy if entropy_grad else None)
        if with_entropy and not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)
        return logprobs, entropy

    @staticmethod
    @once_differentiable  # the gradient is recomputed from saved values, not a graph: no second derivative
    def backward(ctx, grad_logprobs, grad_entropy):
        logits, targets, log_norm, entropy = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        n, t, vocab = logits.shape
        for rows, tokens in _blocks(n, t, vocab, ctx.budget):
            z = _tempered(logits[rows, tokens], temperature)
            norm = log_norm[rows, tokens, None]
            p = torch.exp(z - norm)
            g = torch.zeros_like(z)
            if grad_logprobs is not None:  # d log p_y / dz = onehot(y) - p
                up = grad_logprobs[rows, tokens, None]
                g -= p * up
                g.scatter_add_(-1, targets[rows, tokens, None], up)
            if grad_entropy is not None:  # dH / dz = -p (z - log Z + H)
                g -= p * (z - norm + entropy[rows, tokens, None]) * grad_entropy[rows, tokens, None]
            if temperature != 1.0:
                g /= temperature
            grad[rows, tokens] = g
        return grad, None, None, None, None, None


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float,
                   with_entropy: bool, entropy_grad: bool = False,
                   budget: int = CHUNK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 log-probs ``[N, T]`` of ``targets`` under ``logits [N, T, V]`` / ``temperature`` (any float dtype,
    computed in float32 ``budget`` logits at a time), 0 where ``mask`` is false; and the token entropy when
    ``with_entropy``, with a gradient only when ``entropy_grad`` (an entropy bonus in the loss). A ``temperature``
    of 0 or below (greedy decoding) scores the raw policy, the distribution greedy decoding takes its argmax of."""
    temperature = temperature if temperature > 0 else 1.0
    logprobs, entropy = _TokenLogProbs.apply(logits, targets, temperature, with_entropy,
                                             with_entropy and entropy_grad, budget)
    zero = torch.zeros((), device=logprobs.device)
    logprobs = torch.where(mask, logprobs, zero)
    if entropy is not None:
        entropy = torch.where(mask, entropy, zero)
    return logprobs, entropy
