"""mmrl's subclasses of OpenRLHF 0.11.2's classes, run on a CPU against OpenRLHF's real code.

flash_attn and vllm are CUDA-only and replaced by empty stand-ins while OpenRLHF is imported (tests/openrlhf_stubs.py,
as OpenRLHF's own tests do). vLLM generation itself cannot run here: where a test needs rollouts, a subclass of the
generator produces them in place of the vLLM engines (said in that test); everything downstream is OpenRLHF's and
mmrl's real code. OpenRLHF's actors call CUDA directly, so their DeepSpeed step is checked in test_openrlhf_slow.py.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from openrlhf_stubs import openrlhf_importable

import mmrl.algos as algos
from mmrl.algos.base import advantage_spread, kl_k3
from mmrl.algos.rollout_correction import RolloutCorrection
from mmrl.openrlhf.grouping import groups_are_whole, whole_group_micro_batches
from mmrl.openrlhf.launch import resolve_launch
from mmrl.train import parse_config

with openrlhf_importable():
    from openrlhf.models.loss import PolicyLoss
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor
    from openrlhf.utils.deepspeed.deepspeed_utils import get_optimizer_grouped_parameters

    from mmrl.openrlhf.actor import (
        MmrlActorPPOTrainer,
        MmrlPolicyModelActor,
        MmrlPolicyModelRayActor,
        adopt,
        pop_mmrl_fields,
    )
    from mmrl.openrlhf.experience import MmrlExperienceMaker
    from mmrl.openrlhf.loss import MicroBatch, MmrlPolicyLoss, sequence_advantages
    from mmrl.openrlhf.sampling import MmrlSamplesGenerator
    from mmrl.openrlhf.strategy import make_strategy, prepare_policy
    from mmrl.openrlhf.trainer import MmrlPPOTrainer, MmrlPPOTrainerRayActor

N = 4  # group size
CLUSTER = ["--cluster.nodes", "1", "--cluster.gpus_per_node", "2", "--cluster.vllm_engines", "2",
           "--rollout.prompts_per_step", "6", "--rollout.samples_per_prompt", str(N), "--steps", "2",
           "--optim.micro_batch_size", "4"]


def launch_args(tmp_path, algo: str, *extra: str):
    cfg = parse_config(["--backend", "openrlhf", "--algo", algo, "--out", str(tmp_path / algo), *CLUSTER, *extra])
    return resolve_launch(cfg, write=True).args


def single_sample(reward: float, rng: random.Random, prompt_len: int = 3, width: int = 6) -> Experience:
    """One response as OpenRLHF's SamplesGenerator builds it (batch of one, action mask over sequences[1:])."""
    length = rng.randint(1, width)
    total = prompt_len + length
    action_mask = torch.zeros(1, total - 1, dtype=torch.long)
    action_mask[0, prompt_len - 1:] = 1
    logp = -torch.rand(1, total - 1, dtype=torch.float32) * 3 * action_mask
    return Experience(sequences=torch.randint(5, 50, (1, total)), attention_mask=torch.ones(1, total, dtype=torch.long),
                      action_mask=action_mask, action_log_probs=logp, rewards=torch.tensor([reward]),
                      response_length=torch.tensor([length]), truncated=torch.tensor([False]),
                      total_length=torch.tensor([float(total)]), prompts=["p"], labels=["{}"],
                      info={"reward": torch.tensor([reward])})


def rollout_step(group_rewards: list[list[float]], seed: int = 0) -> list[Experience]:
    rng = random.Random(seed)
    return [single_sample(r, rng) for group in group_rewards for r in group]


GROUP_REWARDS = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0.5, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 1]]


def test_the_subclasses_are_of_openrlhfs_plain_classes():
    assert issubclass(MmrlPolicyModelActor, PolicyModelActor.__ray_actor_class__)
    assert MmrlPolicyModelRayActor.__ray_actor_class__ is MmrlPolicyModelActor
    assert issubclass(MmrlPPOTrainer, PPOTrainer.__ray_actor_class__)
    assert MmrlPPOTrainerRayActor.__ray_actor_class__ is MmrlPPOTrainer
    assert issubclass(MmrlActorPPOTrainer, ActorPPOTrainer)
    assert issubclass(MmrlExperienceMaker, RemoteExperienceMaker)
    assert issubclass(MmrlPolicyLoss, PolicyLoss) and issubclass(MmrlSamplesGenerator, SamplesGenerator)


