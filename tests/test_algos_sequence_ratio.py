"""GSPO, CISPO and SAPO: each paper's claims on tensors (one test or more per claim).

GSPO: https://arxiv.org/abs/2507.18071; CISPO (MiniMax-M1): https://arxiv.org/abs/2506.13585;
SAPO: https://arxiv.org/abs/2511.20347. The contract tests every objective shares are in tests/test_algos.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import mmrl.algos as algos
from mmrl.algos.gspo import GSPO
from mmrl.algos.sapo import gate_weight


def drifted(n: int, t: int, drift: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g) * 3
    return (old + drift * torch.randn(n, t, generator=g)).requires_grad_(True), old


def loss_and_grad(algo, lp, old, adv, mask, groups=None):
    lp = lp.detach().clone().requires_grad_(True)
    groups = torch.zeros(len(adv), dtype=torch.long) if groups is None else groups
    loss, metrics = algo.policy_loss(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, group_ids=groups)
    loss.backward()
    return loss.detach(), lp.grad, metrics


# ------------------------------------------------------------------------------------------ GSPO


def test_gspo_defaults_are_the_papers():
    defaults = algos.hyperparameters("gspo")
    assert defaults["clip_low"] == 3e-4 and defaults["clip_high"] == 4e-4  # §5.1
    assert defaults["variant"] == "sequence" and defaults["kl_coef"] == 0.0
    r, g = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0])
    torch.testing.assert_close(algos.get("gspo").advantages(r, g), algos.get("grpo").advantages(r, g))  # Eq. 6
    with pytest.raises(ValueError, match="variant must be one of"):
        algos.get("gspo", variant="tokens")


def test_gspo_ratio_is_the_length_normalised_geometric_mean():
    """Eq. 7: s_i = (π/π_old)^(1/|y_i|); every token at ratio 1.0002 gives s = 1.0002 for a response of any length."""
    algo = algos.get("gspo", clip_low=0.5, clip_high=10.0)  # wide: nothing clipped
    old = torch.zeros(2, 6)
    lp = torch.full((2, 6), math.log(1.0002))
    mask = torch.tensor([[1.0, 1, 0, 0, 0, 0], [1.0] * 6])
    _, _, m = loss_and_grad(algo, lp, old, torch.tensor([1.0, 1.0]), mask)
    assert m["seq_ratio_max"] == pytest.approx(1.0002, rel=1e-6) and m["seq_ratio_min"] == pytest.approx(1.0002)
    lp, old = drifted(1, 5, 0.3)
    loss, _, _ = loss_and_grad(algo, lp, old, torch.tensor([1.0]), torch.ones(1, 5))
    geometric = math.prod(math.exp(x) for x in (lp - old)[0].tolist()) ** (1 / 5)
    assert float(loss) == pytest.approx(-geometric, rel=1e-5)  # -s·Â with Â = 1, unclipped


def test_gspo_clip_keeps_or_drops_whole_responses():
    """Eq. 5: one clip decision per response, on the advantage's side only."""
    old = torch.zeros(3, 4)
    lp = torch.tensor([[0.01, -0.005, 0.0, 0.0]] * 3)  # s = e^(0.005/4) ≈ 1.00125 > 1 + 4e-4
    mask = torch.tensor([[1.0, 1, 1, 1], [1.0, 1, 1, 1], [1.0, 1, 0, 0]])
    _, grad, m = loss_and_grad(algos.get("gspo"), lp, old, torch.tensor([1.0, -1.0, 1.0]), mask)
    assert (grad[0] == 0).all()  # Â > 0 above 1 + ε_high: every token of the response silenced, even token 1
    assert (grad[1] != 0).all()  # Â < 0: the upper bound does not bind
    assert (grad[2, :2] == 0).all()  # s = e^(0.005/2): clipped too
    assert m["clip_frac"] == pytest.approx(6 / 10)  # the tokens of the clipped responses


def test_gspo_gradient_weights_a_responses_tokens_equally():
    """Eq. 10: ∇ = -1/G Σ_i s_i Â_i 1/|y_i| Σ_t ∇log π(y_it); GRPO instead weights each token by its own ratio."""
    lp, old = drifted(2, 5, 0.05)
    mask = torch.tensor([[1.0] * 5, [1.0, 1, 1, 0, 0]])
    adv = torch.tensor([0.7, -1.3])
    algo = algos.get("gspo", clip_low=0.5, clip_high=0.5)  # wide enough that nothing is clipped
    _, grad, _ = loss_and_grad(algo, lp, old, adv, mask)
    length = mask.sum(1)
    s = torch.exp(((lp.detach() - old) * mask).sum(1) / length)
    want = -(s * adv / length)[:, None] / 2 * mask
    torch.testing.assert_close(grad, want)
    assert torch.allclose(grad[0], grad[0, :1].expand(5))  # one weight for every token of the response
    _, grpo_grad, _ = loss_and_grad(algos.get("grpo", clip_low=0.5, clip_high=0.5), lp, old, adv, mask)
    assert not torch.allclose(grpo_grad[0], grpo_grad[0, :1].expand(5))


