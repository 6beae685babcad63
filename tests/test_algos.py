"""The algorithm layer: the contract, the edge cases, and each paper's claims (one test or more per claim)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mmrl.algos as algos
from mmrl.algos import base
from mmrl.algos.base import stats_for_rows
from mmrl.algos.cw_grpo import covariance_stats, covariance_weights, group_covariance_stats
from mmrl.algos.gvpo import gvpo_weights

ALL = sorted(algos.ALGORITHMS)


def make_batch(rewards, group_ids, t=6, seed=0, lengths=None, drift=0.1):
    g = torch.Generator().manual_seed(seed)
    n = len(rewards)
    old = -torch.rand(n, t, generator=g) * 3
    new = (old + drift * torch.randn(n, t, generator=g)).requires_grad_(True)
    mask = torch.ones(n, t)
    if lengths is not None:
        for i, length in enumerate(lengths):
            mask[i, length:] = 0
    return torch.tensor(rewards, dtype=torch.float32), torch.tensor(group_ids), new, old, mask


def run(name, rewards, group_ids, logprobs, old, mask, **params):
    algo = algos.get(name, **params)
    adv = algo.advantages(rewards, group_ids)
    stats = algo.batch_stats(rewards, group_ids, adv, old, mask)
    ref = old.clone() if algo.uses_reference() else None
    loss, metrics = algo.policy_loss(logprobs, old, adv, mask, group_ids, ref, stats)
    return loss, metrics, adv


# ------------------------------------------------------------------------------------------ contract


def test_registry_has_the_ten_objectives():
    assert set(ALL) == {"grpo", "dr_grpo", "gpg", "gvpo", "gmpo", "cw_grpo", "gigpo", "gspo", "cispo", "sapo"}


def test_unknown_algorithm_and_parameter_fail_with_one_clear_line():
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'"):
        algos.get("ppo")
    with pytest.raises(ValueError, match="has no hyper-parameter 'bta'"):
        algos.get("gvpo", bta=0.1)
    with pytest.raises(ValueError, match="beta must be > 0"):
        algos.get("gvpo", beta=0)
    with pytest.raises(ValueError, match="clip_mode"):
        algos.get("gmpo", clip_mode="tokens")


@pytest.mark.parametrize("name", ALL)
def test_algorithms_import_no_trainer(name):
    import sys

    mod = sys.modules[type(algos.get(name)).__module__]
    source = open(mod.__file__).read()
    assert "mmrl.trainer" not in source and "transformers" not in source


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("case", ["all_equal", "single_sample_groups", "zero_length", "mixed"])
def test_no_nan_or_inf_in_edge_cases(name, case):
    rewards, groups, lengths = {
        "all_equal": ([1.0] * 4 + [0.0] * 4, [0] * 4 + [1] * 4, None),
        "single_sample_groups": ([1.0, 0.0, 0.5], [0, 1, 2], None),
        "zero_length": ([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], [0, 3, 0, 0]),
        "mixed": ([1.0, 0.0, 0.0, 0.0, 1.0], [0, 0, 0, 1, 2], [6, 0, 2, 6, 1]),
    }[case]
    r, g, lp, old, mask = make_batch(rewards, groups, lengths=lengths)
    loss, metrics, adv = run(name, r, g, lp, old, mask)
    loss.backward()
    assert torch.isfinite(adv).all()
    assert torch.isfinite(loss)
    assert torch.isfinite(lp.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", ALL)
def test_rewards_with_nan_are_refused(name):
    with pytest.raises(ValueError, match="NaN"):
        algos.get(name).advantages(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("wrong", ["logprobs", "old_logprobs", "mask", "advantages", "group_ids", "ref_logprobs"])
def test_an_input_of_the_wrong_shape_is_named_not_broadcast(name, wrong):
    """Sequence log-probs ``[B, 1]``, one advantage ``[1]`` or a ``[1, T]`` reference broadcast into a plausible
    wrong loss; policy_loss names the argument instead."""
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.5, 0.0], [0, 0, 1, 1])
    algo = algos.get(name)
    adv = algo.advantages(r, g)
    given_ = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "mask": mask, "group_ids": g,
              "ref_logprobs": old.clone(), "stats": algo.batch_stats(r, g, adv, old, mask)}
    given_[wrong] = {"logprobs": lp.sum(1, keepdim=True), "advantages": adv[:1], "group_ids": g[:3]}.get(
        wrong, given_[wrong][:1])
    with pytest.raises(ValueError, match=re.escape(f"{wrong} {list(given_[wrong].shape)}")):
        algo.policy_loss(**given_)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(ALL))
def test_random_batches_give_finite_losses_and_gradients(data, name):
    n_groups = data.draw(st.integers(1, 4))
    size = data.draw(st.integers(1, 5))
    rewards = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0, 10.0]), min_size=n_groups * size,
                                 max_size=n_groups * size))
    groups = [i // size for i in range(n_groups * size)]
    lengths = data.draw(st.lists(st.integers(0, 6), min_size=len(rewards), max_size=len(rewards)))
    drift = data.draw(st.sampled_from([0.0, 0.1, 5.0, 50.0]))
    r, g, lp, old, mask = make_batch(rewards, groups, lengths=lengths, drift=drift, seed=data.draw(st.integers(0, 9)))
    loss, _, _ = run(name, r, g, lp, old, mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()


@pytest.mark.parametrize("name", ALL)
def test_loss_gradient_is_exactly_zero_on_padding(name):
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.5, 0.0], [0, 0, 1, 1], lengths=[2, 6, 3, 4])
    loss, _, _ = run(name, r, g, lp, old, mask)
    loss.backward()
    assert (lp.grad[mask == 0] == 0).all()


# ------------------------------------------------------------------------------------------ GRPO / Dr.GRPO


def test_grpo_advantage_is_group_normalised():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = algos.get("grpo").advantages(r, g)
    first = (r[:4] - r[:4].mean()) / r[:4].std()
    second = (r[4:] - r[4:].mean()) / r[4:].std()
    torch.testing.assert_close(adv, torch.cat([first, second]), atol=1e-5, rtol=1e-5)


def test_grpo_clip_zeroes_the_gradient_only_on_the_advantage_side():
    old = torch.zeros(2, 2)
    lp = torch.tensor([[0.5, 0.0], [0.5, 0.0]], requires_grad=True)  # token 0: ratio e^0.5 > 1.2
    adv = torch.tensor([1.0, -1.0])
    loss, metrics = algos.get("grpo").policy_loss(lp, old, adv, torch.ones(2, 2), torch.tensor([0, 0]))
    loss.backward()
    assert lp.grad[0, 0] == 0  # A > 0 and ratio above 1+ε: clipped
    assert lp.grad[1, 0] != 0  # A < 0: the upper clip does not bind
    assert lp.grad[0, 1] != 0 and lp.grad[1, 1] != 0
    assert metrics["clip_frac"] == pytest.approx(0.25)


def test_grpo_kl_term_is_k3_and_needs_a_reference():
    lp = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_(True)
    ref = torch.log(torch.tensor([[0.25, 0.2]]))
    algo = algos.get("grpo", kl_coef=0.5)
    assert algo.uses_reference() and not algos.get("grpo").uses_reference()
    with pytest.raises(ValueError, match="ref_logprobs"):
        algo.policy_loss(lp, lp.detach(), torch.zeros(1), torch.ones(1, 2), torch.tensor([0]))
    loss, metrics = algo.policy_loss(lp, lp.detach(), torch.zeros(1), torch.ones(1, 2), torch.tensor([0]), ref)
    k3 = (0.5 - math.log(0.5) - 1 + 0.0) / 2  # r = ref/π = 0.5 on token 0, 1 on token 1
    assert metrics["kl_ref"] == pytest.approx(k3, rel=1e-5)
    assert float(loss.detach()) == pytest.approx(0.5 * k3, rel=1e-5)


def test_dr_grpo_has_no_std_and_no_length_normalisation():
    r = torch.tensor([2.0, 0.0])
    g = torch.tensor([0, 0])
    algo = algos.get("dr_grpo", max_tokens=10)
    adv = algo.advantages(r, g)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0]))
    # Same response once with 2 tokens and once with 4: the loss doubles (GRPO's per-length mean would not).
    lp2 = torch.zeros(1, 4)
    short = torch.tensor([[1.0, 1, 0, 0]])
    long_ = torch.ones(1, 4)
    l_short, _ = algo.policy_loss(lp2, lp2, torch.tensor([1.0]), short, torch.tensor([0]))
    l_long, _ = algo.policy_loss(lp2, lp2, torch.tensor([1.0]), long_, torch.tensor([0]))
    assert float(l_long) == pytest.approx(2 * float(l_short))
    assert float(l_short) == pytest.approx(-2 / 10)  # Σ -ρA / (N · max_tokens)
    g_short, _ = algos.get("grpo").policy_loss(lp2, lp2, torch.tensor([1.0]), short, torch.tensor([0]))
    g_long, _ = algos.get("grpo").policy_loss(lp2, lp2, torch.tensor([1.0]), long_, torch.tensor([0]))
    assert float(g_short) == pytest.approx(float(g_long))


# ------------------------------------------------------------------------------------------ GPG


def grad_of(name, rewards, groups, lp_init, old, mask, **params):
    lp = lp_init.clone().requires_grad_(True)
    loss, _, _ = run(name, torch.tensor(rewards), torch.tensor(groups), lp, old, mask, **params)
    loss.backward()
    return lp.grad


def test_gpg_loss_is_minus_logp_times_advantage_without_ratio():
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)
    old = torch.tensor([[-3.0, -3.0], [-3.0, -3.0]])  # far from lp: a ratio would change the loss; GPG has none
    loss, _, adv = run("gpg", torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), lp, old, torch.ones(2, 2),
                       valid_threshold=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]))  # F_norm = 1, α = 1 (no degenerate group)
    expected = -(0.5 * (-1.0 - 2.0) - 0.5 * (-0.5 - 0.5)) / 4
    assert float(loss.detach()) == pytest.approx(expected)


def test_gpg_alpha_makes_degenerate_groups_free():
    """The GPG paper's Eq. 7: adding all-right/all-wrong groups must not shrink the gradient of the valid ones."""
    t = 5
    valid_r, valid_g = [1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1]
    torch.manual_seed(0)
    lp_valid = -torch.rand(4, t)
    lp_degenerate = -torch.rand(4, t)
    full_lp = torch.cat([lp_valid, lp_degenerate])
    mask = torch.ones(8, t)
    g_full = grad_of("gpg", valid_r + [1.0, 1.0, 0.0, 0.0], valid_g + [2, 2, 3, 3], full_lp, full_lp, mask)
    g_valid = grad_of("gpg", valid_r, valid_g, lp_valid, lp_valid, mask[:4])
    torch.testing.assert_close(g_full[:4], g_valid)
    assert (g_full[4:] == 0).all()
    # Without α the degenerate groups dilute the gradient by B/(B-M) = 2.
    g_plain = grad_of("gpg", valid_r + [1.0, 1.0, 0.0, 0.0], valid_g + [2, 2, 3, 3], full_lp, full_lp, mask,
                      adjust_alpha=False)
    torch.testing.assert_close(g_plain[:4] * 2, g_valid)