def loss_inputs(seed: int = 0, batch: int = 8, width: int = 7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, width, generator=g) < 0.8).float()
    mask[:, 0] = 1
    logp = (-torch.rand(batch, width, generator=g) * 2).requires_grad_()
    old = (logp.detach() + 0.3 * torch.randn(batch, width, generator=g)).clamp(max=0)
    group_ids = torch.arange(batch) // N
    rewards = torch.rand(batch, generator=g).round()
    return logp, old, mask, group_ids, rewards


@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_policy_loss_is_mmrls_objective_with_openrlhfs_5_tuple(name):
    logp, old, mask, group_ids, rewards = loss_inputs()
    algo = algos.get(name)
    adv = algo.advantages(rewards, group_ids)
    stats = algo.batch_stats(rewards, group_ids, adv, old, mask)
    ref = (old - 0.1) if algo.uses_reference() else None
    loss_fn = MmrlPolicyLoss(algo)
    with pytest.raises(RuntimeError, match="needs bind"):
        loss_fn(logp, old, adv[:, None] * mask, action_mask=mask)
    loss_fn.bind(MicroBatch(group_ids, stats, scale=2.5, ref_logprobs=ref))
    # OpenRLHF's call: ActorPPOTrainer.training_step passes these arguments and unpacks five values
    out = loss_fn(logp, old, adv[:, None] * mask, action_mask=mask, rollout_log_probs=None, dp_size=1,
                  batch_num_tokens=torch.tensor(5.0), global_batch_size=torch.tensor(3.0))
    theirs = PolicyLoss()(logp, old, adv[:, None] * mask, action_mask=mask)
    assert len(out) == len(theirs) == 5 and out[3] is None and out[4] is None and theirs[3] is None
    assert out[0].dim() == theirs[0].dim() == 0 and out[1].dim() == 0
    assert torch.allclose(out[2], theirs[2])  # ppo_kl: same definition as OpenRLHF's
    expected, _ = algo.policy_loss(logp, old, adv, mask, group_ids, ref, stats)
    assert torch.allclose(out[0], 2.5 * expected)
    (grad,) = torch.autograd.grad(out[0], logp)
    (want,) = torch.autograd.grad(2.5 * expected, logp)
    assert torch.allclose(grad, want)


def test_a_nonfinite_objective_gives_no_gradient():
    logp, old, mask, group_ids, rewards = loss_inputs()
    loss_fn = MmrlPolicyLoss(algos.get("gpg"))
    loss_fn.bind(MicroBatch(group_ids, {}, scale=1.0))
    adv = torch.full((8, 7), float("nan"))
    loss = loss_fn(logp, old, adv, action_mask=mask)[0]
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(loss) == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert loss_fn.last_metrics["nonfinite_loss"] == 1.0


def test_grpo_matches_openrlhfs_own_ppo_loss_in_its_sequence_mean_mode():
    """A cross-check of the contract's meaning: mmrl's GRPO and OpenRLHF's PPO loss (seq-mean-token-mean) agree."""
    logp, old, mask, group_ids, rewards = loss_inputs(seed=3)
    algo = algos.get("grpo")
    adv = algo.advantages(rewards, group_ids)
    loss_fn = MmrlPolicyLoss(algo)
    loss_fn.bind(MicroBatch(group_ids, {}, scale=1.0))
    ours = loss_fn(logp, old, adv[:, None] * mask, action_mask=mask)
    theirs = PolicyLoss(token_level_loss=False)(logp, old, adv[:, None] * mask, action_mask=mask)
    assert torch.allclose(ours[0], theirs[0], atol=1e-6) and torch.allclose(ours[1], theirs[1])


