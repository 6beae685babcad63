"""GiGPO (arXiv 2505.10978): advantages checked against cases worked out by hand from the paper's Eq. 3-8, and the
turn layout's default rule for the other objectives (each turn carries its episode's advantage)."""

from __future__ import annotations

import math

import pytest
import torch

import mmrl.algos as algos
from mmrl.algos.base import TurnSteps
from mmrl.algos.gigpo import anchor_groups, discounted_returns

# One game, two episodes (rows in batch order):
#   episode 0 (won):  s0 -> r 0,  s1 -> r 0,  s2 -> r 10        R(τ_0) = 10
#   episode 1 (lost): s0 -> r 0,  s1 -> r 0                      R(τ_1) = 0
ROWS = [(0, 0, 0.0, "s0"), (0, 1, 0.0, "s1"), (0, 2, 10.0, "s2"), (1, 0, 0.0, "s0"), (1, 1, 0.0, "s1")]


def turn_batch(rows=ROWS, group_of=lambda episode: 0):
    episodes = torch.tensor([r[0] for r in rows])
    returns = {e: sum(r[2] for r in rows if r[0] == e) for e in set(episodes.tolist())}
    steps = TurnSteps(episodes, torch.tensor([r[1] for r in rows]), torch.tensor([r[2] for r in rows]),
                      tuple(r[3] for r in rows))
    rewards = torch.tensor([returns[r[0]] for r in rows])
    group_ids = torch.tensor([group_of(r[0]) for r in rows])
    return rewards, group_ids, steps


def gigpo(**params):
    return algos.get("gigpo", **params)


def test_gigpo_is_registered_and_declares_what_it_needs():
    assert set(algos.ALGORITHMS) == {"grpo", "dr_grpo", "gpg", "gvpo", "gmpo", "cw_grpo", "gigpo", "gspo",
                                     "cispo", "sapo"}
    assert algos.ALGORITHMS["gigpo"].needs_steps and not algos.ALGORITHMS["grpo"].needs_steps
    assert not algos.ALGORITHMS["gvpo"].trains_turns and algos.ALGORITHMS["gigpo"].trains_turns
    defaults = algos.hyperparameters("gigpo")
    assert (defaults["gamma"], defaults["step_weight"], defaults["episode_scope"], defaults["similarity"]) == (
        0.95, 1.0, "trajectory", 1.0)


def test_mean_normalised_case_by_hand():
    """F_norm = 1, γ = 0.5, ω = 1. Eq. 3: mean R = 5, so A^E = +5 / -5. Eq. 5: episode 0's returns 2.5, 5, 10;
    episode 1's 0, 0. Eq. 6-7: anchor s0 = {2.5, 0} -> ±1.25; s1 = {5, 0} -> ±2.5; s2 = {10} alone -> 0."""
    rewards, group_ids, steps = turn_batch()
    adv = gigpo(scale_by_std=False, gamma=0.5).turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([6.25, 7.5, 5.0, -6.25, -7.5]))


def test_mean_std_normalised_case_by_hand():
    """F_norm = unbiased std: every two-member group {x, y} normalises to ±1/√2; the lone s2 stays 0."""
    rewards, group_ids, steps = turn_batch()
    adv = gigpo(gamma=0.5).turn_advantages(rewards, group_ids, steps)
    h = 1 / math.sqrt(2)
    torch.testing.assert_close(adv, torch.tensor([2 * h, 2 * h, h, -2 * h, -2 * h]), atol=1e-5, rtol=0)


def test_step_weight_omega_scales_only_the_step_term():
    rewards, group_ids, steps = turn_batch()
    adv = gigpo(scale_by_std=False, gamma=0.5, step_weight=0.5).turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([5.625, 6.25, 5.0, -5.625, -6.25]))
    episode_only = gigpo(scale_by_std=False, step_weight=0.0).turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(episode_only, torch.tensor([5.0, 5.0, 5.0, -5.0, -5.0]))