def test_gpg_batch_stats_and_std_option():
    algo = algos.get("gpg", f_norm="std")
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 1, 1])
    adv = algo.advantages(r, g)
    assert algo.batch_stats(r, g, adv, torch.zeros(4, 1), torch.ones(4, 1)) == {"alpha": 2.0, "valid_fraction": 0.5}
    std = torch.tensor([1.0, 0.0]).std()
    torch.testing.assert_close(adv, 2.0 * torch.tensor([0.5, -0.5, 0, 0]) / (std + 1e-4))
    all_equal = algo.advantages(torch.ones(4), g)
    assert (all_equal == 0).all()


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_gpg_loss_agg_matches_the_official_trainers(loss_agg):
    """AMAP-ML/GPG: the math trainers (open-r1 / open-rs gpg_trainer.py) take the batch token mean of -logπ·Â; the
    GeoQA trainer (R1-V grpo_trainer.py, pg_name gpg) takes each response's token mean, then the mean over responses,
    and divides by the valid fraction (α). The two differ on responses of unequal length."""
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1, 1], lengths=[6, 2, 4, 1, 5, 3])
    loss, _, adv = run("gpg", r, g, lp, old, mask, loss_agg=loss_agg, valid_threshold=0.0)
    per_token = -lp * adv[:, None]  # adv already carries α (all groups valid here: α = 1)
    official = ((per_token * mask).sum() / mask.sum() if loss_agg == "token_mean"
                else ((per_token * mask).sum(1) / mask.sum(1)).mean())
    assert float(loss.detach()) == pytest.approx(float(official.detach()), rel=1e-6)
    other = "seq_mean_token_mean" if loss_agg == "token_mean" else "token_mean"
    other_loss = run("gpg", r, g, lp, old, mask, loss_agg=other, valid_threshold=0.0)[0]
    assert float(other_loss.detach()) != pytest.approx(float(loss.detach()), rel=1e-3)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gpg_loss_mass_makes_micro_batch_accumulation_exact(loss_agg):
    """Each aggregation's loss_mass weights micro-batch losses so their sum is the whole batch's loss."""
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1], lengths=[6, 1, 3, 5])
    algo = algos.get("gpg", loss_agg=loss_agg, max_tokens=6, valid_threshold=0.0)
    adv = algo.advantages(r, g)
    whole, _ = algo.policy_loss(lp, old, adv, mask, g)
    parts = [slice(0, 2), slice(2, 4)]
    masses = [algo.loss_mass(mask[p], g[p]) for p in parts]
    accumulated = sum(algo.policy_loss(lp[p], old[p], adv[p], mask[p], g[p])[0] * m / sum(masses)
                      for p, m in zip(parts, masses, strict=True))
    assert float(accumulated.detach()) == pytest.approx(float(whole.detach()), rel=1e-6)
    with pytest.raises(ValueError, match="loss_agg must be one of"):
        algos.get("gpg", loss_agg="sum")


