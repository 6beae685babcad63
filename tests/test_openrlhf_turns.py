"""The agent turn layout on the openrlhf backend against the local backend's, on the same episodes.

The same games, reset seeds and scripted player run through both backends' code: the local trainer's episode driver
(``run_episodes`` in the turn layout, ``Episode.turn_responses``, ``collate``, ``Algorithm.turn_advantages`` over
``turn_steps``) and the openrlhf side's (the turn agent executor inside a rollout engine, mmrl's samples generator
turning episodes into rows, mmrl's experience maker). The player stands in for the vLLM engine: it answers every
prompt with an ALFWorld command picked from the prompt's text, or with no action at all (the nth time a prompt is
seen gets the nth pick, so the episodes of a group part ways), which both sides see in the same order. Every row
must be equal: prompt and action tokens, reward, group, and the advantage each objective gives it.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from openrlhf_stubs import openrlhf_importable

pytest.importorskip("alfworld")
pytest.importorskip("mmrl.envs.alfworld")

import mmrl.algos as algos  # noqa: E402
from mmrl.batch import Group, collate  # noqa: E402
from mmrl.envs.episode import TurnRenderer  # noqa: E402
from mmrl.models import load_tokenizer  # noqa: E402
from mmrl.openrlhf.grouping import GROUP_KEY, lay_out_turns  # noqa: E402
from mmrl.openrlhf.launch import episode_rows, resolve_launch  # noqa: E402
from mmrl.openrlhf.vllm_stand_in import CompletionOutput, RequestOutput, SamplingParams  # noqa: E402
from mmrl.tasks import get_task  # noqa: E402
from mmrl.train import parse_config  # noqa: E402
from mmrl.trainer.episodes import Episode, run_episodes  # noqa: E402
from mmrl.trainer.learner import turn_steps  # noqa: E402
from mmrl.trainer.turn_sampler import Turn  # noqa: E402

with openrlhf_importable():
    from mmrl.envs.adapters.openrlhf_agent import AgentExecutor as EpisodeAgentExecutor
    from mmrl.openrlhf.experience import MmrlExperienceMaker
    from mmrl.openrlhf.loss import sequence_advantages
    from mmrl.openrlhf.sampling import MmrlSamplesGenerator
    from mmrl.openrlhf.turns import TURNS_KEY, AgentExecutor

AGENT = "embedded:tiny-qwen2-agent"
GAMES, EPISODES, STEPS, MAX_LENGTH = 2, 3, 4, 4096
# None: a turn without an action tag, which the env penalises (-0.1), so that returns differ within a group
COMMANDS = ("go to countertop 1", None, "go to cabinet 1", "look", None, "open drawer 1", "go to sinkbasin 1")
TASK_OPTIONS = {"n_per_type": 2, "n_eval_per_type": 1, "max_eval_games": 2, "max_steps": STEPS,
                "task_types": "pick_and_place"}


class Player:
    """A deterministic stand-in for the policy: the command for a prompt depends on its text and on how often this
    player has been asked that very prompt before."""

    def __init__(self, tokenizer):
        self.tokenizer, self.seen = tokenizer, Counter()

    def turn_tokens(self, prompt_ids: list[int]) -> tuple[str, list[int]]:
        text = self.tokenizer.decode(prompt_ids)
        pick = zlib.crc32(text.encode()) + self.seen[text]
        self.seen[text] += 1
        command = COMMANDS[pick % len(COMMANDS)]
        action = "<think>try</think>" + (f"<action>{command}</action>" if command else "no idea")
        return action, self.tokenizer(action, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    def policy(self, episodes):  # the local driver's policy: all running episodes of a turn at once
        turns = []
        for ep in episodes:
            text, tokens = self.turn_tokens(ep.prompt_ids)
            turns.append(Turn(tokens, text, True))
        return turns

    async def generate(self, prompt_ids, params):  # a rollout engine's generate, as vLLM answers it
        _, tokens = self.turn_tokens(list(prompt_ids))
        finish = "stop"
        if len(tokens) > params.max_tokens:
            tokens, finish = tokens[:params.max_tokens], "length"
        return RequestOutput("r", list(prompt_ids), [CompletionOutput(0, self.tokenizer.decode(tokens), tokens,
                                                                     finish)])


def local_rows(task, tokenizer, algo):
    """The local trainer's turn rows of GAMES groups of EPISODES episodes (its sample_episode_groups and
    prepare_batch, on the scripted player)."""
    renderer = TurnRenderer(tokenizer, task.system_prompt)
    player, groups, played = Player(tokenizer), [], 0
    for game in range(GAMES):
        episodes = [Episode(task.make_env(task.train[game], "turn"), seed=game, layout="turn")
                    for _ in range(EPISODES)]
        run_episodes(episodes, renderer, player.policy, MAX_LENGTH)
        responses = []
        for ep in episodes:
            responses += ep.turn_responses(played)
            played += 1
        groups.append(Group(game, task.train[game], episodes[0].turns[0].prompt_ids, responses))
    batch = collate(groups, tokenizer.pad_token_id)
    rows = [row[mask.bool()].tolist() for row, mask in zip(batch.input_ids, batch.attention_mask, strict=True)]
    steps = [step_of(r.step) for g in groups for r in g.responses]
    return rows, batch.rewards, batch.group_ids, algo.turn_advantages(batch.rewards, batch.group_ids,
                                                                      turn_steps(groups)), steps


def step_of(step) -> tuple:
    """What a turn row says about its step, less the episode's number (each backend numbers episodes its own way)."""
    return step.index, step.reward, step.anchor, step.penalty