def test_gspo_on_policy_step_is_grpos():
    lp = -torch.rand(3, 4)
    adv = torch.tensor([1.0, -0.5, 0.2])
    mask = torch.tensor([[1.0, 1, 1, 1], [1.0, 1, 0, 0], [1.0, 0, 0, 0]])
    gspo_loss, gspo_grad, _ = loss_and_grad(algos.get("gspo"), lp, lp, adv, mask)
    grpo_loss, grpo_grad, _ = loss_and_grad(algos.get("grpo"), lp, lp, adv, mask)
    torch.testing.assert_close(gspo_grad, grpo_grad)
    torch.testing.assert_close(gspo_loss, grpo_loss)


@pytest.mark.parametrize("clip", [0.5, 4e-4])
def test_gspo_token_is_gspo_with_one_advantage_per_response(clip):
    """§4.3: with Â_it = Â_i, GSPO-token and GSPO agree in objective, clip and gradient (clipped or not)."""
    lp, old = drifted(4, 6, 0.02, seed=3)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    adv = torch.tensor([1.0, -1.0, 0.5, -0.2])
    seq = loss_and_grad(algos.get("gspo", clip_low=clip, clip_high=clip), lp, old, adv, mask)
    tok = loss_and_grad(algos.get("gspo", clip_low=clip, clip_high=clip, variant="token"), lp, old, adv, mask)
    torch.testing.assert_close(seq[0], tok[0])
    torch.testing.assert_close(seq[1], tok[1])
    assert seq[2]["clip_frac"] == tok[2]["clip_frac"]


@dataclasses.dataclass(frozen=True)
class PerTokenGSPO(GSPO):
    """GSPO-token with an advantage of its own on each token (here: Â_i times the token's position + 1)."""

    def token_advantages(self, advantages, logprobs, old_logprobs, mask, group_ids, stats):
        return advantages[:, None] * torch.arange(1, logprobs.shape[1] + 1, dtype=logprobs.dtype), {}


def test_gspo_token_gives_each_token_its_advantage_with_the_sequences_ratio():
    """Eq. 14-15: ∇ = 1/G Σ_i s_i 1/|y_i| Σ_t Â_it ∇log π(y_it)."""
    lp, old = drifted(2, 4, 0.05, seed=1)
    mask = torch.ones(2, 4)
    adv = torch.tensor([1.0, -2.0])
    algo = PerTokenGSPO(clip_low=0.5, clip_high=0.5, variant="token")
    _, grad, _ = loss_and_grad(algo, lp, old, adv, mask)
    s = torch.exp((lp.detach() - old).mean(1))
    token_adv = adv[:, None] * torch.arange(1, 5)
    torch.testing.assert_close(grad, -(s[:, None] * token_adv) / 4 / 2)


# ------------------------------------------------------------------------------------------ CISPO


def test_cispo_defaults_are_the_papers():
    d = algos.hyperparameters("cispo")
    assert d["loss_agg"] == "token_mean"  # Eq. 4: 1/Σ|o_i|
    assert d["clip_low"] == 1.0  # no lower bound on the weight
    assert d["clip_high"] == 5.0 and d["kl_coef"] == 0.0
    with pytest.raises(ValueError, match="clip_low and clip_high must be >= 0"):
        algos.get("cispo", clip_high=-0.1)


def test_cispo_tokens_outside_the_range_keep_a_gradient():
    """A token whose ratio left the range is weighted by the bound (CISPO), where GRPO silences it."""
    old = torch.zeros(1, 2)
    lp = torch.tensor([[0.5, 0.0]])  # token 0: ratio e^0.5 ≈ 1.65 > 1 + 0.2
    cispo = algos.get("cispo", clip_high=0.2)
    _, grad, m = loss_and_grad(cispo, lp, old, torch.tensor([1.0]), torch.ones(1, 2))
    assert float(grad[0, 0]) == pytest.approx(-1.2 / 2)  # -sg(1 + ε_high)·Â / Σ|o|
    assert float(grad[0, 1]) == pytest.approx(-1.0 / 2)
    assert m["clip_frac"] == pytest.approx(0.5)
    _, grpo_grad, _ = loss_and_grad(algos.get("grpo"), lp, old, torch.tensor([1.0]), torch.ones(1, 2))
    assert grpo_grad[0, 0] == 0