# ------------------------------------------------------------------------------------------ GVPO


def test_gvpo_weights_sum_to_zero_per_group():
    torch.manual_seed(1)
    r = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 0.0, 0.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    adv = algos.get("gvpo").advantages(r, g)
    w = gvpo_weights(torch.randn(7), torch.randn(7), adv, g, beta=0.1)
    assert abs(float(w[:3].sum())) < 1e-6 and abs(float(w[3:].sum())) < 1e-6


def test_gvpo_gradient_equals_listing1_weight_form():
    """§3.2: the MSE loss we minimise has the gradient of Eq. 8 / Listing 1 (-β Σ w_i ∇log π(y_i) / (k-1))."""
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.0, 1.0, 0.3, 0.7, 0.2, 0.9], [0, 0, 0, 0, 1, 1, 1, 1],
                                     lengths=[6, 3, 5, 1, 2, 6, 4, 5], drift=0.5)
    beta = 0.1
    loss, _, adv = run("gvpo", r, g, lp, old, mask, beta=beta)
    loss.backward()
    lp2 = lp.detach().clone().requires_grad_(True)
    seq = (lp2 * mask).sum(1)
    w = gvpo_weights(seq, (old * mask).sum(1), adv, g, beta)
    listing1 = sum(-(beta * seq[g == k] * w[g == k]).sum() / (int((g == k).sum()) - 1) for k in (0, 1)) / 2
    listing1.backward()
    torch.testing.assert_close(lp.grad, lp2.grad, atol=1e-6, rtol=1e-5)