@pytest.mark.parametrize("drift", [0.0, 0.002, 0.3])
def test_gspo_matches_openrlhfs_own_gspo_loss(drift):
    """mmrl's GSPO and OpenRLHF's ``policy_loss_type gspo`` (sequence ratio, per-sample mean) at the paper's clip
    range: the same loss and gradient, with nothing, some or every response clipped."""
    logp, _, mask, group_ids, rewards = loss_inputs(seed=4)
    old = logp.detach() + drift * torch.randn(logp.shape, generator=torch.Generator().manual_seed(2))
    algo = algos.get("gspo")
    adv = algo.advantages(rewards, group_ids)
    loss_fn = MmrlPolicyLoss(algo)
    loss_fn.bind(MicroBatch(group_ids, {}, scale=1.0))
    ours = loss_fn(logp, old, adv[:, None] * mask, action_mask=mask)[0]
    theirs = PolicyLoss(clip_eps_low=3e-4, clip_eps_high=4e-4, policy_loss_type="gspo")(
        logp, old, adv[:, None] * mask, action_mask=mask)[0]
    (grad,) = torch.autograd.grad(ours, logp)
    (want,) = torch.autograd.grad(theirs, logp)
    assert torch.allclose(ours, theirs, atol=1e-7) and torch.allclose(grad, want, atol=1e-8)
    clipped = loss_fn.last_metrics["clip_frac"]
    assert clipped == 0 if drift == 0 else clipped > 0


def make_experiences(tmp_path, algo: str, group_rewards=GROUP_REWARDS):
    args = launch_args(tmp_path, algo)
    maker = MmrlExperienceMaker(None, None, None, None, None, SimpleNamespace(args=args),
                                SimpleNamespace(pad_token_id=0), mmrl_spec=args.mmrl)
    samples = rollout_step(group_rewards)
    experiences = maker.split_rollout_samples(samples)  # OpenRLHF's chunking: rollout.micro_batch_size samples each
    return maker, samples, maker.compute_advantages_and_returns(experiences), args


