"""The policy actor: OpenRLHF's ``PolicyModelActor`` and ``ActorPPOTrainer`` with mmrl's objective.

``MmrlPolicyModelActor`` subclasses the plain class behind ``PolicyModelActor`` (``__ray_actor_class__``) and is
re-wrapped with ``ray.remote``; after OpenRLHF has built the DeepSpeed engine, the tokenizer and its
``ActorPPOTrainer``, the trainer instance is re-classed to ``MmrlActorPPOTrainer`` (its ``__init__`` opens the weight
sync group to the vLLM engines, so it must run exactly once) and given mmrl's loss.

``MmrlActorPPOTrainer.ppo_train`` replaces OpenRLHF's loop over shuffled single samples:

1. the rank's samples are cut into micro-batches of whole groups (``grouping.whole_group_micro_batches``);
2. for each optimizer step (``gas`` micro-batches) one all-reduce sums ``[loss mass, tokens, samples]`` over its
   micro-batches on every rank; each micro-batch's loss is weighted by ``mass / M · dp · gas``, which makes the update
   the exact ``loss_mass``-weighted objective of the whole step (:func:`~mmrl.openrlhf.grouping.loss_scale`);
3. OpenRLHF's own ``training_step`` does the forward, backward and DeepSpeed step (MoE aux loss, EMA, logging
   included) with OpenRLHF's KL term off (``kl_ctl = 0``): mmrl's objective adds its own KL when it has one.

In the agent turn layout a step's rows vary in number, so ranks may hold different numbers of micro-batches: every
rank runs the most any rank has, rounded up to whole optimizer steps, the missing ones idle (a copy of its last
micro-batch with no trained token and loss weight 0), so that DeepSpeed's collectives and optimizer steps line up.

Communication added per optimizer step: one all-reduce of 3 floats (OpenRLHF's own loop does two of 1 float), and
one all-reduce of 1 number per epoch (the micro-batch count).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import ray
import torch
import torch.distributed as dist
from openrlhf.trainer.ppo_utils.experience import make_experience_batch
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor

import mmrl.algos as algos
from mmrl.algos.rollout_correction import RolloutCorrection
from mmrl.openrlhf.grouping import (
    GROUP_KEY,
    ROW_STATS_PREFIX,
    STATS_PREFIX,
    loss_scale,
    padded_count,
    whole_group_micro_batches,
)
from mmrl.openrlhf.loss import MicroBatch, MmrlPolicyLoss
from mmrl.openrlhf.spec import ActorSpec


def _device() -> torch.device | int:
    return torch.cuda.current_device() if torch.cuda.is_available() else torch.device("cpu")


def _dp_group(strategy):
    mesh = getattr(strategy, "ds_device_mesh", None)
    return mesh["dp"].get_group() if mesh is not None else None


def _all_reduce_sum(values: list[float], strategy, op=dist.ReduceOp.SUM) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=op, group=_dp_group(strategy))
    return t.tolist()


def _per_sample(value) -> torch.Tensor:
    """An ``info`` entry as a ``[B]`` tensor: OpenRLHF's replay buffer re-batches per-sample tensors as lists."""
    if isinstance(value, list):
        return torch.stack([torch.as_tensor(v).reshape(()) for v in value])
    return value.reshape(-1)


def pop_mmrl_fields(experience) -> tuple[torch.Tensor, dict[str, Any]]:
    """Remove mmrl's bookkeeping from ``experience.info`` (so OpenRLHF does not log it): (group ids, statistics:
    whole-batch ones as numbers, row statistics as this micro-batch's ``[B]`` values)."""
    group_ids = _per_sample(experience.info.pop(GROUP_KEY)).long()
    stats: dict[str, Any] = {}
    for key in [k for k in experience.info if k.startswith(STATS_PREFIX)]:
        stats[key[len(STATS_PREFIX):]] = float(_per_sample(experience.info.pop(key))[0])
    for key in [k for k in experience.info if k.startswith(ROW_STATS_PREFIX)]:
        stats[key[len(ROW_STATS_PREFIX):]] = _per_sample(experience.info.pop(key)).to(torch.float64)
    return group_ids, stats