def openrlhf_rows(task, tokenizer, args):
    """The same episodes through the turn agent executor (one episode at a time, as a rollout engine runs one
    request per sample), mmrl's samples generator and experience maker."""
    player, executor = Player(tokenizer), AgentExecutor(env_workers=0)
    generator = object.__new__(MmrlSamplesGenerator)  # no engines or data loaders: the engine is the player
    generator.group_size, generator.turns = EPISODES, {}
    labels = episode_rows(task, task.train[:GAMES], 0, "turn")
    episodes = []
    for game, label in enumerate(labels):
        assert label["seed"] == game  # the local side's reset seed of the game
        label = json.dumps({k: v for k, v in label.items() if k != "messages"})
        for _ in range(EPISODES):
            response = asyncio.run(executor.execute("", label, SamplingParams(max_tokens=64, logprobs=None),
                                                    MAX_LENGTH, tokenizer, SimpleNamespace(
                                                        generate=player.generate)))
            assert len(response[TURNS_KEY]) == response["extra_logs"]["turns"]
            episodes.append(generator._process_response_into_experience(response, max_len=MAX_LENGTH))
    steps = [step_of(step) for e in episodes for _, step in generator.turns[id(e)]]
    rows = lay_out_turns([generator.turns.pop(id(e)) for e in episodes], EPISODES)
    maker = MmrlExperienceMaker(None, None, None, None, None, SimpleNamespace(args=args),
                                SimpleNamespace(pad_token_id=tokenizer.pad_token_id), mmrl_spec=args.mmrl)
    experiences = maker.split_rollout_samples(rows)
    for e in experiences:  # the policy's forward would give π_old here; the advantages do not read it
        e.action_log_probs = torch.zeros(e.action_mask.shape)
    return maker.compute_advantages_and_returns(experiences), steps


# verl-agent's order for the invalid-action penalty (the ALFWorld recipes): the penalties must reach both backends
VERL_AGENT = ("--algo.episode_scope", "turn", "--algo.penalty_scope", "step")


@pytest.mark.parametrize("name,flags", [("gigpo", ()), ("grpo", ()), ("gmpo", ()), ("gigpo", VERL_AGENT)],
                         ids=["gigpo", "grpo", "gmpo", "gigpo-penalty-step"])