def test_gamma_discounts_later_rewards():
    """Eq. 5 with γ = 0.9 on episode 0: R_2 = 10, R_1 = 9, R_0 = 8.1; γ = 1 gives 10 everywhere."""
    rewards, group_ids, steps = turn_batch()
    first, dense = steps.episode_rows()
    torch.testing.assert_close(discounted_returns(steps.step_rewards, dense, steps.step_index, 0.9),
                               torch.tensor([8.1, 9.0, 10.0, 0.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(discounted_returns(steps.step_rewards, dense, steps.step_index, 1.0),
                               torch.tensor([10.0, 10.0, 10.0, 0.0, 0.0], dtype=torch.float64))
    # a reward mid-episode counts at the steps before it too, discounted: r = (1, 0, 2), γ = 0.5 -> (1.5, 1, 2)
    returns = discounted_returns(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0, 0, 0]), torch.tensor([0, 1, 2]), 0.5)
    torch.testing.assert_close(returns, torch.tensor([1.5, 1.0, 2.0], dtype=torch.float64))
    # the discount changes the step term: s0 = {8.1, 0} -> ±4.05, s1 = {9, 0} -> ±4.5
    adv = gigpo(scale_by_std=False, gamma=0.9).turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([9.05, 9.5, 5.0, -9.05, -9.5]))


def test_all_equal_returns_give_zero_advantage_without_nan():
    rows = [(0, 0, 0.0, "s0"), (0, 1, 0.0, "s1"), (1, 0, 0.0, "s0"), (1, 1, 0.0, "s2"), (1, 2, 0.0, "s2")]
    rewards, group_ids, steps = turn_batch(rows)
    for params in ({}, {"scale_by_std": False}, {"episode_scope": "turn"}):
        adv = gigpo(**params).turn_advantages(rewards, group_ids, steps)
        assert torch.equal(adv, torch.zeros(5)), params


def test_anchor_groups_of_one_contribute_nothing():
    """Every state distinct: each anchor group has one member, A^S = 0, and A is the episode term alone."""
    rows = [(0, 0, 0.0, "a"), (0, 1, 10.0, "b"), (1, 0, 0.0, "c"), (1, 1, 0.0, "d")]
    rewards, group_ids, steps = turn_batch(rows)
    adv = gigpo(scale_by_std=False).turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([5.0, 5.0, -5.0, -5.0]))


def test_a_state_revisited_within_one_episode_joins_its_anchor_group():
    """Eq. 6 ranges over every (i, t): episode 0 passes s0 twice (returns 0.25 then 0.5 at γ = 0.5), episode 1 once
    (0), so the s0 group is {0.25, 0.5, 0} with mean 0.25; A^E = ±0.5."""
    rows = [(0, 0, 0.0, "s0"), (0, 1, 0.0, "s0"), (0, 2, 1.0, "s9"), (1, 0, 0.0, "s0")]
    rewards, group_ids, steps = turn_batch(rows)
    adv = gigpo(scale_by_std=False, gamma=0.5).turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.75, 0.5, -0.75]))


def test_anchor_groups_never_span_two_games():
    """The same state text in two games' groups is two anchor groups (Eq. 6 is within a group)."""
    rows = [(0, 0, 10.0, "s0"), (1, 0, 0.0, "s0"), (2, 0, 4.0, "s0"), (3, 0, 0.0, "s0")]
    rewards, group_ids, steps = turn_batch(rows, group_of=lambda e: e // 2)
    assert anchor_groups(steps.anchors, group_ids, 1.0).tolist() == [0, 0, 1, 1]
    adv = gigpo(scale_by_std=False).turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([10.0, -10.0, 4.0, -4.0]))


def test_similarity_threshold_merges_near_identical_states():
    near = ("You arrive at shelf 1. On the shelf 1, you see a mug 1.", "You arrive at shelf 1. On the shelf 1, you "
            "see a mug 2.", "Nothing happens.")
    group_ids = torch.zeros(3, dtype=torch.long)
    assert anchor_groups(near, group_ids, 1.0).tolist() == [0, 1, 2]
    assert anchor_groups(near, group_ids, 0.9).tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="similarity must be in"):
        gigpo(similarity=0.0)


