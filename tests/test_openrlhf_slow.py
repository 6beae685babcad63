"""The openrlhf backend's DeepSpeed step on a CPU: a ZeRO-2 step through mmrl's actor loop, on one rank and on two
gloo ranks. flash_attn and vllm are CUDA-only and stubbed while OpenRLHF is imported (tests/openrlhf_stubs.py); no
vLLM engine is started.

What only runs on GPUs: vLLM generation and NCCL weight sync to the engines; OpenRLHF's own actor start-up, Ray's
placement of the actor layout on declared GPUs and the whole loop run in the CPU rehearsal
(tests/test_openrlhf_rehearsal.py); see docs/cluster.md. The two-rank test spawns its ranks from
tests/openrlhf_dp_worker.py.
"""

from __future__ import annotations

import dataclasses
import random
import socket

import pytest
import torch
from openrlhf_stubs import openrlhf_importable

import mmrl.algos as algos
from mmrl.batch import Group, Response, collate
from mmrl.openrlhf.launch import resolve_launch
from mmrl.rewards.base import RewardResult
from mmrl.train import parse_config
from mmrl.trainer.rollout import response_logprobs

with openrlhf_importable():
    import deepspeed
    from deepspeed.utils import safe_get_full_grad
    from openrlhf.models import Actor
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    from mmrl.openrlhf.actor import adopt
    from mmrl.openrlhf.experience import MmrlExperienceMaker
    from mmrl.openrlhf.strategy import AGENT_STORE_ENV, MmrlDeepspeedStrategy, host_rendezvous_store

pytestmark = pytest.mark.slow
N, PROMPT = 4, 3  # group size, prompt tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_policy() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False))


def rollout(rewards: list[list[float]], seed: int = 0):
    """A rollout batch in mmrl's layout (equal-length prompts, so it is also OpenRLHF's right-padded layout)."""
    rng = random.Random(seed)
    groups = []
    for gid, scores in enumerate(rewards):
        prompt = [rng.randrange(5, 64) for _ in range(PROMPT)]
        responses = [Response([rng.randrange(5, 64) for _ in range(rng.randint(1, 5))], reward=RewardResult(s))
                     for s in scores]
        groups.append(Group(gid, {}, prompt, responses))
    return collate(groups, pad_id=0)


def as_openrlhf_samples(batch) -> list:
    """One OpenRLHF Experience per response, as its SamplesGenerator builds them, with π_old log-probs attached."""
    samples = []
    for i in range(batch.size):
        length = int(batch.response_mask[i].sum())
        total = PROMPT + length
        action_mask = torch.zeros(1, total - 1, dtype=torch.long)
        action_mask[0, PROMPT - 1:] = 1
        logp = torch.zeros(1, total - 1)
        logp[0, PROMPT - 1:] = batch.old_logprobs[i, :length]
        samples.append(Experience(
            sequences=batch.input_ids[i:i + 1, :total], attention_mask=torch.ones(1, total, dtype=torch.long),
            action_mask=action_mask, action_log_probs=logp, rewards=batch.rewards[i:i + 1].clone(),
            response_length=torch.tensor([length]), truncated=torch.tensor([False]),
            total_length=torch.tensor([float(total)]), info={"reward": batch.rewards[i:i + 1].clone()}))
    return samples


def launch_args(out_dir, name: str, gpus: int = 1, prompts: int = 4):
    """The run's OpenRLHF arguments as the launcher builds them: ``prompts`` prompts × 4 responses on ``gpus`` ranks,
    micro-batches of one group, in fp32 (OpenRLHF's CLI allows bf16/fp16 only; fp32 is DeepSpeed's default and makes
    the comparison exact)."""
    cfg = parse_config(["--backend", "openrlhf", "--algo", name, "--out", str(out_dir), "--cluster.nodes", "1",
                        "--cluster.gpus_per_node", str(gpus), "--cluster.vllm_engines", str(gpus),
                        "--rollout.prompts_per_step", str(prompts), "--rollout.samples_per_prompt", str(N),
                        "--optim.micro_batch_size", "4" if gpus > 1 else "8", "--rollout.max_new_tokens", "5"])
    args = resolve_launch(cfg, write=False).args
    args.ds.param_dtype = "fp32"
    return args


def rollout_with_old_logprobs(model, rewards: list[list[float]]):
    """A rollout batch whose π_old is a little off the policy (so that ratios and clipping matter)."""
    batch = rollout(rewards)
    with torch.no_grad():
        logprobs, _ = response_logprobs(model, batch, 1.0)
    noise = 0.05 * torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(1))
    batch.old_logprobs = ((logprobs + noise) * batch.response_mask).detach()
    return batch