@pytest.mark.parametrize("name", sorted(algos.ALGORITHMS))
def test_experience_maker_advantages_and_statistics_equal_mmrls_on_the_whole_batch(name, tmp_path):
    maker, samples, experiences, _ = make_experiences(tmp_path, name)
    assert len(experiences) == len(samples) // 4  # one experience per micro-batch of 4 (here: one group each)
    rewards = torch.tensor([r for g in GROUP_REWARDS for r in g], dtype=torch.float32)
    group_ids = torch.arange(len(rewards)) // N
    algo = algos.get(name, **launch_args(tmp_path, name).mmrl.params)
    expected = algo.advantages(rewards, group_ids)
    got = torch.cat([sequence_advantages(e.advantages, e.action_mask) for e in experiences])
    assert torch.allclose(got, expected, atol=1e-6)
    width = max(s.action_log_probs.shape[1] for s in samples)
    old = torch.cat([torch.nn.functional.pad(s.action_log_probs, (0, width - s.action_log_probs.shape[1]))
                     for s in samples])
    mask = torch.cat([torch.nn.functional.pad(s.action_mask.float(), (0, width - s.action_mask.shape[1]))
                      for s in samples])
    want = algo.batch_stats(rewards, group_ids, expected, old, mask)
    at, popped = 0, []
    for e in experiences:  # numbers reach every sample as they are; row statistics travel with their samples
        n = e.rewards.numel()
        got_stats = pop_mmrl_fields(e)[1]
        popped.append(got_stats)
        assert set(got_stats) == set(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(got_stats[key], value[at:at + n].double())
            else:
                assert got_stats[key] == pytest.approx(value)
        at += n
    got_stats = popped[0]
    if name == "gpg":  # α = B / (B - M) over the whole step, not over one experience (which holds one group here)
        assert got_stats["alpha"] == pytest.approx(24 / (24 - 8))
    if name == "cw_grpo":  # the default scope: each sample carries its own group's moments (the CW-GRPO paper's §2.3)
        first = algo.batch_stats(rewards[:4], group_ids[:4], expected[:4], old[:4], mask[:4])
        torch.testing.assert_close(got_stats["cov_sigma"], first["cov_sigma"])
        whole = algos.get(name, stats_scope="batch").batch_stats(rewards, group_ids, expected, old, mask)
        assert float(got_stats["cov_sigma"][0]) != pytest.approx(whole["cov_sigma"])


def replay_buffer_items(experiences) -> list:
    """The samples as a policy actor's replay buffer holds them, via OpenRLHF's own ``NaiveReplayBuffer.append``
    (built without its constructor, which asks CUDA for the current device)."""
    buffer = object.__new__(NaiveReplayBuffer)
    buffer.cpu_offload, buffer.limit, buffer.items = False, 0, []
    for e in experiences:
        buffer.append(e)
    return buffer.items


@pytest.mark.parametrize("micro,whole", [(8, True), (4, True), (6, False)])
def test_gvpo_groups_stay_whole_through_the_replay_buffer_and_micro_batches(micro, whole, tmp_path):
    _, samples, experiences, _ = make_experiences(tmp_path, "gvpo")
    items = replay_buffer_items(experiences)
    trainer = object.__new__(MmrlActorPPOTrainer)
    trainer.micro_train_batch_size = micro
    batches = trainer.micro_batches(items, torch.Generator().manual_seed(0))
    assert sorted(len(b.action_mask) for b in batches) == sorted([micro] * (len(samples) // micro)
                                                                 + ([len(samples) % micro] if len(samples) % micro
                                                                    else []))
    algo = algos.get("gvpo")
    kept_whole = []
    for b in batches:
        group_ids, _ = pop_mmrl_fields(b)
        kept_whole.append(groups_are_whole(group_ids, N))
        if kept_whole[-1]:  # GVPO's loss runs on it (it refuses a batch whose group advantages do not sum to 0)
            mask = b.action_mask.float()
            algo.policy_loss(b.action_log_probs, b.action_log_probs, sequence_advantages(b.advantages, mask), mask,
                             group_ids)
    assert all(kept_whole) == whole


def test_whole_group_micro_batches_cover_every_sample_once():
    ids = [3, 3, 1, 1, 7, 7, 2, 2]
    batches = whole_group_micro_batches(ids, 4, torch.Generator().manual_seed(5))
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert all(len({ids[i] for i in b}) == 2 and len(b) == 4 for b in batches)


def test_adopt_gives_openrlhfs_trainer_mmrls_loss(tmp_path):
    args = launch_args(tmp_path, "gmpo", "--algo.rollout_correction", "seq_mask", "--algo.rollout_mask_high", "3")
    trainer = object.__new__(ActorPPOTrainer)  # as PolicyModelActor built it (its __init__ needs CUDA and vLLM)
    trainer.args = args
    adopt(trainer, args.mmrl)
    assert type(trainer) is MmrlActorPPOTrainer and isinstance(trainer.actor_loss_fn, MmrlPolicyLoss)
    assert trainer.actor_loss_fn.algo == algos.get("gmpo")
    assert trainer.actor_loss_fn.correction == RolloutCorrection("seq_mask", high=3.0)  # algo.rollout_correction
    with pytest.raises(TypeError):
        adopt(trainer, args.mmrl)  # only OpenRLHF's own class is adopted


class RolloutsWithoutVLLM(MmrlSamplesGenerator):
    """vLLM cannot run on a CPU: this stands in for the engines' generation (``_generate_vllm``), drawing prompts from
    OpenRLHF's real prompt dataloader and scoring each group from a script. Everything else is the real generator."""

    script: list[list[float]]

    def _generate_vllm(self, dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs):
        from openrlhf.trainer.ppo_utils.samples_generator import _collect_prompt_batch

        prompts, _, _, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
        rng = random.Random(len(self.script))
        out = []
        for _ in prompts:
            rewards = self.script.pop(0)  # (even, odd) samples' reward for this prompt's group
            out += [single_sample(rewards[j % 2], rng) for j in range(N)]
        return out, len(prompts), exhausted


@pytest.mark.parametrize("threshold,rounds,n_valid", [(0.6, 1, 4), (0.0, 0, 1), (0.9, 3, 6)])
def test_gpg_resamples_across_engines_until_enough_groups_are_valid(threshold, rounds, n_valid, tmp_path):
    # not colocated: with vLLM sleep mode on, the generator would wake the (absent) engines through Ray
    args = launch_args(tmp_path, "gpg", "--algo.valid_threshold", str(threshold), "--algo.max_resample", "3",
                       "--steps", "10", "--cluster.colocate", "false")
    trainer = MmrlPPOTrainer(args.actor.model_name_or_path, make_strategy(args), None, None, None, None, None,
                             max_new_tokens=8)  # OpenRLHF's real trainer: datasets, tokenizer, dataloader
    if threshold > 0:
        assert isinstance(trainer.samples_generator, MmrlSamplesGenerator)
    assert isinstance(trainer.experience_maker, MmrlExperienceMaker)
    gen = object.__new__(RolloutsWithoutVLLM)
    gen.__dict__.update(trainer.samples_generator.__dict__)
    gen.group_size, gen.valid_threshold, gen.max_resample = N, threshold, 3
    # (reward of even, odd samples) per prompt: rounds of 6 prompts with 1, 3, 0, 6 valid groups
    valid, dead = (1.0, 0.0), (0.0, 0.0)
    gen.script = [valid] + [dead] * 5 + [valid] * 3 + [dead] * 3 + [dead] * 6 + [valid] * 6
    samples, _, consumed, _ = gen.generate_samples(max_new_tokens=8)
    assert gen.resample_rounds == rounds and consumed == 6 * (rounds + 1) and len(samples) == 6 * N
    valid_flags = [len({float(s.rewards[0]) for s in samples[i:i + N]}) > 1 for i in range(0, len(samples), N)]
    if threshold > 0:  # valid groups first, then all-equal ones of the last round (as the local trainer)
        assert valid_flags == [True] * n_valid + [False] * (6 - n_valid)
    else:
        assert sum(valid_flags) == n_valid


def test_dynamic_sampling_gives_the_generator_the_every_group_valid_rule(tmp_path):
    """DAPO's dynamic sampling on any objective reaches mmrl's samples generator as GPG's rule with β_th = 1."""
    args = launch_args(tmp_path, "cispo", "--algo.dynamic_sampling", "3", "--steps", "10", "--cluster.colocate",
                       "false")
    trainer = MmrlPPOTrainer(args.actor.model_name_or_path, make_strategy(args), None, None, None, None, None,
                             max_new_tokens=8)
    gen = trainer.samples_generator
    assert (gen.valid_threshold, gen.max_resample) == (1.0, 3)


def test_overlong_shaping_is_openrlhfs_dapo_penalty_on_the_rewards_that_train():
    """mmrl's overlong shaping (both backends) against OpenRLHF's own DAPO penalty (``--reward.overlong_buffer_len``):
    the same shaped rewards, and the advantages of the shaped rewards; the experience's own rewards (logged) stay."""
    from openrlhf.trainer.ppo_utils.length_penalty import apply_overlong_penalty

    from mmrl.openrlhf.experience import GROUP_KEY, whole_batch_advantages

    lengths = torch.tensor([3, 7, 8, 5, 6, 8, 1, 2])
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    mask = (torch.arange(8)[None] < lengths[:, None]).float()
    theirs = SimpleNamespace(rewards=rewards.clone(), response_length=lengths)
    apply_overlong_penalty([theirs], max_new_tokens=8, overlong_buffer_len=4, overlong_penalty_factor=0.7)
    algo = algos.get("grpo", overlong_buffer=4, overlong_penalty=0.7).with_length_budget(8)
    torch.testing.assert_close(algo.shaped_rewards(rewards, lengths), theirs.rewards)
    experiences = [SimpleNamespace(rewards=rewards[i:i + 4].clone(), action_mask=mask[i:i + 4],
                                   action_log_probs=-torch.rand(4, 8), info={GROUP_KEY: torch.tensor([i // 4] * 4)})
                   for i in (0, 4)]
    advantages, _ = whole_batch_advantages(algo, experiences)
    torch.testing.assert_close(advantages, algo.advantages(theirs.rewards, torch.arange(8) // 4))
    assert torch.equal(torch.cat([e.rewards for e in experiences]), rewards)


class EvalWithoutVLLM(SamplesGenerator):
    """Stands in for the vLLM engines' generation during evaluation: draws the prompts from the dataloader OpenRLHF's
    ``generate_eval_samples`` iterates, records the sampling it was asked for, and reports each response's
    correctness as mmrl's reward function does (``mmrl/accuracy``), with a summed reward of 2 (accuracy + format)."""

    calls: list[dict]

    def _generate_vllm(self, dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs):
        from openrlhf.trainer.ppo_utils.samples_generator import _collect_prompt_batch

        prompts, _, _, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
        n = generate_kwargs["n_samples_per_prompt"]
        self.calls.append({**generate_kwargs, "prompts": len(prompts)})
        rng = random.Random(len(self.calls))
        out = []
        for i, _ in enumerate(prompts):
            for j in range(n):
                e = single_sample(2.0, rng)
                e.info["mmrl/accuracy"] = torch.tensor([float(i % 2 == 0 and j == 0)])  # even problems: 1st right
                out.append(e)
        return out, len(prompts), exhausted


def test_eval_sets_run_with_their_own_sampling_and_score_accuracy_not_reward(tmp_path):
    sets = ('[{name: greedy, max_new_tokens: 6}, '
            '{name: sampled, samples: 2, temperature: 0.8, top_p: 0.9, metric: avg@2}]')
    args = launch_args(tmp_path, "grpo", "--cluster.colocate", "false", "--evaluation.sets", sets,
                       "--run.eval_every", "1")
    specs = args.mmrl.eval_sets
    assert [s["name"] for s in specs] == ["greedy", "sampled"] and args.eval.dataset == specs[0]["file"]
    trainer = MmrlPPOTrainer(args.actor.model_name_or_path, make_strategy(args), None, None, None, None, None,
                             max_new_tokens=8, temperature=1.0, top_p=1.0)
    gen = object.__new__(EvalWithoutVLLM)
    gen.__dict__.update(trainer.samples_generator.__dict__)
    gen.calls = []
    trainer.samples_generator = gen
    logs = trainer.evaluate(1, **trainer.generate_kwargs)
    problems = int(logs["greedy/problems"])
    assert problems == logs["sampled/problems"] > 1  # both sets: the task's held-out split
    asked = {(c["temperature"], c["top_p"], c["max_new_tokens"], c["n_samples_per_prompt"]) for c in gen.calls}
    assert asked == {(0.0, 1.0, 6, 1), (0.8, 0.9, args.rollout.max_new_tokens, 2)}  # default: the rollout's budget
    even = (problems + 1) // 2 / problems  # the stand-in solves even problems with its first sample only
    assert logs["greedy/pass@1"] == pytest.approx(even)
    assert logs["sampled/avg@2"] == pytest.approx(even / 2) and logs["sampled/pass@2"] == pytest.approx(even)
    assert logs["average"] == pytest.approx((even + even / 2) / 2)  # each set's headline metric
    assert gen.eval_dataloader is trainer.eval_dataloader  # restored after the sets


def test_prepare_policy_freezes_routers_before_deepspeed_builds_its_optimizer():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from mmrl import moe

    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=32,
                                               moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                                               num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
                                               attention_dropout=0.1))
    prepare_policy(model, freeze_router=True)
    routers = {id(p) for _, r in moe.find_routers(model) for p in r.parameters()}
    optimised = {id(p) for group in get_optimizer_grouped_parameters(model, 0.0) for p in group["params"]}
    assert routers and not routers & optimised and len(optimised) > 0
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert model.config.attention_dropout == 0.1 and model.model.layers[0].self_attn.attention_dropout == 0.0
    dense = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no MoE router"):
        prepare_policy(dense, freeze_router=True)


def test_the_loss_keeps_the_largest_token_kl_and_the_maker_the_advantage_spread(tmp_path):
    logp, old, mask, group_ids, rewards = loss_inputs(seed=5)
    algo = algos.get("grpo")
    loss_fn = MmrlPolicyLoss(algo)
    loss_fn.bind(MicroBatch(group_ids, {}, scale=1.0))
    loss_fn(logp, old, algo.advantages(rewards, group_ids)[:, None] * mask, action_mask=mask)
    kl = kl_k3(logp.detach(), old)[mask > 0]
    assert loss_fn.last_kl_max == pytest.approx(float(kl.max())) and loss_fn.last_kl_max > float(kl.mean())

    maker, _, _, _ = make_experiences(tmp_path, "grpo")
    rewards = torch.tensor([r for g in GROUP_REWARDS for r in g], dtype=torch.float32)
    group_ids = torch.arange(len(rewards)) // N
    assert maker.spread == pytest.approx(advantage_spread(algo.advantages(rewards, group_ids), group_ids))
    assert 0 < maker.spread["adv_zero_spread"] < 1  # GROUP_REWARDS has groups with and without a spread
