"""GVPO's historical replay (``rollout.replay_historical``): the store's rule (mmrl/replay.py), the openrlhf backend's
generator and experience maker around it (mmrl/openrlhf/replay.py), and the same weights as the local trainer's on
the same stored responses and rewards.

vLLM cannot run here: where a test needs rollouts, a stand-in below mmrl's generator answers each dispatched prompt
with scripted responses (said in that test); everything above it is mmrl's and OpenRLHF's real code. π_old comes
from OpenRLHF's own ``Actor`` forward, the one the policy actors run, in this process.
"""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest
import torch
from openrlhf_stubs import openrlhf_importable

from mmrl.algos.gvpo import gvpo_weights
from mmrl.batch import Group, Response
from mmrl.openrlhf.grouping import runs_of_groups
from mmrl.openrlhf.launch import resolve_launch
from mmrl.openrlhf.replay import SampleReplay
from mmrl.replay import ReplayStore
from mmrl.rewards.base import RewardResult
from mmrl.train import parse_config
from mmrl.trainer.local import ReplayHistory, build_trainer
from mmrl.trainer.rollout import response_logprobs

with openrlhf_importable():
    from openrlhf.models import Actor
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.samples_generator import _collect_prompt_batch

    from mmrl.openrlhf.experience import MmrlExperienceMaker
    from mmrl.openrlhf.loss import sequence_advantages
    from mmrl.openrlhf.sampling import EngineDispatch, MmrlSamplesGenerator

N, K = 4, 2  # group size, replayed responses per group


def test_a_prompt_replays_its_k_most_recent_responses_once_k_are_stored():
    store = ReplayStore(4)
    assert store.take("x", 2) == [] and store.fresh_count("x", 4, 2) == 4
    store.add("x", [1])
    assert store.take("x", 2) == [] and store.fresh_count("x", 4, 2) == 4  # fewer than k: nothing replayed
    store.add("x", [2, 3])
    assert store.take("x", 2) == [2, 3] and store.fresh_count("x", 4, 2) == 2
    store.add("x", [4, 5, 6])
    assert list(store.by_prompt["x"]) == [3, 4, 5, 6] and len(store) == 4  # bounded: capacity per prompt
    assert store.take("x", 2) == [5, 6] and store.take("x", 0) == [] and store.take("y", 2) == []
    empty = ReplayStore(0)
    empty.add("x", [1, 2, 3])
    assert len(empty) == 0


def test_the_local_trainers_history_is_the_shared_store_and_marks_replayed_responses():
    history = ReplayHistory(4)
    assert isinstance(history, ReplayStore)
    history.add(7, [Response([1], reward=RewardResult(1.0)), Response([2], reward=RewardResult(0.0))])
    taken = history.take(7, 2)
    assert [r.token_ids for r in taken] == [[1], [2]] and all(r.historical for r in taken)
    assert not any(r.historical for r in history.by_prompt[7])  # the stored ones stay fresh
    restored = ReplayHistory(4)
    restored.load_state_dict(history.state_dict())
    assert [r.token_ids for r in restored.take(7, 2)] == [[1], [2]]


def test_runs_of_groups_cut_samples_by_each_prompts_count():
    assert runs_of_groups(list("aabbbbcc"), {"a": 2, "b": 4, "c": 2}.get) == [(0, 2), (2, 6), (6, 8)]
    with pytest.raises(ValueError, match="not one group"):
        runs_of_groups(list("abbb"), {"a": 2, "b": 2}.get)
    with pytest.raises(ValueError, match="not one group"):
        runs_of_groups(list("aaa"), {"a": 2}.get)