def test_cispo_gradient_is_reinforce_with_a_stopped_clipped_weight():
    """Eq. 4: ∇ = -1/Σ|o| Σ sg(r̂_it) Â_i ∇log π_θ: no gradient through the weight itself."""
    lp, old = drifted(3, 5, 0.8, seed=2)
    mask = torch.ones(3, 5)
    mask[2, 3:] = 0
    adv = torch.tensor([1.0, -1.0, 0.3])
    algo = algos.get("cispo", clip_low=0.3, clip_high=0.4)
    loss, grad, _ = loss_and_grad(algo, lp, old, adv, mask)
    weight = torch.exp(lp.detach() - old).clamp(0.7, 1.4)
    torch.testing.assert_close(grad, -(weight * adv[:, None]) * mask / mask.sum())
    torch.testing.assert_close(loss, -(weight * adv[:, None] * lp.detach() * mask).sum() / mask.sum())


def test_cispo_has_no_lower_bound_by_default():
    old = torch.zeros(1, 1)
    lp = torch.tensor([[math.log(0.01)]])
    _, grad, _ = loss_and_grad(algos.get("cispo"), lp, old, torch.tensor([-1.0]), torch.ones(1, 1))
    assert float(grad) == pytest.approx(0.01, rel=1e-5)  # weighted by its ratio, not raised to a bound
    _, grad, _ = loss_and_grad(algos.get("cispo", clip_low=0.2), lp, old, torch.tensor([-1.0]), torch.ones(1, 1))
    assert float(grad) == pytest.approx(0.8)


def test_cispo_normalises_over_all_tokens_of_the_batch():
    """Eq. 4's 1/Σ|o_i|: a response twice as long weighs twice as much; the loss mass is the token count."""
    lp = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 1, 0, 0], [1.0, 1, 1, 1]])
    algo = algos.get("cispo")
    _, grad, _ = loss_and_grad(algo, lp, lp, torch.tensor([1.0, 1.0]), mask)
    torch.testing.assert_close(grad, -mask / 6)
    assert algo.loss_mass(mask, torch.tensor([0, 0])) == 6.0


def test_cispo_on_policy_step_is_grpos_token_mean_step():
    lp = -torch.rand(3, 4)
    mask = torch.tensor([[1.0, 1, 1, 1], [1.0, 1, 0, 0], [1.0, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 0.2])
    _, cispo_grad, _ = loss_and_grad(algos.get("cispo"), lp, lp, adv, mask)
    _, grpo_grad, _ = loss_and_grad(algos.get("grpo", loss_agg="token_mean"), lp, lp, adv, mask)
    torch.testing.assert_close(cispo_grad, grpo_grad)


# ------------------------------------------------------------------------------------------ SAPO


def test_sapo_defaults_are_the_papers():
    d = algos.hyperparameters("sapo")
    assert d["tau_pos"] == 1.0 and d["tau_neg"] == 1.05
    assert d["loss_agg"] == "seq_mean_token_mean" and d["kl_coef"] == 0.0
    for bad in ({"tau_pos": 0.0}, {"tau_neg": -1.0}):
        with pytest.raises(ValueError, match="tau_pos and tau_neg must be > 0"):
            algos.get("sapo", **bad)


def test_sapo_gradient_is_the_gate_weight_times_the_unclipped_gradient():
    """∇f(ρ) = w ρ ∇log π, w = 4σ(τ(ρ-1))(1-σ(τ(ρ-1))), τ by the advantage's sign; the loss is -f(ρ)Â."""
    lp, old = drifted(2, 5, 0.6, seed=4)
    mask = torch.ones(2, 5)
    adv = torch.tensor([0.8, -1.1])
    loss, grad, m = loss_and_grad(algos.get("sapo"), lp, old, adv, mask)
    ratio = torch.exp(lp.detach() - old)
    tau = torch.tensor([[1.0], [1.05]])
    w = gate_weight(ratio, tau)
    torch.testing.assert_close(grad, -(w * ratio * adv[:, None]) / 5 / 2)
    f = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    torch.testing.assert_close(loss, -(f * adv[:, None]).mean(1).mean())
    assert m["gate_weight"] == pytest.approx(float(w.mean()), rel=1e-5)


def test_sapo_on_policy_step_is_grpos_for_any_temperature():
    """The 4/τ factor makes w = 1 at ρ = 1: the on-policy gradient does not depend on τ."""
    lp = -torch.rand(2, 3)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 3)
    _, grpo, _ = loss_and_grad(algos.get("grpo"), lp, lp, adv, mask)
    for tau_pos, tau_neg in ((1.0, 1.05), (0.1, 8.0), (5.0, 5.0)):
        _, grad, m = loss_and_grad(algos.get("sapo", tau_pos=tau_pos, tau_neg=tau_neg), lp, lp, adv, mask)
        torch.testing.assert_close(grad, grpo)
        assert m["gate_weight"] == pytest.approx(1.0)