def official_gvpo_micro_batch_loss(lp, old, adv, mask, g, beta, n):
    """jszkc/GVPO gvpo_core_algos.compute_policy_loss_gvpo on one micro-batch, written out: Σ over its responses of
    ½((rθ_i - mean_group rθ) - Â_i)² / (n - 1), rθ = β(log π_θ - log π_old) summed over the response."""
    rtheta = beta * ((lp * mask).sum(1) - (old * mask).sum(1))
    means = torch.stack([rtheta[g == k].mean() for k in g.tolist()])
    return (0.5 * ((rtheta - means) - adv) ** 2).sum() / (n - 1)


def test_gvpo_group_sum_is_the_official_losss_scale():
    """gvpo_dp_actor.py averages micro-batch losses (1 / gradient accumulation) and each micro-batch loss sums its
    groups: with 2 groups per official micro-batch, a mini-batch of 4 groups has loss (L_mb1 + L_mb2) / 2, which
    loss_agg=group_sum, groups_per_micro_batch=2 gives whatever mmrl's own micro-batching; group_mean is that / 2."""
    n, beta = 3, 0.1
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.5, 0.2, 0.9, 0.1, 1.0, 1.0, 0.0, 0.3, 0.3, 0.8],
                                     [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], lengths=[6, 2, 4, 1, 5, 3] * 2, drift=0.4)
    loss, _, adv = run("gvpo", r, g, lp, old, mask, beta=beta, loss_agg="group_sum", groups_per_micro_batch=2)
    official = (official_gvpo_micro_batch_loss(lp[:6], old[:6], adv[:6], mask[:6], g[:6], beta, n)
                + official_gvpo_micro_batch_loss(lp[6:], old[6:], adv[6:], mask[6:], g[6:], beta, n)) / 2
    assert float(loss.detach()) == pytest.approx(float(official.detach()), rel=1e-5)
    mean_loss, _, _ = run("gvpo", r, g, lp, old, mask, beta=beta)
    assert float(mean_loss.detach()) == pytest.approx(float(official.detach()) / 2, rel=1e-5)
    with pytest.raises(ValueError, match="only applies to loss_agg='group_sum'"):
        algos.get("gvpo", groups_per_micro_batch=4)
    with pytest.raises(ValueError, match="loss_agg must be one of"):
        algos.get("gvpo", loss_agg="sum")


def test_gvpo_refuses_split_groups():
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0])
    algo = algos.get("gvpo")
    adv = algo.advantages(r, g)
    with pytest.raises(ValueError, match="whole groups"):
        algo.policy_loss(lp[:3], old[:3], adv[:3], mask[:3], g[:3])


