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
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from openrlhf_stubs import openrlhf_importable

from mmrl.algos.gvpo import gvpo_weights
from mmrl.batch import Group, Response
from mmrl.errors import UserError
from mmrl.openrlhf.grouping import runs_of_groups
from mmrl.openrlhf.launch import resolve_launch
from mmrl.openrlhf.replay import SampleReplay, stored_fields
from mmrl.replay import ReplayStore
from mmrl.rewards.base import RewardResult
from mmrl.train import parse_config
from mmrl.trainer.collect import ReplayHistory
from mmrl.trainer.local import build_trainer
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
    assert args.mmrl.replay_historical == K
    maker = MakerOnOneActor(None, None, None, None, None, SimpleNamespace(args=args),
                            SimpleNamespace(pad_token_id=0), mmrl_spec=args.mmrl)
    replay = maker.replay = SampleReplay(N, K)
    rng = random.Random(0)
    prompts = range(4)

    def responses(n: int) -> list[Response]:
        return [Response([rng.randrange(10, 200) for _ in range(rng.randint(1, 6))],
                         reward=RewardResult(float(rng.random() < 0.5))) for _ in range(n)]

    def as_samples(index: int, rs: list[Response]) -> list[Experience]:
        return [sample(f"prompt {index}", r.token_ids, r.reward.score, trainer.rollouts.prompt_ids(index)) for r in rs]

    policy_0 = copy.deepcopy(trainer.model)
    first = {i: responses(N) for i in prompts}
    for i in prompts:  # the local trainer's sample_groups stores a step's fresh responses
        trainer.rollouts.history.add(i, first[i])
    maker.policy = policy_0
    replay.start_step()
    maker.make_experience_batch(replay.mix([s for i in prompts for s in as_samples(i, first[i])]))
    assert replay.metrics["replay/responses"] == 0

    perturbed(trainer.model, seed=1)  # π_1: the policy that starts step 2
    second = {i: responses(N - K) for i in prompts}
    assert all(replay.fresh_count(f"prompt {i}", f"label of prompt {i}") == N - K for i in prompts)
    groups = [Group(i, trainer.task.train[i], trainer.rollouts.prompt_ids(i),
                    second[i] + trainer.rollouts.history.take(i, K))
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


def same_fields(a, b) -> bool:
    """Two values equal field for field, tensors by dtype, shape and content."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same_fields(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_fields(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def filled_replay() -> SampleReplay:
    """A store after one step of prompts A and B, each stored sample with its behaviour log-probs (float32 and
    bf16), its group id and a field its own step computed."""
    replay = SampleReplay(N, K)
    replay.start_step()
    for s in replay.mix([sample(p, [10, 20 + j, 30 + j][: 1 + j % 3], float(j % 2)) for p in "AB" for j in range(N)]):
        width = s.action_mask.shape[1]
        s.action_log_probs = -torch.rand(1, width, dtype=torch.float32 if s.prompts[0] == "A" else torch.bfloat16)
        s.info["mmrl_group_id"] = torch.tensor([ord(s.prompts[0])])
        s.advantages = torch.ones(1, width)
    return replay


def second_round(replay: SampleReplay) -> list:
    replay.start_step()
    fresh = [sample(p, [11, 40 + j], float(j)) for p in "BAC" for j in range(replay.fresh_count(p, f"label of {p}"))]
    return replay.mix(fresh)


def test_a_saved_store_restores_each_prompts_samples_and_replays_as_the_uninterrupted_one(tmp_path):
    replay = filled_replay()
    tag = tmp_path / "_actor" / "global_step1"
    tag.mkdir(parents=True)
    saved = replay.save(tag)
    assert saved == tag / "mmrl_replay" and [p.name for p in tag.iterdir()] == ["mmrl_replay"]
    assert sorted(p.name for p in saved.iterdir()) == ["SHA256SUMS", "state.json", "tensors.safetensors"]
    assert "pickle" not in (saved / "state.json").read_text()

    restored = SampleReplay(N, K)
    restored.restore(tag, Experience)
    assert list(restored.store.by_prompt) == list(replay.store.by_prompt)
    for key, samples in replay.store.by_prompt.items():
        back = list(restored.store.by_prompt[key])
        assert len(back) == len(samples) == N and all(type(s) is Experience for s in back)
        for original, copy_ in zip(samples, back, strict=True):
            assert same_fields(stored_fields(original), stored_fields(copy_))
            assert copy_.advantages is None  # what its own step computed is not kept
        assert restored.store.by_prompt[key].maxlen == N

    # the next step, from the store in memory and from the restored one: the same groups, the same behaviour
    uninterrupted, resumed = second_round(replay), second_round(restored)
    assert len(uninterrupted) == len(resumed) == 3 * N
    assert all(same_fields(stored_fields(a), stored_fields(b)) for a, b in zip(uninterrupted, resumed, strict=True))
    assert [same_fields(replay.replayed[id(a)].action_log_probs, restored.replayed[id(b)].action_log_probs)
            for a, b in zip(uninterrupted, resumed, strict=True) if id(a) in replay.replayed] == [True] * 2 * K

    replay.save(tag)  # a second save of the same tag replaces the first, leaving nothing beside it
    assert [p.name for p in tag.iterdir()] == ["mmrl_replay"]
    (saved / "notes.txt").write_text("mine")  # a user's file in the store's folder outlives a save of the tag
    replay.save(tag)
    assert sorted(p.name for p in saved.iterdir()) == ["SHA256SUMS", "notes.txt", "state.json", "tensors.safetensors"]
    again = SampleReplay(N, K)
    again.restore(tag, Experience)
    assert list(again.store.by_prompt) == list(replay.store.by_prompt)


def test_a_missing_damaged_or_foreign_store_is_refused_in_one_line_naming_it(tmp_path):
    tag = tmp_path / "global_step1"
    tag.mkdir()
    with pytest.raises(UserError, match="mmrl_replay is missing") as err:
        SampleReplay(N, K).restore(tag, Experience)
    assert str(tag / "mmrl_replay") in str(err.value) and "\n" not in str(err.value)

    filled_replay().save(tag)
    with pytest.raises(UserError, match="not this run's GVPO replay store") as err:
        SampleReplay(N, 1).restore(tag, Experience)  # another run's layout: groups replaying 1
    assert str(tag / "mmrl_replay") in str(err.value) and "\n" not in str(err.value)

    tensors = tag / "mmrl_replay" / "tensors.safetensors"
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 1
    tensors.write_bytes(bytes(data))
    with pytest.raises(UserError, match="is damaged") as err:
        SampleReplay(N, K).restore(tag, Experience)
    assert str(tag / "mmrl_replay") in str(err.value) and "tensors.safetensors" in str(err.value)
    assert "\n" not in str(err.value)


def resumed_launch(out: Path, *flags: str):
    return resolve_launch(parse_config(["--backend", "openrlhf", "--algo", "gvpo", "--out", str(out), "--resume",
                                        "--cluster.gpus_per_node", "1", "--cluster.vllm_engines", "1",
                                        "--rollout.prompts_per_step", "4", "--rollout.samples_per_prompt", str(N),
                                        *flags]), write=False)


def test_a_resume_with_replay_checks_the_store_of_the_checkpoint_deepspeed_loads_before_ray_starts(
        tmp_path, embedded_model_dir):
    actor = tmp_path / "checkpoints" / "_actor"
    for tag in ("global_step1", "global_step2"):
        (actor / tag).mkdir(parents=True)
    (actor / "latest").write_text("global_step2")
    filled_replay().save(actor / "global_step1")  # an older tag's store is not the one resumed
    with pytest.raises(UserError) as err:
        resumed_launch(tmp_path, "--rollout.replay_historical", str(K))
    assert str(err.value).startswith(f"{actor / 'global_step2' / 'mmrl_replay'} is missing")
    assert resumed_launch(tmp_path).args.mmrl.replay_historical == 0  # replay off: no store is read
    filled_replay().save(actor / "global_step2")
    assert resumed_launch(tmp_path, "--rollout.replay_historical", str(K)).args.ckpt.load_enable