def test_turn_rows_and_advantages_equal_the_local_backends(name, flags, tmp_path):
    task = get_task("alfworld", **TASK_OPTIONS)
    tokenizer = load_tokenizer(AGENT)
    cfg = parse_config(["--backend", "openrlhf", "--task", "alfworld", "--algo", name, "--model", AGENT, *flags,
                        "--rollout.agent_layout", "turn", "--rollout.prompts_per_step", str(GAMES),
                        "--rollout.samples_per_prompt", str(EPISODES), "--optim.micro_batch_size", "1",
                        "--cluster.gpus_per_node", "2", "--cluster.vllm_engines", "2", "--out", str(tmp_path / "r"),
                        *[f"--task.{k}={v}" for k, v in TASK_OPTIONS.items()]])
    args = resolve_launch(cfg, write=False).args
    algo = algos.get(name, **args.mmrl.params)
    want_rows, want_rewards, want_groups, want_adv, want_steps = local_rows(task, tokenizer, algo)
    shares, got_steps = openrlhf_rows(task, tokenizer, args)
    # each turn's env reward, invalid-action penalty and anchor state, episode by episode in play order
    assert got_steps == want_steps and any(penalty for *_, penalty in want_steps)
    assert len(shares) == 2  # one experience per policy rank
    got_rows = [row[mask.bool()].tolist() for e in shares for row, mask in zip(e.sequences, e.attention_mask,
                                                                                strict=True)]
    assert len(want_rows) > GAMES * EPISODES  # turns, not episodes
    assert got_rows == want_rows
    assert torch.equal(torch.cat([e.rewards for e in shares]).float(), want_rewards.float())
    assert torch.equal(torch.cat([e.info[GROUP_KEY].reshape(-1) for e in shares]).long(), want_groups.long())
    got_adv = torch.cat([sequence_advantages(e.advantages, e.action_mask) for e in shares])
    torch.testing.assert_close(got_adv.float(), want_adv.float(), atol=1e-6, rtol=1e-6)
    assert want_adv.abs().sum() > 0  # the player's episodes differ: the case carries signal
    if flags:  # the player's malformed turns make the penalty's place matter
        _, _, _, by_episode, _ = local_rows(task, tokenizer, algos.get(name, episode_scope="turn"))
        assert not torch.allclose(want_adv, by_episode)


def test_the_launch_plays_the_turn_layout_and_counts_mini_batches_in_turns(tmp_path):
    from mmrl.errors import UserError
    from mmrl.openrlhf.grouping import rank_shares
    from mmrl.run.config import validate

    base = ["--backend", "openrlhf", "--task", "alfworld", "--algo", "gigpo", "--model", AGENT,
            "--rollout.agent_layout", "turn", "--rollout.prompts_per_step", "2", "--rollout.samples_per_prompt", "4",
            "--cluster.gpus_per_node", "2", "--cluster.vllm_engines", "2", "--optim.micro_batch_size", "4",
            "--out", str(tmp_path / "r"), *[f"--task.{k}={v}" for k, v in TASK_OPTIONS.items()]]
    launch = resolve_launch(parse_config([*base, "--optim.minibatch_turns", "16"]), write=True)
    assert launch.args.train.agent_func_path.endswith("mmrl/openrlhf/turn_agent.py")
    with openrlhf_importable():  # loaded by path, as OpenRLHF's rollout engine loads it
        from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

        assert isinstance(_load_agent_executor(launch.args.train.agent_func_path), AgentExecutor)
    assert launch.args.train.batch_size == 16  # turn-samples per optimizer step
    label = json.loads(json.loads(open(launch.files["train"]).readline())["label"])
    assert label["env"]["observation_mode"] == "window" and "system" in label  # the local backend's turn env
    episode = resolve_launch(parse_config([*base[:4], "--algo", "grpo", *base[6:8], *base[10:]]), write=False)
    assert episode.args.train.agent_func_path.endswith("mmrl/envs/adapters/openrlhf_agent.py")
    with pytest.raises(UserError, match="optim.minibatch_turns must be >= 0, and > 0 only with .* openrlhf"):
        validate(parse_config([*base[2:], "--optim.minibatch_turns", "16"]))  # the local backend
    with pytest.raises(UserError, match="decaying lr schedule is unknown"):
        resolve_launch(parse_config([*base, "--optim.minibatch_turns", "16", "--optim.schedule", "cosine"]),
                       write=False)
    with pytest.raises(UserError, match="change optim.minibatch_turns"):
        resolve_launch(parse_config([*base, "--optim.minibatch_turns", "12"]), write=False)
    assert [list(s) for s in rank_shares(5, 2)] == [[0, 1], [2, 3, 4]]
    with pytest.raises(ValueError, match="cannot give each of 4 policy ranks one"):
        rank_shares(3, 4)


