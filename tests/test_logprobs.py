"""mmrl.trainer.logprobs: the blockwise float32 log-probs and entropy equal the whole-tensor expression, values and
gradients, whatever the blocks (rows, or tokens of one row) and the logits' dtype."""

from __future__ import annotations

import pytest
import torch

from mmrl.trainer.logprobs import _blocks, token_logprobs


def whole_tensor(logits, targets, mask, temperature, with_entropy):
    """The plain expression: everything upcast at once."""
    z = logits.float() / temperature
    norm = torch.logsumexp(z, dim=-1)
    logprobs = torch.where(mask, z.gather(-1, targets[..., None]).squeeze(-1) - norm, 0.0)
    entropy = torch.where(mask, norm - (torch.softmax(z, -1) * z).sum(-1), 0.0) if with_entropy else None
    return logprobs, entropy


def case(dtype, seed=0, n=5, t=7, vocab=33):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, t, vocab, generator=g)).to(dtype)
    targets = torch.randint(vocab, (n, t), generator=g)
    mask = torch.rand(n, t, generator=g) > 0.2
    weights = torch.randn(n, t, generator=g)
    return logits, targets, mask, weights


@pytest.mark.parametrize("budget", [1, 33, 33 * 3, 33 * 7, 33 * 7 * 2, 1 << 26])  # token, tokens, row, rows, all
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_whole_tensor_expression(budget, temperature):
    logits, targets, mask, weights = case(torch.float32)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    lp, ent = token_logprobs(a, targets, mask, temperature, with_entropy=True, entropy_grad=True, budget=budget)
    ref_lp, ref_ent = whole_tensor(b, targets, mask, temperature, True)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    ((lp * weights).sum() - 0.3 * (ent * weights).sum()).backward()
    ((ref_lp * weights).sum() - 0.3 * (ref_ent * weights).sum()).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_the_log_prob_gradient_alone_is_bit_identical_in_float32():
    logits, targets, mask, weights = case(torch.float32, seed=1)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    (token_logprobs(a, targets, mask, 1.0, with_entropy=False, budget=40)[0] * weights).sum().backward()
    (whole_tensor(b, targets, mask, 1.0, False)[0] * weights).sum().backward()
    assert torch.equal(a.grad, b.grad)


def test_a_read_only_entropy_carries_no_gradient_and_leaves_the_log_prob_gradient_alone():
    logits, targets, mask, weights = case(torch.float32, seed=2)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    lp, ent = token_logprobs(a, targets, mask, 1.0, with_entropy=True, entropy_grad=False, budget=50)
    assert not ent.requires_grad and lp.requires_grad
    (lp * weights).sum().backward()
    (token_logprobs(b, targets, mask, 1.0, with_entropy=False)[0] * weights).sum().backward()
    assert torch.equal(a.grad, b.grad)


def test_bfloat16_logits_are_reduced_in_float32_and_get_a_bfloat16_gradient():
    logits, targets, mask, weights = case(torch.bfloat16, seed=3)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    lp, _ = token_logprobs(a, targets, mask, 1.0, with_entropy=False, budget=20)
    ref, _ = whole_tensor(b, targets, mask, 1.0, False)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref, rtol=0, atol=1e-6)
    (lp * weights).sum().backward()
    (ref * weights).sum().backward()
    assert a.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=0, atol=0)


def test_a_sliced_view_of_the_model_output_works_without_a_copy_of_it():
    """The trainer passes ``logits[:, -(t+1):-1]``, a non-contiguous view."""
    full, targets, mask, weights = case(torch.float32, seed=4, t=8)
    a = full.clone().requires_grad_()
    b = full.clone().requires_grad_()
    lp, _ = token_logprobs(a[:, :-1], targets[:, 1:], mask[:, 1:], 1.0, with_entropy=False, budget=64)
    ref, _ = whole_tensor(b[:, :-1], targets[:, 1:], mask[:, 1:], 1.0, False)
    torch.testing.assert_close(lp, ref, rtol=0, atol=1e-6)
    (lp * weights[:, 1:]).sum().backward()
    (ref * weights[:, 1:]).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-7)
    assert torch.all(a.grad[:, -1] == 0)


@pytest.mark.parametrize("n,t,vocab,budget", [(5, 7, 33, 1), (5, 7, 33, 100), (5, 7, 33, 231), (5, 7, 33, 500),
                                              (3, 4, 10, 10**6), (2, 0, 10, 5)])
def test_the_blocks_cover_every_token_once_within_the_budget(n, t, vocab, budget):
    seen = torch.zeros(n, t, dtype=torch.int64)
    for rows, tokens in _blocks(n, t, vocab, budget):
        block = seen[rows, tokens]
        assert block.numel() * vocab <= max(budget, vocab)
        seen[rows, tokens] += 1
    assert torch.all(seen == 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_never_sampled_tokens_have_probability_zero_and_a_finite_entropy(dtype, temperature):
    """Vision placeholders get the dtype's lowest logit (mmrl.vision.inputs.mask_tokens); below temperature 1 that
    overflowed to -inf and the entropy became NaN. They must count as absent from the vocabulary."""
    from mmrl.vision.inputs import mask_tokens

    logits, targets, mask, weights = case(dtype, seed=5)
    blocked = [3, 4, 30]
    targets = torch.where(torch.isin(targets, torch.tensor(blocked)), 0, targets)
    kept = [i for i in range(logits.shape[-1]) if i not in blocked]
    a = mask_tokens(logits, blocked).requires_grad_()
    lp, ent = token_logprobs(a, targets, mask, temperature, with_entropy=True, entropy_grad=True, budget=60)
    remap = torch.full((logits.shape[-1],), -1, dtype=torch.long)
    remap[kept] = torch.arange(len(kept))
    ref_lp, ref_ent = whole_tensor(logits[..., kept], remap[targets], mask, temperature, True)
    assert torch.isfinite(ent).all() and torch.isfinite(lp).all()
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    ((lp - ent) * weights).sum().backward()
    assert torch.isfinite(a.grad.float()).all() and torch.all(a.grad[..., blocked] == 0)


def test_greedy_temperature_zero_scores_the_raw_policy():
    """Greedy rows (temperature 0) are recorded and re-scored under the untempered policy, as before."""
    logits, targets, mask, _ = case(torch.float32, seed=6)
    greedy, _ = token_logprobs(logits, targets, mask, 0.0, with_entropy=False)
    raw, _ = token_logprobs(logits, targets, mask, 1.0, with_entropy=False)
    assert torch.equal(greedy, raw) and torch.isfinite(greedy).all()
