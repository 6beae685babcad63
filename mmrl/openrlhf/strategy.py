"""``MmrlDeepspeedStrategy``: OpenRLHF's ``DeepspeedStrategy`` preparing the policy the way mmrl trains it.

Changes happen before DeepSpeed builds the optimizer, which is the only point where they are cheap and exact:

* dropout and router jitter off (``mmrl.run.build.disable_dropout``, as the local trainer): π_old, computed by the
  actor's eval-mode forward, and the training forward must be the same function at the first update;
* ``moe.freeze_router``: the routers' weights get ``requires_grad = False``, so ``get_optimizer_grouped_parameters``
  leaves them out of DeepSpeed's optimizer (no update, no optimizer state, no ZeRO partition for them);
* without CUDA (the CPU tests), DeepSpeed's fused Adam cannot build: ``torch_adam`` selects torch's AdamW.

Before DeepSpeed joins its process group, rank 0 hosts the group's rendezvous store on ``MASTER_ADDR`` only
(:func:`host_rendezvous_store`): torch's own store would listen on every interface of the machine.

A checkpoint (``--resume``) is read weights-only (:mod:`mmrl.openrlhf.checkpoint`): DeepSpeed's own loader unpickles.
Old checkpoints are rotated out by removing their own files only (:func:`mmrl.openrlhf.checkpoint.rotate_tags`).

The strategy object is created on the driver and pickled into every Ray actor, so these apply on every rank.
"""

from __future__ import annotations

import gc
import math
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import deepspeed.ops
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from openrlhf.models import Actor
from openrlhf.utils.deepspeed import DeepspeedStrategy
from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync

from mmrl import moe
from mmrl.errors import UserError
from mmrl.openrlhf.checkpoint import checkpoint_folder, rotate_tags, weights_only_loading
from mmrl.openrlhf.network import bound_listener
from mmrl.openrlhf.spec import ActorSpec

# torch's contract for a store someone else hosts: with it, the env:// rendezvous at MASTER_ADDR:MASTER_PORT makes
# every rank a client instead of starting a server on rank 0
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
# the hosted stores of this process, alive as long as it is (a module global: the strategy itself is pickled)
HOSTED: list[tuple[Any, Any]] = []


def prepare_policy(model: torch.nn.Module, freeze_router: bool) -> None:
    """In place: dropout off; routers frozen when asked (a dense model with ``freeze_router`` is an error)."""
    from mmrl.run.build import disable_dropout

    disable_dropout(model)
    if freeze_router:
        if not moe.find_routers(model):
            raise UserError("moe.freeze_router is set but the model has no MoE router")
        moe.freeze_routers(model)


def host_rendezvous_store() -> tuple[Any, Any] | None:
    """On rank 0 of a group set up from ``MASTER_ADDR`` / ``MASTER_PORT`` (OpenRLHF's actor groups set them):
    (listening socket, store) serving the group's rendezvous on exactly ``MASTER_ADDR``, kept alive by the caller.
    Every rank, rank 0 included, then joins it as a client. None on the other ranks, or without those variables."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not address or not port:
        return None
    os.environ[AGENT_STORE_ENV] = str(True)
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    listener = bound_listener(address, int(port))
    store = dist.TCPStore(address, int(port), is_master=True, wait_for_workers=False,
                          master_listen_fd=listener.fileno())
    return listener, store


def keep_collectives_on_gloo() -> None:
    """DeepSpeed's CPU accelerator (the rehearsal's) would JIT-compile its shared-memory all-reduce when a rank joins
    its group (minutes); without it gloo carries every collective. Set by the ranks that join a group, not in every
    Ray worker: a rollout actor would import DeepSpeed for nothing (seconds, in every rehearsal run)."""
    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


class MmrlDeepspeedStrategy(DeepspeedStrategy):
    def setup_distributed(self, timeout: timedelta = timedelta(minutes=60)) -> None:
        hosted = host_rendezvous_store()
        if hosted is not None:
            HOSTED.append(hosted)
        keep_collectives_on_gloo()
        super().setup_distributed(timeout)

    def _ds_init_train_model(self, model, cfg: dict):
        spec: ActorSpec | None = getattr(self.args, "mmrl", None)  # None: a strategy built outside mmrl's launch
        prepare_policy(model.model if isinstance(model, Actor) else model, spec is not None and spec.freeze_router)
        return super()._ds_init_train_model(model, cfg)

    def save_ckpt(self, model, save_dir, tag=None, max_num=3, max_mem=1000, client_state=None, save_latest=True,
                  metric_value=None, metric_key=None):
        """OpenRLHF's save, its rotation of old checkpoints replaced by :func:`rotate_tags`: OpenRLHF's removes whole
        folders of ``save_dir``, any folder there a user made included."""
        if self.is_rank_0():
            os.makedirs(save_dir, exist_ok=True)
            rotate_tags(Path(save_dir), tag, max_num, math.inf if max_mem is None else max_mem, self._read_ckpt_metric)
        torch_dist_barrier_and_cuda_sync()
        model.save_checkpoint(save_dir, tag=tag, client_state=client_state or {}, save_latest=save_latest)
        if self.is_rank_0() and tag is not None:  # after the states, as OpenRLHF: a crash leaves no lone metric
            self._write_ckpt_metric(os.path.join(save_dir, tag), metric_value, metric_key=metric_key)
        gc.collect()

    def load_ckpt(self, model, load_dir, tag=None, **kwargs):
        with weights_only_loading(checkpoint_folder(load_dir, tag)):
            return super().load_ckpt(model, load_dir, tag, **kwargs)

    def get_ds_train_config(self, optim_dict: dict | None = None, *, max_norm: float | None = None):
        if optim_dict is not None and not torch.cuda.is_available():
            optim_dict = {**optim_dict, "params": {**optim_dict["params"], "torch_adam": True}}
        return super().get_ds_train_config(optim_dict, max_norm=max_norm)


def make_strategy(args) -> MmrlDeepspeedStrategy:
    """The strategy OpenRLHF's ``get_strategy(args)`` would build, as mmrl's subclass."""
    return MmrlDeepspeedStrategy(seed=args.train.seed, full_determinism=args.train.full_determinism_enable,
                                 max_norm=args.actor.max_norm, micro_train_batch_size=args.train.micro_batch_size,
                                 train_batch_size=args.train.batch_size, zero_stage=args.ds.zero_stage, args=args)
