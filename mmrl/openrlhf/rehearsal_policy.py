"""The rehearsal's policy actor: mmrl's policy actor, recording what a CPU rehearsal is meant to show.

Beside the run's ``metrics.jsonl`` and checkpoints, each policy rank writes under ``<run>/rehearsal/``:

* ``policy_weights.jsonl`` (rank 0): the digest of the weights it syncs, at start (``sync 0``) and after each
  broadcast to the rollout actors, to compare with the actors' ``rollout_weights.jsonl`` (both count syncs from 0
  in each process, so a resumed run starts a new ``sync 0`` sequence; ``step`` is the policy's global step);
* ``objective.jsonl`` (rank 0, a line per process): the objective the policy's loss function calls (name and every
  hyper-parameter), to check that a recipe's objective is the one that trained;
* ``rank{r}_step{k}.pt``: the experiences OpenRLHF shipped to this rank for rollout step ``k`` (group ids, rewards,
  advantages, π_old log-probs, tokens, masks and the whole-batch statistics mmrl's experience maker attached), so
  that the statistics each rank trains with can be checked against the local trainer's on the whole step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import deepspeed
import ray
import torch

from mmrl.openrlhf.actor import MmrlPolicyModelActor
from mmrl.openrlhf.grouping import GROUP_KEY, ROW_STATS_PREFIX, STATS_PREFIX
from mmrl.openrlhf.rehearsal import LOG_DIR, append_record, weights_digest


def synced_names(actor) -> list[str]:
    """The parameters OpenRLHF's ``broadcast_to_vllm`` sends (a VLM's frozen vision tower is left out)."""
    model = actor.model.module
    return [n for n, p in model.named_parameters() if p.requires_grad or not getattr(actor, "is_vlm", False)]


class RehearsalPolicyModelActor(MmrlPolicyModelActor):
    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        self.run_dir = str(Path(strategy.args.ckpt.path).parent)
        # counted from the checkpoint's step on --resume, so that a resumed run's files continue the numbering
        self.rehearsal_step = int(self.checkpoint_states.get("global_step", 0))
        self.rehearsal_syncs, self.received = 0, []
        self._record_weights()
        if self._rank == 0:  # the objective the loss function calls, as the actor built it from the driver's spec
            loss_algo = self.trainer.actor_loss_fn.algo
            append_record(self.run_dir, "objective.jsonl", {"algo": loss_algo.name,
                                                             "params": dataclasses.asdict(loss_algo)})

    def _record_weights(self) -> None:
        """Called on every rank: under ZeRO-3 each rank holds a shard, and gathering the whole parameters (what
        ``broadcast_to_vllm`` sends) is collective; rank 0 writes the digest."""
        model, names = self.actor.model.module, synced_names(self.actor)
        params = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters([params[n] for n in names]):  # no-op below ZeRO-3
            if self._rank == 0:
                append_record(self.run_dir, "policy_weights.jsonl", {
                    "sync": self.rehearsal_syncs, "step": self.rehearsal_step,
                    "digest": weights_digest(model, names)})

    def broadcast_to_vllm(self):
        super().broadcast_to_vllm()
        self.rehearsal_syncs += 1
        self._record_weights()

    def append(self, experience):
        self.received.append({
            "group_ids": experience.info[GROUP_KEY].reshape(-1).clone(),
            "rewards": experience.rewards.reshape(-1).clone(),
            "advantages": experience.advantages.clone(),
            "old_logprobs": experience.action_log_probs.clone(),
            "sequences": experience.sequences.clone(), "attention_mask": experience.attention_mask.clone(),
            "action_mask": experience.action_mask.clone(),
            "stats": {k[len(STATS_PREFIX):]: v.reshape(-1).clone() for k, v in experience.info.items()
                      if k.startswith(STATS_PREFIX)},
            "row_stats": {k[len(ROW_STATS_PREFIX):]: v.reshape(-1).clone() for k, v in experience.info.items()
                          if k.startswith(ROW_STATS_PREFIX)}})
        super().append(experience)

    def fit(self, kl_ctl: float = 0):
        self.rehearsal_step += 1
        path = Path(self.run_dir) / LOG_DIR / f"rank{self._rank}_step{self.rehearsal_step}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.received, path)
        self.received = []
        return super().fit(kl_ctl)


RehearsalPolicyModelRayActor = ray.remote(num_gpus=1)(RehearsalPolicyModelActor)