def test_sapo_gate_decays_smoothly_instead_of_cutting_off():
    """A hard clip zeroes a token's gradient past 1 + ε; SAPO's weight shrinks continuously and stays > 0."""
    ratios = torch.tensor([1.0, 1.1, 1.2, 1.3, 2.0, 3.0, 4.0])
    lp = torch.log(ratios)[None]
    old = torch.zeros_like(lp)
    mask = torch.ones_like(lp)
    _, sapo, _ = loss_and_grad(algos.get("sapo", tau_pos=4.0), lp, old, torch.tensor([1.0]), mask)
    _, grpo, _ = loss_and_grad(algos.get("grpo"), lp, old, torch.tensor([1.0]), mask)
    w = -sapo[0] * 7 / ratios  # the gate weight of each token
    assert (w > 0).all() and (w[1:] < w[:-1]).all()  # monotone from 1 at ρ = 1
    assert (grpo[0, 3:] == 0).all() and (sapo[0, 3:] != 0).all()


def test_sapo_damps_negative_advantages_faster_when_tau_neg_is_larger():
    ratio = torch.tensor([[1.5, 0.6]])
    lp, old, mask = torch.log(ratio), torch.zeros(1, 2), torch.ones(1, 2)
    algo = algos.get("sapo", tau_pos=1.0, tau_neg=3.0)
    _, pos, _ = loss_and_grad(algo, lp, old, torch.tensor([1.0]), mask)
    _, neg, _ = loss_and_grad(algo, lp, old, torch.tensor([-1.0]), mask)
    assert (neg.abs() < pos.abs()).all()
    torch.testing.assert_close(-pos[0] * 2 / ratio[0], gate_weight(ratio[0], torch.tensor(1.0)))
    torch.testing.assert_close(neg[0] * 2 / ratio[0], gate_weight(ratio[0], torch.tensor(3.0)))


def test_sapo_damps_an_off_policy_token_alone_where_gspo_drops_the_response():
    """Token-adaptive: one token far off-policy, the rest on-policy. SAPO keeps the others' gradient; GSPO's
    sequence clip silences the whole response."""
    lp = torch.tensor([[2.0, 0.0, 0.0, 0.0]])
    old, mask, adv = torch.zeros(1, 4), torch.ones(1, 4), torch.tensor([1.0])
    _, sapo, _ = loss_and_grad(algos.get("sapo"), lp, old, adv, mask)
    assert sapo[0, 1:].tolist() == pytest.approx([-0.25] * 3)  # w = 1, ρ = 1: GRPO's on-policy gradient
    assert abs(float(sapo[0, 0])) < 0.25 * 0.5  # the off-policy token: damped
    _, gspo, _ = loss_and_grad(algos.get("gspo"), lp, old, adv, mask)
    assert (gspo == 0).all()


def test_sapo_is_a_soft_sequence_gate_when_token_ratios_agree():
    """Sequence-coherent: with small steps and little spread of the log-ratios within a response, the mean token
    gate weight is the gate weight of the sequence's geometric-mean ratio s_i."""
    g = torch.Generator().manual_seed(5)
    for centre in (-0.3, 0.1, 0.4):
        z = centre + 0.01 * torch.randn(1, 50, generator=g)
        ratio = torch.exp(z)
        s = torch.exp(z.mean())
        token_mean = float(gate_weight(ratio, torch.tensor(1.0)).mean())
        assert token_mean == pytest.approx(float(gate_weight(s, torch.tensor(1.0))), abs=1e-3)


def test_sapo_with_a_small_temperature_is_the_unclipped_is_gradient():
    """τ → 0: w → 1 for every ratio, the plain importance-weighted policy gradient -ρÂ∇log π."""
    lp, old = drifted(2, 3, 0.5, seed=6)
    adv = torch.tensor([1.0, -1.0])
    _, grad, _ = loss_and_grad(algos.get("sapo", tau_pos=1e-4, tau_neg=1e-4), lp, old, adv, torch.ones(2, 3))
    ratio = torch.exp(lp.detach() - old)
    torch.testing.assert_close(grad, -(ratio * adv[:, None]) / 3 / 2, rtol=1e-4, atol=1e-6)