def test_episode_scope_turn_is_verl_agents_mean_over_turn_samples():
    """Over turn-samples the group's returns are (10, 10, 10, 0, 0): mean 6, so A^E = +4 / -6 (the three-step
    episode weighs three times); over trajectories it is ±5."""
    rewards, group_ids, steps = turn_batch()
    adv = gigpo(scale_by_std=False, gamma=0.5, episode_scope="turn").turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([5.25, 6.5, 4.0, -7.25, -8.5]))


def test_row_order_does_not_matter():
    rewards, group_ids, steps = turn_batch()
    algo = gigpo(gamma=0.7)
    adv = algo.turn_advantages(rewards, group_ids, steps)
    perm = torch.tensor([4, 2, 0, 3, 1])
    shuffled = TurnSteps(steps.episode_ids[perm], steps.step_index[perm], steps.step_rewards[perm],
                         tuple(steps.anchors[i] for i in perm.tolist()))
    torch.testing.assert_close(algo.turn_advantages(rewards[perm], group_ids[perm], shuffled), adv[perm])


def test_single_turn_responses_are_one_step_episodes_sharing_the_prompt():
    """A single-turn response is an episode of one step whose state, the prompt, its group shares: A = (1 + ω) A^E."""
    rewards, group_ids = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 1, 1])
    grpo = algos.get("grpo").advantages(rewards, group_ids)
    torch.testing.assert_close(gigpo(step_weight=0.5).advantages(rewards, group_ids), 1.5 * grpo)
    steps = TurnSteps(torch.arange(5), torch.zeros(5, dtype=torch.long), rewards, ("p0",) * 3 + ("p1",) * 2)
    torch.testing.assert_close(gigpo(step_weight=0.5).turn_advantages(rewards, group_ids, steps), 1.5 * grpo)


@pytest.mark.parametrize("name", ["grpo", "gmpo", "gpg", "dr_grpo", "cw_grpo"])
def test_other_objectives_give_each_turn_its_episodes_advantage(name):
    """The default turn rule: the objective's advantage over the group's episodes (one value each), broadcast."""
    rewards, group_ids, steps = turn_batch()
    algo = algos.get(name, **({"valid_threshold": 0.0} if name == "gpg" else {}))
    per_episode = algo.advantages(torch.tensor([10.0, 0.0]), torch.tensor([0, 0]))
    expected = per_episode[torch.tensor([0, 0, 0, 1, 1])]
    torch.testing.assert_close(algo.turn_advantages(rewards, group_ids, steps), expected)


def test_turns_of_one_episode_must_carry_one_return():
    rewards, group_ids, steps = turn_batch()
    rewards[1] = 3.0
    for algo in (gigpo(), algos.get("grpo")):
        with pytest.raises(ValueError, match="turns of an episode must all carry"):
            algo.turn_advantages(rewards, group_ids, steps)
    with pytest.raises(ValueError, match="must all have 2 rows"):
        TurnSteps(torch.arange(2), torch.zeros(3, dtype=torch.long), torch.zeros(2), ("a", "b"))


def test_gigpo_loss_is_grpos_clipped_surrogate_on_its_advantages():
    rewards, group_ids, steps = turn_batch()
    algo = gigpo(gamma=0.5)
    adv = algo.turn_advantages(rewards, group_ids, steps)
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(5, 4, generator=gen)
    new = old + 0.3 * torch.randn(5, 4, generator=gen)
    mask = torch.ones(5, 4)
    loss, metrics = algo.policy_loss(logprobs=new, old_logprobs=old, advantages=adv, mask=mask, group_ids=group_ids)
    same, _ = algos.get("grpo", loss_agg="token_mean").policy_loss(logprobs=new, old_logprobs=old, advantages=adv,
                                                                  mask=mask, group_ids=group_ids)
    torch.testing.assert_close(loss, same)
    assert "clip_frac" in metrics


# ROWS with a malformed second step in episode 0: the env pays -0.1 there (penalty 0.1), 10 on the win.
PENALISED = [(0, 0, 0.0, "s0", 0.0), (0, 1, -0.1, "s1", 0.1), (0, 2, 10.0, "s2", 0.0), (1, 0, 0.0, "s0", 0.0),
             (1, 1, 0.0, "s1", 0.0)]


