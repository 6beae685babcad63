"""The local trainer's update is exact gradient accumulation: ``Trainer.update`` moves the weights bit for bit as a
plain loop written out below does (K epochs × mini-batches of whole groups; per mini-batch the micro-batches' losses
weighted by their share of the objective's loss mass, summed by backward, clipped, one AdamW step; a non-finite loss
skips the mini-batch)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from mmrl.algos.base import kl_k3, stats_for_rows
from mmrl.trainer.kl_band import BandedStep, hold_in_band
from mmrl.trainer.local import build_trainer
from mmrl.trainer.rollout import batch_logprobs, response_logprobs

MOE = "embedded:tiny-qwen3-moe"
# 6 groups of 4 responses; 2 mini-batches of 3 groups, each a micro-batch of 2 groups and one of 1 (unequal shares);
# 2 epochs: 4 optimizer steps per update
ACCUMULATING = {"rollout.prompts_per_step": 6, "optim.minibatches": 2, "optim.micro_batch_size": 8, "optim.epochs": 2,
                "optim.lr": 1e-3, "run.steps": 2}


def plain_micro_batches(batch, groups: torch.Tensor, limit: int) -> list[torch.Tensor]:
    """Whole groups packed in order into micro-batches of at most ``limit`` rows."""
    out, current = [], []
    for g in groups.tolist():
        rows = (batch.group_ids == g).nonzero().squeeze(1)
        if current and sum(len(r) for r in current) + len(rows) > limit:
            out.append(torch.cat(current))
            current = []
        current.append(rows)
    return out + [torch.cat(current)]


def plain_update(trainer, batch, stats) -> dict[str, float]:
    """One rollout batch's optimizer steps, written as one loop."""
    cfg, algo, model = trainer.cfg, trainer.algo, trainer.model
    o = cfg.optim
    params = [p for p in model.parameters() if p.requires_grad]
    order = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + trainer.step)
    n_groups = int(batch.group_ids.max()) + 1
    sums: Counter[str] = Counter()
    updates = skipped = 0
    for _ in range(o.epochs):
        for chunk in torch.randperm(n_groups, generator=order).chunk(o.minibatches):
            micro = plain_micro_batches(batch, chunk, o.micro_batch_size)
            masses = [algo.loss_mass(batch.response_mask[r], batch.group_ids[r]) for r in micro]
            total = sum(masses)
            n_rows = sum(len(r) for r in micro)
            trainer.optimizer.zero_grad(set_to_none=True)
            step_metrics: Counter[str] = Counter()
            finite = True
            for rows, mass in zip(micro, masses, strict=True):
                sub = batch.select(rows)
                router_loss, router_metrics = 0.0, {}
                with trainer.policy.autocast():
                    if trainer.policy.is_moe:
                        logprobs, entropy, router_loss, router_metrics = trainer.learner.moe_forward(batch, rows, sub)
                    else:
                        logprobs, entropy = response_logprobs(
                            model, batch, cfg.rollout.temperature, with_entropy=True, rows=rows,
                            row_by_row_min_width=trainer.learner.row_by_row_min_width,
                            entropy_grad=algo.entropy_coef > 0)
                assert sub.old_logprobs is not None  # several updates per rollout: π_old is scored before them
                loss, metrics = algo.policy_loss(logprobs=logprobs, old_logprobs=sub.old_logprobs,
                                                 advantages=sub.advantages, mask=sub.response_mask,
                                                 group_ids=sub.group_ids, ref_logprobs=sub.ref_logprobs,
                                                 stats=stats_for_rows(stats, rows))
                metrics = {**metrics, **router_metrics}
                if algo.entropy_coef > 0:
                    bonus = algo.entropy_bonus(entropy, sub.response_mask, sub.group_ids)
                    loss = loss + bonus
                    metrics["entropy_bonus"] = float(bonus.detach())
                if not (torch.isfinite(loss) and torch.isfinite(torch.as_tensor(router_loss))):
                    finite = False
                    break
                share = mass / total
                (loss * share + router_loss * (len(rows) / n_rows)).backward()
                mask = sub.response_mask
                token_entropy = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
                step_metrics.update({k: v * share for k, v in metrics.items()})
                step_metrics.update({"loss": float(loss.detach()) * share, "entropy": token_entropy * share})
            if not finite:
                trainer.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            grad_norm = torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
            if not torch.isfinite(grad_norm):
                trainer.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            sums.update({"lr": trainer.optimizer.param_groups[0]["lr"]})  # the rate this update steps with
            trainer.optimizer.step()
            trainer.scheduler.step()
            updates += 1
            sums.update(step_metrics)
            sums.update({"grad_norm": float(grad_norm)})
    out = {k: v / max(updates, 1) for k, v in sums.items()}
    out.update(updates=float(updates), skipped_updates=float(skipped))
    # the updated policy's k3 KL to π_old on every trained token of the batch
    with torch.no_grad(), trainer.policy.autocast():
        now, _ = batch_logprobs(model, batch, cfg.rollout.temperature, o.micro_batch_size or 64,
                                row_by_row_min_width=trainer.learner.row_by_row_min_width)
    kl = kl_k3(now.float(), batch.old_logprobs.float())[batch.response_mask > 0]
    out.update(kl_step=float(kl.mean()), kl_step_max=float(kl.max()))
    # the sampler-trainer gap of the batch (off by default: no weight reaches the loss above)
    out.update(cfg.algo.correction().metrics(batch.old_logprobs, batch.rollout_logprobs, batch.response_mask))
    return out


