"""``--cluster.rehearsal true``: OpenRLHF's real pipeline on a CPU machine, to check a cluster config before GPU hours.

What runs is the same job as on GPUs: Ray actor groups and placement groups, OpenRLHF's PPO trainer, policy and
reference actors, experience maker, replay buffer, DeepSpeed ZeRO (its CPU accelerator, gloo), checkpoints, eval and
``--resume``, with mmrl's subclasses. Four things differ, and only in this mode:

* rollouts come from :class:`mmrl.openrlhf.rollout.HFRolloutActor`, a subclass of OpenRLHF's rollout actor that runs
  Hugging Face ``generate`` behind the vLLM engine interface (vLLM is a CUDA build);
* weight sync is a gloo group on its own ``TCPStore`` (:mod:`mmrl.openrlhf.vllm_stand_in`), not NCCL / CUDA IPC;
* attention is sdpa (flash-attn is CUDA only) and DeepSpeed's sleep/offload (CUDA memory) is off;
* the ``torch.cuda`` calls OpenRLHF makes unconditionally (docs/cluster.md lists them) are no-ops, installed by
  :func:`install_worker_shims`, Ray's ``worker_process_setup_hook`` for this job only: each worker runs it before it
  imports OpenRLHF. A GPU run never installs them, and no OpenRLHF file is edited.

Ray is told the devices the layout declares (``num_gpus``), so OpenRLHF's GPU placement groups schedule; the workers
compute on the CPU even on a machine that has GPUs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

from mmrl.files import remove_named_files
from mmrl.openrlhf.compat import install_zero3_loading_fix

SETUP_HOOK = "mmrl.openrlhf.rehearsal.install_worker_shims"
VLLM_SETUP_HOOK = "mmrl.openrlhf.vllm_cpu_setup.install_vllm_worker_shims"  # --cluster.rehearsal_engine vllm
LOG_DIR = "rehearsal"  # under the run directory: weight-sync digests and per-rank statistics
# what a rehearsal writes there: the objective each loss call used, the weight digests of both sides of each sync,
# and what each policy rank received per step
LOG_FILES = re.compile(r"(objective|policy_weights|rollout_weights)\.jsonl|rank\d+_step\d+\.pt")


def remove_logs(folder: Path) -> tuple[list[str], list[str]]:
    """Remove a rehearsal's records from its ``rehearsal/`` folder (``--run.overwrite``), then the folder if that
    empties it. Returns (the names removed, the names left)."""
    return remove_named_files(folder, LOG_FILES.fullmatch)

# OpenRLHF flags the rehearsal sets over the generated ones (cluster.extra still applies last)
FLAGS = {
    "ds.attn_implementation": "sdpa",  # OpenRLHF's default flash_attention_2 needs flash-attn
    "vllm.sync_backend": "gloo",  # not nccl: OpenRLHF then takes the broadcast path, not CUDA IPC
    "ds.enable_sleep": False,  # DeepSpeed's state offload moves CUDA memory (deepspeed_utils.py)
}
# and with the real vLLM engine (vllm-cpu has no sleep mode)
VLLM_FLAGS = {**FLAGS, "vllm.enable_sleep": False}


class CpuDevice(str):
    """What ``torch.cuda.current_device()`` returns in the rehearsal: ``"cpu"`` where OpenRLHF moves tensors to it
    (``.to(device)``, ``device=``), and index ``0`` where it formats ``f"cuda:{index}"`` into a device object that the
    rehearsal never moves anything to (``NaiveReplayBuffer.target_device``, used only by OpenRLHF's own collate)."""

    def __format__(self, spec: str) -> str:
        return "0"


def _no_op(name: str):
    """A separate function per replaced name: torch._dynamo maps each torch.cuda function object to one rule."""

    def no_op(*args: Any, **kwargs: Any) -> None:
        return None

    no_op.__name__ = no_op.__qualname__ = name
    return no_op


def _current_device() -> CpuDevice:
    return CpuDevice("cpu")


def _cpu_device_mesh(init_device_mesh):
    def init(device_type: str, *args: Any, **kwargs: Any):
        return init_device_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    return init


def install_stand_ins(real_vllm: bool = False) -> None:
    """The vLLM / flash-attn names OpenRLHF imports (the driver needs them to import OpenRLHF's launcher); with
    ``real_vllm`` (vllm-cpu installed), the flash-attn names only."""
    from mmrl.openrlhf.vllm_stand_in import modules

    for name, module in modules().items():
        if not (real_vllm and name.split(".")[0] == "vllm"):
            sys.modules.setdefault(name, module)


def install_worker_shims() -> None:
    """Ray's ``worker_process_setup_hook`` of a rehearsal job: the stand-ins and the CUDA no-ops (and, as in every
    job, :func:`mmrl.openrlhf.compat.install_zero3_loading_fix`).

    Runs before the worker imports anything of OpenRLHF, which is what makes by-name imports
    (``from torch.distributed.device_mesh import init_device_mesh``) pick the CPU versions up."""
    install_zero3_loading_fix()
    install_stand_ins()
    install_cuda_no_ops()


def install_cuda_no_ops() -> None:
    for name in ("set_device", "synchronize", "empty_cache", "current_stream"):
        setattr(torch.cuda, name, _no_op(name))
    torch.cuda.current_device = _current_device
    import torch.distributed.device_mesh as device_mesh

    device_mesh.init_device_mesh = _cpu_device_mesh(device_mesh.init_device_mesh)


def devices(args) -> int:
    """The GPUs the layout declares: the policy ranks, plus the engines when they do not share them."""
    policy = args.actor.num_nodes * args.actor.num_gpus_per_node
    engines = args.vllm.num_engines * args.vllm.tensor_parallel_size
    return policy if args.train.colocate_all else policy + engines


def runtime_env(env_vars: dict[str, str], engine: str = "hf") -> dict[str, Any]:
    """The job's Ray runtime env: the set-up hook, DeepSpeed's CPU accelerator (also on a machine with GPUs: every
    tensor stays where ``torch.cuda.current_device()`` says, the CPU) and this mmrl on the workers' path. With the
    vLLM engine, vllm-cpu's KV cache (GiB; VLLM_CPU_KVCACHE_SPACE overrides) and its OpenMP threads left unpinned, as
    the engines share the cores with the policy ranks."""
    import mmrl

    source = str(Path(mmrl.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH", "")) if p)
    env = {**env_vars, "DS_ACCELERATOR": "cpu", "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    if engine == "vllm":
        env.update({"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                    "VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    return {"worker_process_setup_hook": VLLM_SETUP_HOOK if engine == "vllm" else SETUP_HOOK, "env_vars": env}


def local_resources(declared_gpus: int) -> dict[str, Any]:
    """``ray.init`` resources of a local rehearsal: the declared GPUs, and a CPU slot per placement bundle plus the
    trainer actor (logical slots: Ray schedules by them, the OS shares the real cores)."""
    return {"num_gpus": declared_gpus, "num_cpus": max(os.cpu_count() or 1, declared_gpus + 2),
            "object_store_memory": 512 * 1024 ** 2}


def gpu_note() -> str | None:
    """The one-line note for a rehearsal asked for on a machine that has GPUs (it runs as asked, on the CPU)."""
    if torch.cuda.is_available():
        return (f"note: this machine has {torch.cuda.device_count()} GPU(s); --cluster.rehearsal true runs the CPU "
                f"rehearsal anyway (drop it to train on the GPUs)")
    return None


def weights_digest(model: torch.nn.Module, names: list[str] | None = None) -> str:
    """sha256 of the parameters as bf16 bits, in name order: the policy trains bf16 parameters, and the rollout
    actor's fp32 copies of them are the same numbers."""
    params = dict(model.named_parameters())
    return tensors_digest({name: params[name] for name in (names if names is not None else params)})


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """:func:`weights_digest` of named tensors (what a vLLM engine received in a sync)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes())
    return digest.hexdigest()


def append_record(run_dir: str, file: str, record: dict[str, Any]) -> None:
    """One JSON line; ``pid`` tells apart the processes (engines, resumed runs) that append to the same file."""
    record = {**record, "pid": os.getpid()}
    path = Path(run_dir) / LOG_DIR / file
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