def penalised_batch():
    rewards, group_ids, _ = turn_batch([r[:4] for r in PENALISED])
    steps = TurnSteps(torch.tensor([r[0] for r in PENALISED]), torch.tensor([r[1] for r in PENALISED]),
                      torch.tensor([r[2] for r in PENALISED]), tuple(r[3] for r in PENALISED),
                      torch.tensor([r[4] for r in PENALISED]))
    return rewards, group_ids, steps


def test_penalty_scope_episode_lowers_the_whole_episode_and_its_earlier_steps():
    """F_norm = 1, γ = 0.5, turn scope. R(τ_0) = 9.9 on its three rows, 0 on two: mean 5.94, A^E = 3.96 / -5.94.
    Returns: 2.45, 4.9, 10 | 0, 0 (the penalty reaches step 0, discounted): s0 ±1.225, s1 ±2.45, s2 alone 0."""
    rewards, group_ids, steps = penalised_batch()
    adv = gigpo(scale_by_std=False, gamma=0.5, episode_scope="turn").turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([5.185, 6.41, 3.96, -7.165, -8.39]))


def test_penalty_scope_step_lowers_only_the_malformed_row_as_verl_agent():
    """verl-agent's order: returns of the env's 10 alone, then the penalty off the malformed row. Episode values
    10, 9.9, 10 | 0, 0: mean 5.98, A^E = 4.02, 3.92, 4.02 / -5.98. Returns 2.5, 5 - 0.1, 10 | 0, 0: s0 ±1.25,
    s1 ±2.45, s2 0. Step 0 keeps its undiscounted-penalty-free return, and the winning step its full episode value."""
    rewards, group_ids, steps = penalised_batch()
    algo = gigpo(scale_by_std=False, gamma=0.5, episode_scope="turn", penalty_scope="step")
    torch.testing.assert_close(algo.turn_advantages(rewards, group_ids, steps),
                               torch.tensor([5.27, 6.37, 4.02, -7.23, -8.43]))
    grpo = algos.get("grpo", scale_by_std=False, episode_scope="turn", penalty_scope="step")
    torch.testing.assert_close(grpo.turn_advantages(rewards, group_ids, steps),
                               torch.tensor([4.02, 3.92, 4.02, -5.98, -5.98]))
    unpenalised = TurnSteps(steps.episode_ids, steps.step_index, steps.step_rewards, steps.anchors)
    assert torch.equal(algo.turn_advantages(rewards, group_ids, unpenalised),
                       gigpo(scale_by_std=False, gamma=0.5, episode_scope="turn").turn_advantages(
                           rewards, group_ids, unpenalised))  # no penalties reported: the two scopes agree


def test_episode_scope_turn_for_every_objective_is_its_advantage_over_turn_samples():
    """verl-agent's GRPO: the group's statistics over its turn-samples (10, 10, 10, 0, 0): mean 6, A = 4 / -6."""
    rewards, group_ids, steps = turn_batch()
    adv = algos.get("grpo", scale_by_std=False, episode_scope="turn").turn_advantages(rewards, group_ids, steps)
    torch.testing.assert_close(adv, torch.tensor([4.0, 4.0, 4.0, -6.0, -6.0]))


def test_turn_layout_scopes_are_checked():
    with pytest.raises(ValueError, match="penalty_scope step .* set episode_scope turn"):
        algos.get("grpo", penalty_scope="step")
    with pytest.raises(ValueError, match="episode_scope must be one of"):
        gigpo(episode_scope="episodes")
    with pytest.raises(ValueError, match="penalty_scope must be one of"):
        algos.get("gmpo", episode_scope="turn", penalty_scope="row")
    with pytest.raises(ValueError, match="penalties must be finite and >= 0"):
        TurnSteps(torch.arange(2), torch.zeros(2, dtype=torch.long), torch.zeros(2), ("a", "b"),
                  torch.tensor([-0.1, 0.0]))