def test_gvpo_converges_to_the_kl_constrained_optimum():
    """Theorem 3.1/3.2 on a tabular problem: minimising L_GVPO gives π* ∝ π_θ'·exp(R/β).

    One prompt, 6 one-token responses. π_s is uniform (Theorem 3.2 allows any full-support π_s), so a group holding
    each response once is the exact expectation. π_θ' is the fixed initial policy.
    """
    torch.manual_seed(0)
    k, beta = 6, 0.5
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.0])
    theta_ref = torch.randn(k)
    log_ref = torch.log_softmax(theta_ref, 0)
    theta = theta_ref.clone().requires_grad_(True)
    algo = algos.get("gvpo", beta=beta)
    groups = torch.zeros(k, dtype=torch.long)
    adv = algo.advantages(rewards, groups)
    opt = torch.optim.Adam([theta], lr=0.05)
    for _ in range(3000):
        logp = torch.log_softmax(theta, 0)
        loss, _ = algo.policy_loss(logp[:, None], log_ref[:, None], adv, torch.ones(k, 1), groups)
        opt.zero_grad()
        loss.backward()
        opt.step()
    target = torch.softmax(log_ref + rewards / beta, 0)
    learned = torch.softmax(theta.detach(), 0)
    torch.testing.assert_close(learned, target, atol=1e-4, rtol=1e-3)
    assert float(loss.detach()) < 1e-8


# ------------------------------------------------------------------------------------------ GMPO


def test_gmpo_objective_is_bounded_by_grpo_objective():
    """The GMPO paper's Eq. 4: |J_GMPO| <= |J_GRPO| (geometric vs arithmetic mean of token ratios), clipping aside."""
    torch.manual_seed(3)
    for seed in range(20):
        r, g, lp, old, mask = make_batch([1.0, 0.0, 0.7, 0.2], [0, 0, 0, 0], lengths=[6, 2, 4, 5], drift=1.0,
                                         seed=seed)
        gmpo = algos.get("gmpo", clip_mode="none")
        grpo = algos.get("grpo", clip_low=0.0, clip_high=1e9)  # no clip binds for A > 0 either
        adv = gmpo.advantages(r, g).abs()  # |ρ·Â| form of Eq. 4: magnitudes
        j_gmpo, _ = gmpo.policy_loss(lp, old, adv, mask, g)
        j_grpo, _ = grpo.policy_loss(lp, old, adv, mask, g)
        assert abs(float(j_gmpo.detach())) <= abs(float(j_grpo.detach())) + 1e-6


def test_gmpo_token_clip_zeroes_gradient_only_on_the_advantage_side():
    old = torch.zeros(2, 3)
    lp = torch.tensor([[0.6, 0.0, -0.6], [0.6, 0.0, -0.6]], requires_grad=True)  # |log ρ| = 0.6 > 0.4
    adv = torch.tensor([1.0, -1.0])
    loss, metrics = algos.get("gmpo").policy_loss(lp, old, adv, torch.ones(2, 3), torch.tensor([0, 0]))
    loss.backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 2] != 0  # A > 0: only the upper bound binds
    assert lp.grad[1, 2] == 0 and lp.grad[1, 0] != 0  # A < 0: only the lower bound binds
    assert lp.grad[0, 1] != 0 and lp.grad[1, 1] != 0
    assert metrics["clip_frac"] == pytest.approx(2 / 6)


def test_gmpo_value_matches_equation_5():
    lp = torch.tensor([[0.1, -0.2, 0.9, 0.0]])
    old = torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv = torch.tensor([2.0])
    loss, _ = algos.get("gmpo").policy_loss(lp, old, adv, mask, torch.tensor([0]))
    expected = -2.0 * math.exp((0.1 - 0.2 + 0.4) / 3)  # token 3 clipped to 0.4, padding ignored
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    seq, _ = algos.get("gmpo", clip_mode="sequence").policy_loss(lp, old, adv, mask, torch.tensor([0]))
    assert float(seq) == pytest.approx(-2.0 * math.exp(0.4 / 3), rel=1e-6)  # Σ log ρ = 0.8 clipped to 0.4
    raw, _ = algos.get("gmpo", clip_mode="none", length_norm=False).policy_loss(lp, old, adv, mask,
                                                                               torch.tensor([0]))
    assert float(raw) == pytest.approx(-2.0 * math.exp(0.8), rel=1e-6)


def test_gmpo_sequence_clip_silences_the_whole_sequence():
    lp = torch.tensor([[0.3, 0.3]], requires_grad=True)
    loss, _ = algos.get("gmpo", clip_mode="sequence").policy_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]),
                                                                  torch.ones(1, 2), torch.tensor([0]))
    loss.backward()
    assert (lp.grad == 0).all()