def sample(prompt: str, tokens: list[int], reward: float, prompt_ids: list[int] | None = None) -> Experience:
    """One response as OpenRLHF's SamplesGenerator builds it (batch of one, action mask over sequences[1:])."""
    prompt_ids = prompt_ids or [3, 4, 5]
    total = len(prompt_ids) + len(tokens)
    action_mask = torch.zeros(1, total - 1, dtype=torch.long)
    action_mask[0, len(prompt_ids) - 1:] = 1
    return Experience(sequences=torch.tensor([prompt_ids + tokens]), attention_mask=torch.ones(1, total,
                                                                                               dtype=torch.long),
                      action_mask=action_mask, rewards=torch.tensor([reward]),
                      response_length=torch.tensor([len(tokens)]), truncated=torch.tensor([False]),
                      total_length=torch.tensor([float(total)]), prompts=[prompt], labels=[f"label of {prompt}"],
                      info={"reward": torch.tensor([reward])})


class EnginesWithoutVLLM(EngineDispatch):
    """Stands in for the vLLM engines below mmrl's generator: each dispatched prompt gets ``n`` scripted responses
    (token ``[step, j]``, reward ``j``), and the prompts' groups come back in reverse order (engines finish in any
    order)."""

    asked: list
    step = 0

    def _dispatch_prompts_to_vllm(self, prompts, labels, *, images=None, **generate_kwargs):
        n = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
        self.asked += [(p, n) for p in prompts]
        return [[sample(p, [10 + self.step, 20 + j], float(j)) for j in range(n)] for p in prompts]

    def _generate_vllm(self, dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs):
        prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
        refs = self._dispatch_prompts_to_vllm(prompts, labels, images=images, **generate_kwargs)
        return [s for ref in reversed(refs) for s in ref], len(prompts), exhausted


class ScriptedGenerator(MmrlSamplesGenerator, EnginesWithoutVLLM):
    pass


def test_the_generator_asks_fewer_responses_of_stored_prompts_and_completes_their_groups():
    steps = [["A", "B", "C"], ["A", "B", "D"], ["A", "D", "E"]]
    loader = [("data", p, [f"label of {x}" for x in p], [None] * 3) for p in steps]
    args = SimpleNamespace(rollout=SimpleNamespace(batch_size=3, n_samples_per_prompt=N, vllm_generate_batch_size=3),
                           vllm=SimpleNamespace(enable_sleep=False),
                           algo=SimpleNamespace(dynamic_filtering_enable=False))
    replay = SampleReplay(N, K)
    gen = ScriptedGenerator(strategy=SimpleNamespace(args=args), prompts_dataloader=loader,
                            eval_dataloader=[("data", ["A", "B", "C"], ["x"] * 3, [None] * 3)], tokenizer=None,
                            vllm_engines=[], group_size=N, valid_threshold=0.0, max_resample=0, replay=replay)
    gen.asked = []
    history: dict[str, list] = {}  # every fresh sample of each prompt, in order
    for step, prompts in enumerate(steps):
        gen.step, gen.asked = step, []
        samples, _, consumed, _ = gen.generate_samples()
        stored = {p: history.get(p, []) for p in prompts}
        # a prompt with K stored responses asks the engines for N - K fresh ones
        assert sorted(gen.asked) == sorted((p, N - K if len(stored[p]) >= K else N) for p in prompts)
        assert consumed == 3 and len(samples) == 3 * N
        for start in range(0, len(samples), N):  # whole groups of one prompt: fresh first, replayed after
            group = samples[start:start + N]
            prompt = group[0].prompts[0]
            assert all(s.prompts[0] == prompt for s in group)
            replays = len(stored[prompt]) >= K
            fresh, replayed = (group[:N - K], group[N - K:]) if replays else (group, [])
            assert all(int(s.sequences[0, 3]) == 10 + step for s in fresh)
            expected = stored[prompt][-K:] if replays else []
            assert [s.sequences.tolist() for s in replayed] == [s.sequences.tolist() for s in expected]
            assert [float(s.rewards) for s in replayed] == [float(s.rewards) for s in expected]
            assert all(r is not e and r.action_log_probs is None for r, e in zip(replayed, expected, strict=True))
            history.setdefault(prompt, []).extend(fresh)
    assert [len(v) for v in replay.store.by_prompt.values()] == [N, N, N, N, N]  # A: 4 + 2 + 2 fresh, kept 4
    gen.asked = []
    evaluation = gen.generate_eval_samples(n_samples_per_prompt=3)  # evaluation replays nothing
    assert gen.asked == [("A", 3), ("B", 3), ("C", 3)] and len(evaluation) == 9


