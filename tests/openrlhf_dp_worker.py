"""One data-parallel rank of test_openrlhf_slow.py's two-rank DeepSpeed check (run in a spawned process).

The rank builds the same rollout step as every rank (seeded), takes its contiguous share of the experiences as
OpenRLHF's ``RayActorGroup.async_run_method_batch`` hands them out, trains one optimizer step through mmrl's
``ppo_train`` on a ZeRO-2 engine over gloo, and saves the full gradient DeepSpeed assembled at the step boundary.
"""

from __future__ import annotations

import os
import sys


def run_rank(rank: int, world: int, port: int, name: str, out_dir: str) -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    from openrlhf_stubs import openrlhf_importable

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    with openrlhf_importable():
        import deepspeed
        import torch
        from test_openrlhf_slow import (
            REWARDS_DP,
            GradientRecordingStrategy,
            actor_trainer,
            experiences_of,
            launch_args,
            rollout_with_old_logprobs,
            tiny_policy,
        )

        from mmrl.openrlhf.strategy import host_rendezvous_store

    torch.set_num_threads(1)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # see the gloo fixture in test_openrlhf_slow.py
    hosted = host_rendezvous_store()  # on 127.0.0.1 only, as mmrl's strategy hosts it in a run  # noqa: F841
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    args = launch_args(out_dir, name, gpus=world, prompts=len(REWARDS_DP))
    batch = rollout_with_old_logprobs(tiny_policy(), REWARDS_DP)
    strategy = GradientRecordingStrategy(seed=0, max_norm=1.0, micro_train_batch_size=args.train.micro_batch_size,
                                         train_batch_size=args.train.batch_size, zero_stage=2, args=args)
    strategy.world_size = world
    strategy.accumulated_gradient = args.train.batch_size // args.train.micro_batch_size // world
    experiences = experiences_of(strategy, args, batch)
    share = len(experiences) // world  # RayActorGroup.async_run_method_batch: contiguous, equal chunks
    trainer = actor_trainer(strategy, args, tiny_policy(), experiences[rank * share:(rank + 1) * share], epochs=1)
    status = trainer.ppo_train(kl_ctl=0.0)
    torch.save({"grads": strategy.recorded, "policy_loss": status["policy_loss"]},
               os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()