# ------------------------------------------------------------------------------------------ CW-GRPO


def test_gmpo_kl_is_verl_low_var_kl_and_off_by_default():
    """The GMPO paper's Eq. 5 has no KL (default 0, no reference model); App. D's agentic run uses verl-agent's KL loss
    (kl_loss_coef 0.01, low_var_kl = k3 clamped to 10), averaged per response then over responses."""
    assert not algos.get("gmpo").uses_reference()
    algo = algos.get("gmpo", kl_coef=0.01)
    assert algo.uses_reference()
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1], lengths=[6, 2, 4, 3])
    adv = algo.advantages(r, g)
    with pytest.raises(ValueError, match="ref_logprobs"):
        algo.policy_loss(lp, old, adv, mask, g)
    ref = old - 2.0 * torch.rand(old.shape, generator=torch.Generator().manual_seed(3))
    ref[0, 0] = old[0, 0] + 15.0  # k3 of e^15 far beyond 10: verl clamps it
    with_kl, metrics = algo.policy_loss(lp, old, adv, mask, g, ref)
    without, _ = algos.get("gmpo").policy_loss(lp, old, adv, mask, g)
    log_r = (ref - lp).clamp(-20, 20)
    k3 = (torch.exp(log_r) - log_r - 1).clamp(max=10.0)
    per_response = ((k3 * mask).sum(1) / mask.sum(1)).mean()
    assert float((with_kl - without).detach()) == pytest.approx(0.01 * float(per_response.detach()), rel=1e-5)
    assert "kl_ref" in metrics
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        algos.get("gmpo", kl_coef=-1.0)


def test_cw_weights_have_mean_one_and_suppress_extreme_covariance():
    torch.manual_seed(0)
    n, t = 8, 16
    old = -torch.rand(n, t)
    old[0, 0] = -12.0  # an extreme log-prob on a high-|advantage| response: extreme covariance
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = algos.get("cw_grpo").advantages(rewards, groups)
    mask = torch.ones(n, t)
    mask[3, 10:] = 0
    w = covariance_weights(old, adv, mask)
    assert float((w * mask).sum() / mask.sum()) == pytest.approx(1.0, abs=1e-5)
    assert (w[mask == 0] == 0).all()
    assert float(w[0, 0]) < 0.01  # the extreme token is filtered out
    typical = w[mask.bool()].median()
    assert float(typical) > 0.9  # moderate tokens keep (slightly more than) their weight
    stats = covariance_stats(old, adv, mask)
    lp = old.detach()
    c = (lp - stats["cov_mean_logp"]) * (adv[:, None] - stats["cov_mean_adv"])
    order = torch.argsort(c[mask.bool()].abs())
    assert (w[mask.bool()][order].diff() <= 1e-6).all()  # weights decrease with |c|


def test_cw_grpo_reports_the_share_of_tokens_its_kernel_halves():
    torch.manual_seed(0)
    old = -torch.rand(8, 16) * 0.1
    old[0, 0] = old[4, 3] = -12.0  # two extreme tokens on responses with an advantage
    rewards, groups = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    algo = algos.get("cw_grpo")
    adv = algo.advantages(rewards, groups)
    mask = torch.ones(8, 16)
    _, metrics = algo.token_advantages(adv, old, old, mask, groups, None)
    w = covariance_weights(old, adv, mask, group_covariance_stats(old, adv, mask, groups))
    assert metrics["cw_halved_frac"] == pytest.approx(float((w < 0.5).float().mean()))
    assert metrics["cw_halved_frac"] == pytest.approx(2 / 128)


def test_cw_grpo_uses_whole_batch_statistics_in_minibatches():
    r, g, lp, old, mask = make_batch([1.0, 0.0, 0.0, 1.0, 0.3, 0.7, 0.2, 0.9], [0, 0, 0, 0, 1, 1, 1, 1],
                                     lengths=[6, 3, 5, 1, 2, 6, 4, 5])
    algo = algos.get("cw_grpo", stats_scope="batch")
    adv = algo.advantages(r, g)
    stats = algo.batch_stats(r, g, adv, old, mask)
    whole = covariance_weights(old, adv, mask, stats)
    half = covariance_weights(old[4:], adv[4:], mask[4:], stats)
    torch.testing.assert_close(half, whole[4:])