def local_objective_gradient(model, batch, algo) -> tuple[float, dict[str, torch.Tensor]]:
    """mmrl's objective on the whole batch, as the local trainer computes it (its micro-batch accumulation equals
    this; test_algos checks that), and its gradient."""
    batch.advantages = algo.advantages(batch.rewards, batch.group_ids)
    stats = algo.batch_stats(batch.rewards, batch.group_ids, batch.advantages, batch.old_logprobs,
                             batch.response_mask)
    logprobs, _ = response_logprobs(model, batch, 1.0)
    loss, _ = algo.policy_loss(logprobs, batch.old_logprobs, batch.advantages, batch.response_mask, batch.group_ids,
                               None, stats)
    loss.backward()
    return float(loss.detach()), {n: p.grad for n, p in model.named_parameters()}


ACTOR_CFG = {"optim": "adam", "muon": {}, "adam": {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0},
             "lr_scheduler": "constant", "lr_warmup_ratio": 0.0, "max_norm": 1.0, "scheduler_steps": 4}


def experiences_of(strategy, args, batch) -> list:
    """The batch as OpenRLHF experiences, from mmrl's experience maker (advantages and statistics included)."""
    maker = MmrlExperienceMaker(None, None, None, None, None, strategy, type("Tok", (), {"pad_token_id": 0}),
                                mmrl_spec=args.mmrl)
    return maker.compute_advantages_and_returns(maker.split_rollout_samples(as_openrlhf_samples(batch)))


def actor_trainer(strategy, args, model, experiences: list, epochs: int):
    """OpenRLHF's ActorPPOTrainer with mmrl's loop adopted: ``model`` as OpenRLHF's Actor on a DeepSpeed engine of
    ``strategy`` (Adam, constant lr), ``experiences`` in OpenRLHF's replay buffer."""
    actor = Actor(model)
    actor.packing_samples = False  # set by Actor for a model path; a module passed in keeps its own settings
    actor, optim, scheduler = strategy.prepare((actor, ACTOR_CFG))
    buffer = object.__new__(NaiveReplayBuffer)  # its __init__ asks CUDA for a device; append/items are the real ones
    buffer.cpu_offload, buffer.limit, buffer.items = False, 0, []
    for e in experiences:
        buffer.append(e)
    trainer = object.__new__(ActorPPOTrainer)  # PolicyModelActor builds it with CUDA/vLLM; these are its fields
    trainer.__dict__.update(strategy=strategy, args=args, actor=actor, ema_model=None, actor_optim=optim,
                            actor_scheduler=scheduler, micro_train_batch_size=args.train.micro_batch_size,
                            max_epochs=epochs, aux_loss=False, replay_buffer=buffer)
    adopt(trainer, args.mmrl)
    return trainer


class GradientRecordingStrategy(MmrlDeepspeedStrategy):
    """Records DeepSpeed's full (un-partitioned) gradients at the accumulation boundary, before the optimizer step."""

    recorded: dict[str, torch.Tensor] | None = None

    def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs):
        engine = model.model if isinstance(model, Actor) else model
        if engine.is_gradient_accumulation_boundary():
            self.recorded = {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}
        return super().optimizer_step(optimizer, model, scheduler, name, **kwargs)