def test_the_step_budget_counts_steps_not_the_end_of_each_pass_over_the_prompts():
    """A prompt set smaller than the run is passed over several times (OpenRLHF's episodes); the call that finds a
    pass exhausted returns no samples and must not use up one of ``run.steps``."""
    args = SimpleNamespace(rollout=SimpleNamespace(batch_size=2, n_samples_per_prompt=N, vllm_generate_batch_size=2),
                           vllm=SimpleNamespace(enable_sleep=False),
                           algo=SimpleNamespace(dynamic_filtering_enable=False))
    gen = ScriptedGenerator(strategy=SimpleNamespace(args=args), prompts_dataloader=[("data", ["A", "B"], ["a", "b"],
                                                                                      [None] * 2)],
                            eval_dataloader=[], tokenizer=None, vllm_engines=[], group_size=N, valid_threshold=0.0,
                            max_resample=0, max_steps=2)
    gen.asked = []
    sizes = [len(gen.generate_samples()[0]) for _ in range(4)]
    assert sizes == [2 * N, 0, 2 * N, 0] and gen.steps_done == 2


class MakerOnOneActor(MmrlExperienceMaker):
    """mmrl's experience maker with π_old computed in this process by OpenRLHF's ``Actor`` forward (what the policy
    actors run) of ``policy``."""

    policy: torch.nn.Module

    def make_experience(self, samples_list):
        actor = Actor(self.policy)
        actor.packing_samples = False  # set by Actor for a model path; a module passed in keeps its own settings
        with torch.no_grad():
            for s in samples_list:
                s.action_log_probs = actor(s.sequences, s.action_mask, s.attention_mask)
        return samples_list


def perturbed(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=generator))
    return model