def _hand_weights(old: list[list[float]], adv: list[float], rows: list[int]) -> list[list[float]]:
    """w̃ of CW-GRPO's §2.3 by hand over the tokens of ``rows`` (plain Python: means, population σ, kernel, N / Σw)."""
    tokens = [(i, t) for i in rows for t in range(len(old[i]))]
    n = len(tokens)
    mean_lp = sum(old[i][t] for i, t in tokens) / n
    mean_adv = sum(adv[i] for i, t in tokens) / n
    c = {(i, t): (old[i][t] - mean_lp) * (adv[i] - mean_adv) for i, t in tokens}
    c_mean = sum(c.values()) / n
    sigma = math.sqrt(sum((v - c_mean) ** 2 for v in c.values()) / n)
    w = {k: math.exp(-v * v / (2 * sigma * sigma)) for k, v in c.items()}
    total = sum(w.values())
    return [[w[i, t] * n / total for t in range(len(old[i]))] for i in rows]


# two groups of two responses, lengths 3, 2 | 2, 3 (padding is -9, never read)
CW_OLD = [[-0.2, -1.5, -0.7], [-2.0, -0.1, -9.0], [-0.4, -3.0, -9.0], [-1.0, -0.6, -2.2]]
CW_REWARDS, CW_GROUPS, CW_LENGTHS = [1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1], [3, 2, 2, 3]


@pytest.mark.parametrize("scope", ["group", "batch"])
def test_cw_grpo_weights_equal_hand_computation_in_each_scope(scope):
    """``group`` (the default): each prompt's responses are normalised on their own, w̃ = w·N/Σ_{j=1..G}Σ_k w_jk
    as the paper writes it; ``batch``: over every token of the rollout batch. Each against the equation by hand,
    through the objective's own path (batch_stats, then micro-batches of one group each)."""
    algo = algos.get("cw_grpo", **({} if scope == "group" else {"stats_scope": scope}))
    assert algo.stats_scope == scope
    rewards, groups = torch.tensor(CW_REWARDS), torch.tensor(CW_GROUPS)
    old = torch.tensor(CW_OLD, dtype=torch.float64)
    mask = torch.tensor([[1.0] * n + [0.0] * (3 - n) for n in CW_LENGTHS], dtype=torch.float64)
    adv = algo.advantages(rewards, groups).double()
    stats = algo.batch_stats(rewards, groups, adv, old, mask)
    hand_old = [row[:n] for row, n in zip(CW_OLD, CW_LENGTHS, strict=True)]
    hand_adv = adv.tolist()
    scopes = [[0, 1], [2, 3]] if scope == "group" else [[0, 1, 2, 3]]
    want = {}
    for rows in scopes:
        want.update(dict(zip(rows, _hand_weights(hand_old, hand_adv, rows), strict=True)))
    for rows in ([0, 1], [2, 3]):  # each micro-batch sees its rows of the statistics
        index = torch.tensor(rows)
        sub = stats_for_rows(stats, index)
        token_adv, _ = algo.token_advantages(adv[index], old[index], old[index], mask[index], groups[index], sub)
        for k, i in enumerate(rows):
            got = (token_adv[k, :CW_LENGTHS[i]] / adv[i]).tolist()
            assert got == pytest.approx(want[i], rel=1e-9), (scope, i)
    if scope == "group":  # each group's weights average 1 over its own tokens
        for rows in scopes:
            assert sum(sum(want[i]) for i in rows) == pytest.approx(sum(CW_LENGTHS[i] for i in rows))


def test_cw_grpo_scopes_differ_and_a_bad_scope_is_one_line():
    r, g = torch.tensor(CW_REWARDS), torch.tensor(CW_GROUPS)
    old = torch.tensor(CW_OLD)
    mask = torch.tensor([[1.0] * n + [0.0] * (3 - n) for n in CW_LENGTHS])
    by_group, _, _ = run("cw_grpo", r, g, old.clone().requires_grad_(True), old, mask)
    by_batch, _, _ = run("cw_grpo", r, g, old.clone().requires_grad_(True), old, mask, stats_scope="batch")
    assert float(by_group.detach()) != pytest.approx(float(by_batch.detach()))
    with pytest.raises(ValueError, match="stats_scope must be one of group, batch, got 'prompt'"):
        algos.get("cw_grpo", stats_scope="prompt")


def test_cw_grpo_equals_grpo_when_covariance_vanishes():
    r, g, lp, old, mask = make_batch([1.0, 1.0, 0.0, 0.0], [0, 0, 1, 1])
    old = torch.full_like(old, -1.0)  # every log-prob equal: c = 0, σ = 0, all weights 1
    l_cw, _, _ = run("cw_grpo", r, g, lp, old, mask)
    l_grpo, _, _ = run("grpo", r, g, lp, old, mask)
    assert float(l_cw.detach()) == pytest.approx(float(l_grpo.detach()))