@pytest.fixture(scope="module")
def gloo_world_of_one():
    """torch.distributed over gloo with one rank, as DeepSpeed sets it up, for the whole module (DeepSpeed keeps
    references to the group it first sees). DeepSpeed's CPU shared-memory all-reduce op (used only by
    ``inference_all_reduce``; ZeRO training collectives go through torch.distributed) would be JIT-compiled on first
    use, ~2 min: it is marked unavailable so that gloo carries every collective."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
            mp.setenv(key, value)
        mp.setitem(deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm", False)
        mp.setenv(AGENT_STORE_ENV, "")  # restored after the module; host_rendezvous_store sets it
        hosted = host_rendezvous_store()  # on 127.0.0.1 only, as mmrl's strategy hosts it in a run  # noqa: F841
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        yield
        torch.distributed.destroy_process_group()


REWARDS = [[1, 0, 0, 1], [0, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]]
REWARDS_DP = [[1, 0, 0, 1], [0, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]]


@pytest.mark.parametrize("name", ["gvpo", "gpg", "cw_grpo", "dr_grpo", "gspo", "cispo", "sapo"])
def test_deepspeed_zero2_step_of_mmrls_actor_matches_the_local_gradient(name, tmp_path, gloo_world_of_one,
                                                                         embedded_model_dir):
    # 4 prompts × 4 responses on one rank, micro-batches of 8 (two whole groups): DeepSpeed accumulates 2 of them
    args = launch_args(tmp_path, name)
    algo = algos.get(name, **args.mmrl.params)
    local_model, ds_model = tiny_policy(), tiny_policy()
    batch = rollout_with_old_logprobs(local_model, REWARDS)
    loss, want = local_objective_gradient(local_model, batch, algo)

    # The same batch through OpenRLHF's pieces: mmrl's experience maker, OpenRLHF's replay buffer, mmrl's ppo_train
    # loop calling OpenRLHF's training_step on a DeepSpeed ZeRO-2 engine built by (mmrl's subclass of) its strategy.
    strategy = GradientRecordingStrategy(seed=0, max_norm=1.0, micro_train_batch_size=args.train.micro_batch_size,
                                         train_batch_size=args.train.batch_size, zero_stage=2, args=args)
    strategy.world_size, strategy.accumulated_gradient = 1, args.train.batch_size // args.train.micro_batch_size
    assert strategy.accumulated_gradient == 2
    status = actor_trainer(strategy, args, ds_model, experiences_of(strategy, args, batch), epochs=1).ppo_train(
        kl_ctl=0.0)

    got = strategy.recorded
    assert got is not None and set(got) == set(want)
    for n in want:
        assert torch.allclose(got[n], want[n], rtol=1e-4, atol=1e-7), n
    assert status["policy_loss"] == pytest.approx(loss, rel=1e-4)


@pytest.mark.parametrize("name", ["gpg"])
def test_two_deepspeed_ranks_give_the_whole_steps_gradient(name, tmp_path, embedded_model_dir):
    """Two gloo ranks, each with its half of the step (different token counts: GPG's token mean must use the global
    count), two accumulated micro-batches each: both ranks end with the local objective's gradient. (GPG only: the
    hardest normalisation; ~1 min for two processes that each import DeepSpeed and OpenRLHF.)"""
    import torch.multiprocessing as mp
    from openrlhf_dp_worker import run_rank

    algo = algos.get(name, **launch_args(tmp_path, name, gpus=2, prompts=len(REWARDS_DP)).mmrl.params)
    model = tiny_policy()
    loss, want = local_objective_gradient(model, rollout_with_old_logprobs(model, REWARDS_DP), algo)
    mp.spawn(run_rank, args=(2, free_port(), name, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert set(got["grads"]) == set(want)
        for n in want:
            assert torch.allclose(got["grads"][n], want[n], rtol=1e-4, atol=1e-7), (rank, n)
        assert got["policy_loss"] == pytest.approx(loss, rel=1e-4)


class StepCountingStrategy(MmrlDeepspeedStrategy):
    """Counts the optimizer steps DeepSpeed takes (one per accumulation boundary)."""

    steps = 0

    def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs):
        engine = model.model if isinstance(model, Actor) else model
        if engine.is_gradient_accumulation_boundary():
            self.steps += 1
        return super().optimizer_step(optimizer, model, scheduler, name, **kwargs)


@pytest.mark.parametrize("target_kl", [0.0, 1e-6])
def test_target_kl_stops_the_steps_updates_once_the_kl_leaves_the_band(target_kl, tmp_path, gloo_world_of_one,
                                                                        embedded_model_dir):
    # 2 epochs of one optimizer step each; π_old is off the policy (noise), so the first forward already measures a
    # KL far above 1e-6: with that band the first step is the last
    args = launch_args(tmp_path, "grpo")
    args.mmrl = dataclasses.replace(args.mmrl, target_kl=target_kl)
    model = tiny_policy()
    batch = rollout_with_old_logprobs(model, REWARDS)
    strategy = StepCountingStrategy(seed=0, max_norm=1.0, micro_train_batch_size=args.train.micro_batch_size,
                                    train_batch_size=args.train.batch_size, zero_stage=2, args=args)
    strategy.world_size, strategy.accumulated_gradient = 1, args.train.batch_size // args.train.micro_batch_size
    status = actor_trainer(strategy, args, model, experiences_of(strategy, args, batch), epochs=2).ppo_train(
        kl_ctl=0.0)
    assert status["mmrl/kl_old_max"] > status["mmrl/kl_old"] > 1e-6
    if target_kl:
        assert strategy.steps == 1 and status["mmrl/kl_early_stop"] == 1.0
    else:
        assert strategy.steps == 2 and "mmrl/kl_early_stop" not in status