def fixed_batch(trainer, poison_group: int | None):
    """A rollout batch with spread-out advantages (every group carries signal); ``poison_group``'s are NaN."""
    batch, stats = trainer.prepare_batch(trainer.collect_rollouts()[0])
    batch.advantages = torch.randn(batch.size, generator=torch.Generator().manual_seed(7))
    if poison_group is not None:
        batch.advantages[batch.group_ids == poison_group] = float("nan")
    return batch, stats


def two_updates(trainer, batch, stats, update) -> tuple[list[dict[str, float]], list[torch.Tensor]]:
    metrics = []
    for step in (0, 1):
        trainer.step = step
        metrics.append(update(trainer, batch, stats))
    return metrics, [p.detach().clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("case", ["text", "non-finite", "moe"])
def test_update_accumulates_micro_batches_as_the_plain_loop(tmp_path, small_config, case):
    # a token-level loss mass: micro-batches weigh what their response tokens do
    overrides = {**ACCUMULATING, "algo.kl_coef": 0.04, "algo.entropy_coef": 0.01, "algo.loss_agg": "token_mean"}
    if case == "moe":
        overrides = {**ACCUMULATING, "model.name": MOE, "task.name": "countdown", "moe.aux_loss_coef": 0.01}
    trainer = build_trainer(small_config(tmp_path, **overrides))
    batch, stats = fixed_batch(trainer, poison_group=1 if case == "non-finite" else None)
    start = [copy.deepcopy(x.state_dict()) for x in (trainer.model, trainer.optimizer, trainer.scheduler)]
    before = [p.detach().clone() for p in trainer.model.parameters()]

    got, after = two_updates(trainer, batch, stats, lambda t, b, s: t.update(b, s))
    for x, state in zip((trainer.model, trainer.optimizer, trainer.scheduler), start, strict=True):
        x.load_state_dict(copy.deepcopy(state))
    expected, plain_after = two_updates(trainer, batch, stats, plain_update)

    assert got == expected
    assert all(torch.equal(a, b) for a, b in zip(after, plain_after, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))  # the updates moved the weights
    skipped = 2.0 if case == "non-finite" else 0.0  # the poisoned group's mini-batch, once per epoch
    assert [m["skipped_updates"] for m in got] == [skipped, skipped]
    assert [m["updates"] for m in got] == [4.0 - skipped, 4.0 - skipped]
    if case == "moe":
        assert "moe/aux_loss" in got[0]


# a rate far above the task's: one Adam step moves the tiny model's policy well past any band worth keeping
LOUD = {"optim.lr": 0.003, "optim.epochs": 2, "rollout.temperature": 1.0}


@pytest.mark.parametrize("target", [0.0, 0.01])
def test_target_kl_keeps_each_step_inside_the_band(tmp_path, small_config, target):
    trainer = build_trainer(small_config(tmp_path, **LOUD, **{"optim.target_kl": target}))
    batch, stats = fixed_batch(trainer, poison_group=None)
    got = trainer.update(batch, stats)
    if not target:  # without the band the same update leaves it: the check below can fail
        assert got["kl_step"] > 0.01 and "kl_halvings" not in got
        return
    assert 0 < got["kl_step"] <= target
    assert got["kl_halvings"] > 0 and got["kl_early_stop"] == 1.0
    assert got["updates"] < 2.0  # the step that had to be shrunk ended the rollout step's updates


def test_one_update_measures_kl_against_its_own_pi_old(tmp_path, small_config):
    # one update, no reference: π_old is the update forward's own log-probs, not a separate rescoring
    trainer = build_trainer(small_config(tmp_path, **{"optim.lr": 0.01}))
    assert trainer.learner.old_logprobs_from_update()
    batch, stats = fixed_batch(trainer, poison_group=None)
    assert batch.old_logprobs is None
    with torch.no_grad(), trainer.policy.autocast():
        before, _ = batch_logprobs(trainer.model, batch, trainer.cfg.rollout.temperature)
    got = trainer.update(batch, stats)
    with torch.no_grad(), trainer.policy.autocast():
        after, _ = batch_logprobs(trainer.model, batch, trainer.cfg.rollout.temperature)
    kl = kl_k3(after, before)[batch.response_mask > 0]
    assert got["kl_step"] > 0
    assert got["kl_step"] == pytest.approx(float(kl.mean()), rel=1e-4, abs=1e-7)
    assert got["kl_step_max"] == pytest.approx(float(kl.max()), rel=1e-4, abs=1e-7)


def test_hold_in_band_halves_then_undoes_the_step():
    start = torch.zeros(3)
    p = torch.full((3,), 8.0)  # the step taken: +8 on each weight
    measure = lambda: (float(p.abs().max()), float(p.abs().sum()))  # noqa: E731  "KL" = how far the weights moved
    kept = hold_in_band([p], [start], measure, target=2.0, max_halvings=4)
    assert kept == BandedStep(2.0, 6.0, 2, False) and torch.equal(p, torch.full((3,), 2.0))
    p.fill_(8.0)
    undone = hold_in_band([p], [start], measure, target=0.1, max_halvings=3)
    assert undone == BandedStep(0.0, 0.0, 3, True) and torch.equal(p, start)