@pytest.mark.parametrize("name", ALL)
def test_dynamic_sampling_is_the_resampling_rule_with_every_group_valid(name):
    """DAPO's dynamic sampling as an option of every objective: the loop's resampling rule (GPG's mechanism) asking
    for every group to have reward spread, at most ``dynamic_sampling`` extra rounds."""
    assert algos.hyperparameters(name)["dynamic_sampling"] == 0
    assert algos.get(name, dynamic_sampling=4).resampling() == algos.Resampling(valid_fraction=1.0, max_rounds=4)
    default = algos.get(name).resampling()
    assert default == (algos.Resampling(0.6, 20) if name == "gpg" else algos.Resampling())
    with pytest.raises(ValueError, match="dynamic_sampling must be >= 0"):
        algos.get(name, dynamic_sampling=-1)


def test_overlong_penalty_is_dapos_equation_13():
    """0 up to L_max - L_cache, then linear down to -1 at L_max, -1 beyond; times the factor."""
    from mmrl.algos.base import overlong_penalty

    lengths = torch.tensor([0, 10, 12, 13, 14, 16, 20])
    want = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, max_length=16, buffer=4), want)
    torch.testing.assert_close(overlong_penalty(lengths, max_length=16, buffer=4, factor=0.5), want / 2)


@pytest.mark.parametrize("name", ALL)
def test_overlong_shaping_is_an_option_of_every_objective(name):
    r, lengths = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([5, 15, 16])
    assert algos.get(name).shaped_rewards(r, lengths) is r  # off by default
    algo = algos.get(name, overlong_buffer=4, overlong_penalty=0.5)
    with pytest.raises(ValueError, match="with_length_budget"):
        algo.shaped_rewards(r, lengths)
    budgeted = algo.with_length_budget(16)
    assert budgeted.max_length == 16 and algos.get(name, overlong_buffer=4, max_length=8).with_length_budget(
        16).max_length == 8  # an explicit L_max stays
    torch.testing.assert_close(budgeted.shaped_rewards(r, lengths), torch.tensor([1.0, -0.375, 0.5]))
    with pytest.raises(ValueError, match="0 < overlong_buffer <= max_length"):
        algos.get(name, overlong_buffer=4).with_length_budget(3)
    with pytest.raises(ValueError, match="overlong_buffer and overlong_penalty must be >= 0"):
        algos.get(name, overlong_penalty=-1.0)


def test_hyper_parameter_types_are_checked_with_one_line():
    with pytest.raises(ValueError, match="grpo.clip_low must be a finite number, got 'abc'"):
        algos.get("grpo", clip_low="abc")
    for value in (float("nan"), float("inf")):  # a NaN clip makes every loss NaN; an inf std_eps zeroes advantages
        with pytest.raises(ValueError, match="must be a finite number"):
            algos.get("grpo", clip_high=value)
        with pytest.raises(ValueError, match="must be a finite number"):
            algos.get("gmpo", std_eps=value)
    with pytest.raises(ValueError, match="gpg.max_resample must be an integer"):
        algos.get("gpg", max_resample=2.5)
    with pytest.raises(ValueError, match="gpg.adjust_alpha must be true or false"):
        algos.get("gpg", adjust_alpha="yes")
    assert algos.get("grpo", clip_low=0).clip_low == 0.0 and algos.get("dr_grpo", max_tokens=None).max_tokens is None
    with pytest.raises(ValueError, match="std_eps must be > 0"):
        algos.get("gmpo", std_eps=-1.0)


def test_kl_to_old_mean_and_max_over_trained_tokens():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.25, 0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.5, 0.5, 0.5]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the third column is padding
    # k3 = r - log r - 1 with r = π_old / π_θ: 0, 2 - ln 2 - 1, 0.5 - ln 0.5 - 1, 0
    k = [0.0, 1 - math.log(2), -0.5 + math.log(2), 0.0]
    mean, top = base.kl_to_old(new, old, mask)
    assert mean == pytest.approx(sum(k) / 4, abs=1e-6) and top == pytest.approx(1 - math.log(2), abs=1e-6)
    assert base.kl_to_old(new, old, torch.zeros_like(mask)) == (0.0, 0.0)


def test_advantage_spread_within_groups():
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3])
    got = base.advantage_spread(adv, groups)
    # stds (ddof 1): group 0 √2, groups 1 and 2 zero, group 3 one row: 0; groups 1, 2 and 3 have no spread
    assert got["adv_group_std"] == pytest.approx(math.sqrt(2) / 4)
    assert got["adv_zero_spread"] == pytest.approx(3 / 4)
    assert got["adv_mean"] == pytest.approx(9 / 8)
