"""The learner part of the local trainer: a rollout batch prepared for the update (π_old and reference log-probs,
advantages and the objective's whole-batch statistics), then K epochs × mini-batches of whole groups, each
mini-batch's gradient accumulated exactly over micro-batches, with an MoE's routing replay and router losses.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from functools import partial
from typing import Any

import torch

import mmrl.algos as algos
from mmrl import moe
from mmrl.algos.base import kl_to_old, stats_for_rows
from mmrl.batch import Group, RolloutBatch, collate
from mmrl.run.config import TrainConfig
from mmrl.trainer.kl_band import hold_in_band
from mmrl.trainer.policy import Policy
from mmrl.trainer.rollout import ROW_BY_ROW_MIN_WIDTH, batch_logprobs, response_logprobs


def turn_steps(groups: list[Group]) -> algos.TurnSteps:
    """The turn layout's per-row facts (episode, step, step reward, anchor state) in ``collate``'s row order."""
    steps = [r.step for g in groups for r in g.responses]
    if any(s is None for s in steps):
        raise RuntimeError("turn layout: a response without its turn's step (episode, index, reward, anchor)")
    return algos.TurnSteps.of(steps)


@dataclasses.dataclass
class Learner:
    """The update of the policy from one rollout batch at a time (:meth:`prepare_batch`, then :meth:`update`)."""

    cfg: TrainConfig
    algo: algos.Algorithm
    policy: Policy
    ref_model: torch.nn.Module | None  # the frozen initial policy, when the objective or the KL metric reads it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    turn_layout: bool = False  # agent episodes train turn by turn (rollout.agent_layout turn)

    @property
    def row_by_row_min_width(self) -> int:
        """Re-scoring and the update score text batches this wide or wider one unpadded row at a time on the CPU
        (``optim.row_by_row``; mmrl.trainer.rollout.response_logprobs); 0 = always one padded batch. Never for an MoE,
        so that π_old, π_θ and the reference all see the batch its routing was recorded on."""
        return ROW_BY_ROW_MIN_WIDTH if self.cfg.optim.row_by_row and not self.policy.is_moe else 0

    def old_logprobs_from_update(self) -> bool:
        """π_old needs no forward of its own when the update's forward is at π_old's weights: one update per rollout,
        no replayed responses (GVPO), no routing to record (MoE), no KL-to-init metric, and an objective whose
        whole-batch statistics do not read π_old. TRL's GRPO does the same with ``num_iterations=1``."""
        o, r = self.cfg.optim, self.cfg.rollout
        return (o.epochs * o.minibatches == 1 and not r.replay_historical and not self.policy.is_moe
                and self.ref_model is None and not self.algo.batch_stats_reads_old_logprobs)

    def prepare_batch(self, groups: list[Group]) -> tuple[RolloutBatch, dict[str, Any]]:
        batch = collate(groups, self.policy.tokenizer.pad_token_id)
        temperature = self.cfg.rollout.temperature
        micro = self.cfg.optim.micro_batch_size or 64
        with self.policy.autocast():
            if not self.old_logprobs_from_update():  # else left None: update() takes its own detached log-probs
                batch.old_logprobs, batch.routing = batch_logprobs(self.policy.model, batch, temperature, micro,
                                                                   record_routing=self.policy.is_moe,
                                                                   row_by_row_min_width=self.row_by_row_min_width)
            if self.ref_model is not None:
                batch.ref_logprobs, _ = batch_logprobs(self.ref_model, batch, temperature, micro,
                                                       row_by_row_min_width=self.row_by_row_min_width)
        # per turn (turn layout): the episode's advantage, or the objective's own step-level one (GiGPO)
        steps = turn_steps(groups) if self.turn_layout else None
        batch.advantages, stats = self.algo.advantages_and_stats(batch.rewards, batch.group_ids, batch.old_logprobs,
                                                                 batch.response_mask, steps)
        return batch, stats

    def moe_forward(self, batch: RolloutBatch, rows: torch.Tensor, sub: RolloutBatch):
        """Training forward of an MoE: optional routing replay, router losses and routing metrics."""
        c = self.cfg.moe
        width = batch.input_ids.shape[1]
        hooks = moe.RouterHooks(self.policy.model, (len(rows), width),
                                replay=[r[rows] for r in batch.routing] if c.routing_replay else None,
                                capture_logits=c.aux_loss_coef > 0 or c.z_loss_coef > 0)
        with hooks.active():
            logprobs, entropy = response_logprobs(self.policy.model, batch, self.cfg.rollout.temperature,
                                                  with_entropy=True, rows=rows,
                                                  entropy_grad=self.algo.entropy_coef > 0)
        mask = sub.attention_mask
        natural = hooks.natural if c.routing_replay else hooks.routing
        extra_loss = torch.zeros((), device=logprobs.device)
        metrics = {"moe/routing_mismatch": moe.routing_mismatch(natural, sub.routing, mask)}
        metrics.update(moe.load_metrics(moe.expert_load(natural, self.policy.moe_experts, mask)))
        if c.aux_loss_coef > 0:
            aux = moe.load_balancing_loss(hooks.logits, self.policy.moe_top_k, sub.attention_mask)
            extra_loss = extra_loss + c.aux_loss_coef * aux
            metrics["moe/aux_loss"] = float(aux.detach())
        if c.z_loss_coef > 0:
            z = moe.z_loss(hooks.logits, sub.attention_mask)
            extra_loss = extra_loss + c.z_loss_coef * z
            metrics["moe/z_loss"] = float(z.detach())
        return logprobs, entropy, extra_loss, metrics

    def micro_batches(self, batch: RolloutBatch, groups: torch.Tensor) -> list[torch.Tensor]:
        """Rows of each micro-batch of a mini-batch: whole groups, at most ``micro_batch_size`` responses each
        (a larger group is a micro-batch of its own)."""
        limit = self.cfg.optim.micro_batch_size
        rows_of = [(batch.group_ids == g).nonzero().squeeze(1) for g in groups.tolist()]
        if not limit:
            return [torch.cat(rows_of)]
        if self.turn_layout and not self.algo.needs_whole_groups:
            # a game's group holds every turn of its episodes (hundreds for 50-step episodes); objectives whose loss
            # reads no group statistic take it in pieces, still exact under the loss-mass weights
            return list(torch.cat(rows_of).split(limit))
        out, current = [], []
        for rows in rows_of:
            if current and sum(len(r) for r in current) + len(rows) > limit:
                out.append(torch.cat(current))
                current = []
            current.append(rows)
        return out + [torch.cat(current)]

    @property
    def router_losses(self) -> bool:
        """An MoE trained with a router loss (``moe.aux_loss_coef`` / ``moe.z_loss_coef``): a mini-batch has loss to
        step on even when no response token carries any."""
        return self.policy.is_moe and (self.cfg.moe.aux_loss_coef > 0 or self.cfg.moe.z_loss_coef > 0)

    def update(self, batch: RolloutBatch, stats: dict[str, Any], step: int) -> dict[str, float]:
        """K epochs over mini-batches of whole groups; one optimizer step per mini-batch, its gradient accumulated
        over micro-batches (:meth:`accumulate`). A step whose loss or gradient is not finite is skipped. With
        ``optim.target_kl`` each step is held inside the KL band (mmrl.trainer.kl_band), and a step that had to be
        shrunk ends the rollout step's updates. Ends with the KL of the updated policy to π_old over the batch.
        ``step``: the steps done before it (it seeds the mini-batch order)."""
        o = self.cfg.optim
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        order_rng = torch.Generator().manual_seed(self.cfg.run.seed * 1_000_003 + step)
        n_groups = int(batch.group_ids.max()) + 1
        sums: Counter[str] = Counter()
        updates = skipped = 0
        # one update with no π_old forward of its own: π_old is the update forward's detached log-probs, kept here
        old = batch.old_logprobs if batch.old_logprobs is not None else torch.zeros_like(batch.response_mask)
        stopped = False
        for _ in range(o.epochs):
            if stopped:
                break
            for chunk in torch.randperm(n_groups, generator=order_rng).chunk(o.minibatches):
                micro = self.micro_batches(batch, chunk)
                masses = [self.algo.loss_mass(batch.response_mask[r], batch.group_ids[r]) for r in micro]
                if sum(masses) == 0 and not self.router_losses:
                    continue  # nothing in this mini-batch carries loss (e.g. only empty responses)
                finite, step_metrics = self.accumulate(batch, stats, micro, masses, old)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, o.grad_clip) if finite else None
                if grad_norm is None or not torch.isfinite(grad_norm):
                    self.optimizer.zero_grad(set_to_none=True)  # NaN/inf never reaches the optimizer
                    skipped += 1
                    continue
                # the rate this update steps with (the scheduler's last rate once it has stepped is the next one's)
                sums.update({"lr": self.optimizer.param_groups[0]["lr"]})
                before = [p.detach().clone() for p in params] if o.target_kl else None
                self.optimizer.step()
                self.scheduler.step()
                updates += 1
                sums.update(step_metrics)
                sums.update({"grad_norm": float(grad_norm)})
                if before is not None:
                    rows = torch.cat(micro)
                    band = hold_in_band(params, before, partial(self.measure_kl, batch, old, rows), o.target_kl,
                                        o.kl_halvings)
                    sums.update({"kl_halvings": float(band.halvings), "kl_undone": float(band.undone)})
                    if band.halvings or band.undone:  # at the band's edge: further steps would only push on it
                        stopped = True
                        break
        out = {k: v / max(updates, 1) for k, v in sums.items()}
        out.update(updates=float(updates), skipped_updates=float(skipped))
        if o.target_kl:
            out["kl_early_stop"] = float(stopped)
        out["kl_step"], out["kl_step_max"] = self.measure_kl(batch, old, torch.arange(batch.size))
        # the sampler-trainer gap of the step's tokens, and what the rollout correction made of it
        out.update(self.cfg.algo.correction().metrics(old, batch.rollout_logprobs, batch.response_mask))
        return out

    def measure_kl(self, batch: RolloutBatch, old: torch.Tensor, rows: torch.Tensor) -> tuple[float, float]:
        """(mean, max) per-token k3 KL(π_θ || π_old) of the current weights on the trained tokens of ``rows``: one
        forward without gradient."""
        sub = batch.select(rows)
        with torch.no_grad(), self.policy.autocast():
            logprobs, _ = batch_logprobs(self.policy.model, sub, self.cfg.rollout.temperature,
                                         self.cfg.optim.micro_batch_size or 64,
                                         row_by_row_min_width=self.row_by_row_min_width)
        return kl_to_old(logprobs, old[rows], sub.response_mask)

    def accumulate(self, batch: RolloutBatch, stats: dict[str, Any], micro: list[torch.Tensor],
                   masses: list[float], old: torch.Tensor | None = None) -> tuple[bool, Counter[str]]:
        """The gradient of one mini-batch, accumulated exactly over its micro-batches (``micro``: the rows of each;
        ``masses``: each one's ``algo.loss_mass``) into the parameters' ``.grad``, for one optimizer step.

        Each micro-batch's loss is weighted by its share of the mini-batch's loss mass, its router losses by its
        share of rows, so the sum is the whole mini-batch's gradient; the metrics are weighted alike. Returns
        (finite, metrics); (False, nothing) at the first non-finite loss, with part of the gradient accumulated.
        Without π_old log-probs in ``batch`` (one update per rollout), the update's own are written into ``old``.
        """
        total, n_rows = sum(masses), sum(len(r) for r in micro)
        self.optimizer.zero_grad(set_to_none=True)
        metrics: Counter[str] = Counter()
        for rows, mass in zip(micro, masses, strict=True):
            sub = batch.select(rows).to(self.policy.device)
            loss, router_loss, entropy, micro_metrics = self.micro_batch_loss(batch, rows, sub, stats, old)
            if not (torch.isfinite(loss) and torch.isfinite(torch.as_tensor(router_loss))):
                return False, Counter()
            share = mass / total if total else 0.0
            (loss * share + router_loss * (len(rows) / n_rows)).backward()
            mask = sub.response_mask
            token_entropy = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
            metrics.update({k: v * share for k, v in micro_metrics.items()})
            metrics.update({"loss": float(loss.detach()) * share, "entropy": token_entropy * share})
        return True, metrics

    def micro_batch_loss(self, batch: RolloutBatch, rows: torch.Tensor, sub: RolloutBatch, stats: dict[str, Any],
                         old_out: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | float, torch.Tensor, dict[str, float]]:
        """The training forward of the ``rows`` of ``batch`` (``sub``: those rows on the device) and its losses:
        (the objective's loss with its entropy bonus, the MoE router losses (0.0 for a dense model), the token
        entropy ``[B, T]``, metrics)."""
        router_loss, router_metrics = 0.0, {}
        with self.policy.autocast():
            if self.policy.is_moe:
                logprobs, entropy, router_loss, router_metrics = self.moe_forward(batch, rows, sub)
            else:
                logprobs, entropy = response_logprobs(self.policy.model, batch, self.cfg.rollout.temperature,
                                                      with_entropy=True, rows=rows,
                                                      row_by_row_min_width=self.row_by_row_min_width,
                                                      entropy_grad=self.algo.entropy_coef > 0)
        old = logprobs.detach() if sub.old_logprobs is None else sub.old_logprobs
        if sub.old_logprobs is None and old_out is not None:
            old_out[rows] = old.float().cpu()
        # rollout correction (algo.rollout_correction): each token's gradient weighted by its sampler-trainer ratio
        corrected = self.cfg.algo.correction().apply(logprobs, old, sub.rollout_logprobs, sub.response_mask)
        loss, metrics = self.algo.policy_loss(
            logprobs=corrected, old_logprobs=old, advantages=sub.advantages, mask=sub.response_mask,
            group_ids=sub.group_ids, ref_logprobs=sub.ref_logprobs, stats=stats_for_rows(stats, rows))
        metrics = {**metrics, **router_metrics}
        if self.algo.entropy_coef > 0:  # every objective: -coef × entropy, averaged as its loss
            bonus = self.algo.entropy_bonus(entropy, sub.response_mask.to(entropy.device), sub.group_ids)
            loss = loss + bonus
            metrics["entropy_bonus"] = float(bonus.detach())
        return loss, router_loss, entropy, metrics