def test_a_rank_with_fewer_rows_runs_idle_micro_batches():
    """Turn rows vary in number, so ranks may hold different numbers of micro-batches; each runs the most any rank
    has, rounded up to whole optimizer steps, the missing ones without a trained token."""
    from mmrl.openrlhf.grouping import padded_count

    with openrlhf_importable():
        from openrlhf.trainer.ppo_utils.experience import Experience

        from mmrl.openrlhf.actor import MmrlActorPPOTrainer

    assert (padded_count(5, 2), padded_count(6, 2), padded_count(1, 4)) == (6, 6, 4)
    trainer = object.__new__(MmrlActorPPOTrainer)
    trainer.micro_train_batch_size = 2
    items = [Experience(sequences=torch.tensor([1, 2, 3]), attention_mask=torch.ones(3, dtype=torch.long),
                        action_mask=torch.tensor([0, 1]), rewards=torch.tensor(1.0), info={GROUP_KEY: torch.tensor(g)})
             for g in (0, 0, 1)]
    batches = trainer.micro_batches(items, torch.Generator().manual_seed(0), 4)
    assert sorted(int(b.action_mask.sum()) for b in batches) == [0, 0, 1, 2]
    assert [int(b.action_mask.sum()) for b in batches[2:]] == [0, 0]  # the idle ones come last


class ContextPlayer(Player):
    """The player of the episode layout, where a turn's prompt is the whole episode so far: the local driver's policy
    reads each episode's context, the rollout engine the tokens OpenRLHF's executor sends."""

    def policy(self, episodes):
        return [Turn(tokens, text, True) for text, tokens in (self.turn_tokens(ep.context) for ep in episodes)]

    async def generate(self, prompt_ids, params, multi_modal_data=None):  # OpenRLHF's executor passes images
        return await super().generate(prompt_ids, params)


def test_episode_layout_samples_equal_the_local_backends():
    """The episode layout: OpenRLHF's own multi-turn executor over the agent file (the openrlhf backend's episode
    driver) makes, from the same games, seeds and player, the local driver's sample: the same tokens (the chat turns
    of the tokenizer's template on both sides), the same trained tokens, return, score and episode logs."""
    task = get_task("alfworld", **TASK_OPTIONS)
    tokenizer = load_tokenizer(AGENT)
    renderer = TurnRenderer(tokenizer, task.system_prompt)
    executor = EpisodeAgentExecutor(env_workers=0)
    generator = object.__new__(MmrlSamplesGenerator)
    generator.turns = {}
    returns = set()
    for game, label in enumerate(episode_rows(task, task.train[:GAMES], 0, "episode")):
        label = json.dumps({k: v for k, v in label.items() if k != "messages"})
        local_player, remote_player = ContextPlayer(tokenizer), ContextPlayer(tokenizer)
        for _ in range(EPISODES):  # the nth episode of a game gets the player's nth picks on both sides
            local = Episode(task.make_env(task.train[game], "episode"), seed=game)
            run_episodes([local], renderer, local_player.policy, MAX_LENGTH)
            response = asyncio.run(executor.execute("", label, SamplingParams(max_tokens=64, logprobs=None),
                                                    MAX_LENGTH, tokenizer, SimpleNamespace(
                                                        generate=remote_player.generate)))
            assert local.outcome == "done" and local.steps > 1
            assert response["observation_tokens"] == local.prompt_ids + local.token_ids
            trained = [0] * len(response["observation_tokens"])
            for start, end in response["action_ranges"]:
                trained[start:end] = [1] * (end - start)
            assert trained == [0] * len(local.prompt_ids) + local.loss_mask
            assert response["reward"] == pytest.approx(sum(local.rewards))
            assert response["scores"] == float(local.won)
            assert response["extra_logs"] == local.logs(len(local.actions))
            # mmrl's samples generator makes the row the update trains on: the local row's tokens, and its loss mask
            # as OpenRLHF's action mask (which marks the tokens after the first)
            experience = generator._process_response_into_experience(response, max_len=MAX_LENGTH)
            assert experience.sequences.reshape(-1).tolist() == local.prompt_ids + local.token_ids
            assert experience.action_mask.reshape(-1).tolist() == [bool(m) for m in trained[1:]]
            assert experience.rewards.reshape(-1).tolist() == pytest.approx([sum(local.rewards)])
            returns.add(round(sum(local.rewards), 3))
    assert len(returns) > 1  # the player's malformed turns are penalised: the episodes' returns differ
    executor.close()