class MmrlActorPPOTrainer(ActorPPOTrainer):
    """Never constructed directly: :func:`adopt` re-classes the instance OpenRLHF built."""

    algo: algos.Algorithm
    actor_loss_fn: MmrlPolicyLoss

    def setup_mmrl(self, spec: ActorSpec) -> None:
        self.algo = algos.get(spec.algo, **spec.params)
        self.actor_loss_fn = MmrlPolicyLoss(self.algo, RolloutCorrection(**spec.rollout_correction))
        self.mmrl_epoch_seed = int(self.args.train.seed)
        self.mmrl_target_kl = spec.target_kl

    def micro_batches(self, items: list, generator: torch.Generator, count: int | None = None) -> list:
        """Micro-batches of whole groups; ``count`` > their number: idle ones (no trained token) fill up to it."""
        group_ids = [int(_per_sample(it.info[GROUP_KEY])[0]) for it in items]
        cuts = whole_group_micro_batches(group_ids, self.micro_train_batch_size, generator)
        batches = [make_experience_batch([items[i] for i in idx]) for idx in cuts]
        for _ in range(len(cuts), count or 0):
            idle = make_experience_batch([items[i] for i in cuts[-1]])
            idle.action_mask = torch.zeros_like(idle.action_mask)
            batches.append(idle)
        return batches

    def ppo_train(self, kl_ctl: float = 0.0) -> dict[str, float]:
        gas = max(int(self.strategy.accumulated_gradient), 1)
        dp = dist.get_world_size(group=_dp_group(self.strategy)) if dist.is_initialized() else 1
        generator = torch.Generator().manual_seed(self.mmrl_epoch_seed)
        self.mmrl_epoch_seed += 1
        sums: dict[str, float] = defaultdict(float)
        weight = objective = total = 0.0
        step = 0
        norms: list[float] = []
        kl_max = 0.0
        stopped = False
        items = list(self.replay_buffer.items)
        own = len(whole_group_micro_batches([int(_per_sample(it.info[GROUP_KEY])[0]) for it in items],
                                            self.micro_train_batch_size))
        count = padded_count(int(_all_reduce_sum([own], self.strategy, dist.ReduceOp.MAX)[0]), gas)
        for _ in range(self.max_epochs):
            if stopped:
                break
            batches = self.micro_batches(items, generator, count)
            for start in range(0, len(batches), gas):
                window = batches[start:start + gas]
                fields = [pop_mmrl_fields(e) for e in window]
                real = [start + j < own for j in range(len(window))]  # the rest are idle
                masses = [self.algo.loss_mass(e.action_mask.float(), g) if r else 0.0
                          for e, (g, _), r in zip(window, fields, real, strict=True)]
                local = [sum(masses), sum(float(e.action_mask.sum()) for e in window),
                         sum(float(e.action_mask.shape[0]) for e, r in zip(window, real, strict=True) if r)]
                total_mass, tokens, samples = _all_reduce_sum(local, self.strategy)
                norm = {"dp_size": dp, "batch_num_tokens": torch.tensor(tokens / gas, device=_device()),
                        "global_batch_size": torch.tensor(samples / gas, device=_device())}
                window_kl = [0.0, 0.0]  # token-weighted k3 KL to π_old of the window's forwards: sum, tokens
                for experience, (group_ids, stats), mass, is_real in zip(window, fields, masses, real, strict=True):
                    experience.to_device(_device())
                    self.actor_loss_fn.bind(MicroBatch(group_ids, stats, loss_scale(mass, total_mass, dp, gas),
                                                       experience.base_action_log_probs))
                    status = self.training_step(experience, 0.0, step, norm)  # OpenRLHF's KL term off: see above
                    step += 1
                    last = status["metrics"]
                    if not is_real:
                        continue
                    kl_max = max(kl_max, self.actor_loss_fn.last_kl_max)
                    trained = float(experience.action_mask.sum())
                    window_kl[0] += self.actor_loss_fn.last_metrics.get("kl_old", 0.0) * trained
                    window_kl[1] += trained
                    n = float(experience.action_mask.shape[0])
                    values = {k: float(v.float().mean()) if isinstance(v, torch.Tensor) else float(v)
                              for k, v in status["metrics"].items()
                              if status["weights"].get(k) is not None and k != "policy_loss"}
                    values.update({f"mmrl/{k}": v for k, v in self.actor_loss_fn.last_metrics.items()})
                    for k, v in values.items():
                        sums[k] += v * n
                    weight += n
                    # the objective itself, weighted by its loss mass: the whole step's value of the objective
                    objective += float(self.actor_loss_fn.last_loss) * mass
                    total += mass
                # the window's last micro-step is its optimizer step; DeepSpeed's global norm is the same on every
                # rank. OpenRLHF reports only the step's last norm; the mean over all of them is the local backend's
                # `grad_norm`, and shows a gradient even when the last mini-batch's groups had none.
                if "actor_grad_norm" in last:
                    norms.append(float(last["actor_grad_norm"]))
                if self.mmrl_target_kl > 0:
                    # optim.target_kl: the window's forwards measured the weights its step started from; past the
                    # band, the step's remaining updates are skipped (ZeRO shards the weights, so the local
                    # backend's halving of the step is not done here). Every rank stops together.
                    kl_sum, kl_tokens = _all_reduce_sum(window_kl, self.strategy)
                    if kl_sum / max(kl_tokens, 1.0) > self.mmrl_target_kl:
                        stopped = True
                        break
        keys = sorted(sums)
        reduced = _all_reduce_sum([sums[k] for k in keys] + [objective, total, weight], self.strategy)
        out = {k: v / max(reduced[-1], 1.0) for k, v in zip(keys, reduced[:-3], strict=True)}
        out["policy_loss"] = reduced[-3] / reduced[-2] if reduced[-2] > 0 else 0.0
        if step:
            out.update({k: float(last[k]) for k in ("actor_lr", "actor_grad_norm") if k in last})
        if norms:
            out["mmrl/grad_norm"] = sum(norms) / len(norms)
        out["mmrl/kl_old_max"] = _all_reduce_sum([kl_max], self.strategy, dist.ReduceOp.MAX)[0]
        if self.mmrl_target_kl > 0:
            out["mmrl/kl_early_stop"] = float(stopped)
        return out


def adopt(trainer: ActorPPOTrainer, spec: ActorSpec) -> MmrlActorPPOTrainer:
    """Turn the ``ActorPPOTrainer`` OpenRLHF built into mmrl's (same state, mmrl's loss and loop)."""
    if type(trainer) is not ActorPPOTrainer:
        raise TypeError(f"expected OpenRLHF's ActorPPOTrainer, got {type(trainer).__name__}")
    trainer.__class__ = MmrlActorPPOTrainer
    trainer.setup_mmrl(spec)
    return trainer


class MmrlPolicyModelActor(PolicyModelActor.__ray_actor_class__):
    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        adopt(self.trainer, strategy.args.mmrl)

    def describe(self) -> dict[str, Any]:
        """Where this rank runs (logged by the driver at start)."""
        return {"rank": self._rank, "world_size": self._world_size, "node": self._get_current_node_ip(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "class": type(self).__name__}


MmrlPolicyModelRayActor = ray.remote(num_gpus=1)(MmrlPolicyModelActor)