def test_replayed_weights_on_openrlhf_equal_the_local_trainers(tmp_path, embedded_model_dir, small_config):
    """The same stored responses and rewards through both backends: step 1 fills the stores at policy π_0; the policy
    moves to π_1; step 2 generates N - K responses per prompt and replays K. Rewards, advantages, π_θ' (recomputed at
    π_1 for replayed responses too, as the local trainer does) and GVPO's weights under a further policy π_θ are the
    same tensors on both sides."""
    cfg = small_config(tmp_path / "local", **{"algo.name": "gvpo", "rollout.replay_historical": K,
                                              "rollout.samples_per_prompt": N, "task.max_operand": 1,
                                              "task.eval_fraction": 0.0})
    trainer = build_trainer(cfg)  # 4 problems, 4 prompts per step
    args = resolve_launch(parse_config(["--backend", "openrlhf", "--algo", "gvpo", "--out", str(tmp_path / "orlhf"),
                                        "--cluster.gpus_per_node", "1", "--cluster.vllm_engines", "1",
                                        "--rollout.prompts_per_step", "4", "--rollout.samples_per_prompt", str(N),
                                        "--rollout.replay_historical", str(K)]), write=False).args
    assert args.mmrl["replay_historical"] == K
    maker = MakerOnOneActor(None, None, None, None, None, SimpleNamespace(args=args),
                            SimpleNamespace(pad_token_id=0), mmrl_spec=args.mmrl)
    replay = maker.replay = SampleReplay(N, K)
    rng = random.Random(0)
    prompts = range(4)

    def responses(n: int) -> list[Response]:
        return [Response([rng.randrange(10, 200) for _ in range(rng.randint(1, 6))],
                         reward=RewardResult(float(rng.random() < 0.5))) for _ in range(n)]

    def as_samples(index: int, rs: list[Response]) -> list[Experience]:
        return [sample(f"prompt {index}", r.token_ids, r.reward.score, trainer.prompt_ids(index)) for r in rs]

    policy_0 = copy.deepcopy(trainer.model)
    first = {i: responses(N) for i in prompts}
    for i in prompts:  # the local trainer's sample_groups stores a step's fresh responses
        trainer.history.add(i, first[i])
    maker.policy = policy_0
    replay.start_step()
    maker.make_experience_batch(replay.mix([s for i in prompts for s in as_samples(i, first[i])]))
    assert replay.metrics["replay/responses"] == 0

    perturbed(trainer.model, seed=1)  # π_1: the policy that starts step 2
    second = {i: responses(N - K) for i in prompts}
    assert all(replay.fresh_count(f"prompt {i}", f"label of prompt {i}") == N - K for i in prompts)
    groups = [Group(i, trainer.task.train[i], trainer.prompt_ids(i), second[i] + trainer.history.take(i, K))
              for i in prompts]
    batch, _ = trainer.prepare_batch(groups)
    maker.policy = trainer.model
    replay.start_step()
    experiences = maker.make_experience_batch(replay.mix([s for i in prompts for s in as_samples(i, second[i])]))

    rewards = torch.cat([e.rewards for e in experiences])
    advantages = torch.cat([sequence_advantages(e.advantages, e.action_mask) for e in experiences])
    group_ids = torch.cat([e.info["mmrl_group_id"] for e in experiences]).long()
    seq_old = torch.cat([(e.action_log_probs * e.action_mask).sum(1) for e in experiences])
    local_old = (batch.old_logprobs * batch.response_mask).sum(1)
    torch.testing.assert_close(rewards, batch.rewards)
    torch.testing.assert_close(group_ids, batch.group_ids)
    torch.testing.assert_close(advantages, batch.advantages)
    torch.testing.assert_close(seq_old, local_old, atol=1e-4, rtol=1e-5)

    policy = perturbed(copy.deepcopy(trainer.model), seed=2)  # π_θ during the update
    actor = Actor(policy)
    actor.packing_samples = False
    with torch.no_grad():
        seq = torch.cat([(actor(e.sequences, e.action_mask, e.attention_mask) * e.action_mask).sum(1)
                         for e in experiences])
        local_seq = (response_logprobs(policy, batch, 1.0)[0] * batch.response_mask).sum(1)
        behaviour = (response_logprobs(policy_0, batch, 1.0)[0] * batch.response_mask).sum(1)
    beta = trainer.algo.beta
    weights = gvpo_weights(seq, seq_old, advantages, group_ids, beta)
    local_weights = gvpo_weights(local_seq, local_old, batch.advantages, batch.group_ids, beta)
    torch.testing.assert_close(weights, local_weights, atol=1e-4, rtol=1e-4)
    replayed = torch.tensor([j >= N - K for _ in prompts for j in range(N)])
    assert (weights[replayed] - advantages[replayed]).abs().max() > 1e-3  # π_θ moved: the weights are not A alone
    # π_θ' of a replayed response is the current policy's, not the behaviour policy's that sampled it
    assert (local_old[replayed] - behaviour[replayed]).abs().min() > 1e-4
    assert replay.metrics["replay/responses"] == 4 * K
    shift = float((local_old[replayed] - behaviour[replayed]).mean())
    assert replay.metrics["replay/logprob_shift"] == pytest.approx(shift, abs=1e-3)


def test_dynamic_filtering_is_refused_with_replay(tmp_path, embedded_model_dir):
    cfg = parse_config(["--backend", "openrlhf", "--algo", "gvpo", "--out", str(tmp_path), "--cluster.gpus_per_node",
                        "1", "--cluster.vllm_engines", "1", "--rollout.prompts_per_step", "4",
                        "--rollout.samples_per_prompt", str(N), "--rollout.replay_historical", str(K),
                        "--cluster.extra", '{"algo.dynamic_filtering_enable": true}'])
    with pytest.raises(ValueError) as err:
        resolve_launch(cfg, write=False)
    assert "cannot be combined with --algo.dynamic_filtering_enable" in str(err.value) and "\n" not in str(err.value)
