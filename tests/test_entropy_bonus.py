"""The entropy bonus ``algo.entropy_coef``: every objective declares it, averages it as its own loss (so gradient
accumulation stays exact), and the local trainer's update ascends the policy's entropy with it."""

from __future__ import annotations

import pytest
import torch

import mmrl.algos as algos
from mmrl.trainer.local import build_trainer
from mmrl.trainer.rollout import response_logprobs


@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_every_objective_has_the_bonus_and_accumulates_it_exactly(name):
    assert algos.hyperparameters(name)["entropy_coef"] == 0.0
    extra = {"max_tokens": 8} if "max_tokens" in algos.hyperparameters(name) else {}
    algo = algos.get(name, entropy_coef=0.5, **extra)
    gen = torch.Generator().manual_seed(1)
    entropy = torch.rand(6, 5, generator=gen)
    mask = torch.ones(6, 5)
    mask[0, 3:], mask[3, 1:], mask[5, 4:] = 0, 0, 0
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])
    whole = algo.entropy_bonus(entropy, mask, group_ids)
    # micro-batches of whole groups, weighted by their share of the objective's loss mass (as every trainer does)
    parts = [torch.tensor([0, 1]), torch.tensor([2, 3, 4, 5])]
    masses = [algo.loss_mass(mask[p], group_ids[p]) for p in parts]
    accumulated = sum(algo.entropy_bonus(entropy[p], mask[p], group_ids[p]) * m / sum(masses)
                      for p, m in zip(parts, masses, strict=True))
    torch.testing.assert_close(accumulated, whole)
    assert float(whole) < 0  # a bonus: minimising the loss raises the entropy
    assert float(algos.get(name, **extra).entropy_bonus(entropy, mask, group_ids)) == 0.0


def test_token_mean_objectives_average_the_entropy_over_tokens():
    entropy, mask = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    group_ids = torch.tensor([0, 0])
    token_mean = algos.get("gigpo", entropy_coef=0.1).entropy_bonus(entropy, mask, group_ids)
    torch.testing.assert_close(token_mean, torch.tensor(-0.1 * 6 / 3))
    per_response = algos.get("grpo", entropy_coef=0.1).entropy_bonus(entropy, mask, group_ids)
    torch.testing.assert_close(per_response, torch.tensor(-0.1 * (2.0 + 2.0) / 2))
    with pytest.raises(ValueError, match="entropy_coef must be >= 0"):
        algos.get("gmpo", entropy_coef=-0.1)


def _batch_entropy(trainer, batch) -> float:
    with torch.no_grad():
        _, entropy = response_logprobs(trainer.model, batch, trainer.cfg.rollout.temperature, with_entropy=True)
    mask = batch.response_mask
    return float((entropy * mask).sum() / mask.sum())


@pytest.mark.parametrize("coef", [0.0, 1.0])
def test_the_update_ascends_the_entropy_only_with_the_bonus(tmp_path, embedded_model_dir, small_config, coef):
    """With every advantage 0 the policy term has no gradient: the bonus alone moves the weights, up the entropy."""
    trainer = build_trainer(small_config(tmp_path, **{"algo.entropy_coef": coef, "run.steps": 1, "optim.lr": 1e-3}))
    groups, _ = trainer.collect_rollouts()
    batch, stats = trainer.prepare_batch(groups)
    batch.advantages = torch.zeros_like(batch.advantages)
    before_weights = [p.detach().clone() for p in trainer.model.parameters()]
    before = _batch_entropy(trainer, batch)
    metrics = trainer.update(batch, stats)
    after = _batch_entropy(trainer, batch)
    moved = any(not torch.equal(a, b) for a, b in zip(before_weights, trainer.model.parameters(), strict=True))
    if coef:
        assert moved and after > before and metrics["entropy_bonus"] < 0
    else:
        assert not moved and "entropy_bonus" not in metrics
