"""The agent turn layout (``rollout.agent_layout turn``, verl-agent's): every env step is its own training sample,
prompted with the task, the last ``history_length`` turns and the current state, so a turn's context stays bounded
however long the episode; every objective trains on it, GiGPO with its step-level advantages."""

from __future__ import annotations

import json
import random

import pytest
import torch

pytest.importorskip("alfworld")
pytest.importorskip("mmrl.envs.alfworld")

from mmrl.batch import Group, collate  # noqa: E402
from mmrl.envs.episode import TurnRenderer  # noqa: E402
from mmrl.models import load_tokenizer  # noqa: E402
from mmrl.run.build import build_algorithm  # noqa: E402
from mmrl.tasks import get_task  # noqa: E402
from mmrl.train import parse_config  # noqa: E402
from mmrl.trainer.episodes import Episode, run_episodes  # noqa: E402
from mmrl.trainer.local import build_trainer  # noqa: E402
from mmrl.trainer.turn_sampler import Turn  # noqa: E402

AGENT = "embedded:tiny-qwen2-agent"
FAST = {"n_per_type": 1, "n_eval_per_type": 1, "max_eval_games": 2}


def wandering_policy(tokenizer, seed=0):
    """A scripted player that never stops on purpose: a random admissible command each turn (never wins by design
    of the test's length, and visits many different states)."""
    rng = random.Random(seed)

    def policy(episodes):
        turns = []
        for ep in episodes:
            actions = [a for a in ep.info.get("admissible_actions", []) if a not in ("help", "look", "inventory")]
            text = f"<think>explore</think><action>{rng.choice(actions)}</action>"
            turns.append(Turn(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id], text,
                              True))
        return turns

    return policy


def play(task, layout, steps, seed=0):
    tok = load_tokenizer(AGENT)
    renderer = TurnRenderer(tok, task.system_prompt)
    episodes = [Episode(task.make_env(task.train[0], layout), seed=1, layout=layout)]
    run_episodes(episodes, renderer, wandering_policy(tok, seed), max_episode_tokens=1_000_000)
    assert episodes[0].outcome == "done" and episodes[0].steps == steps
    return episodes[0], tok


def test_a_fifty_step_episodes_largest_prompt_is_bounded():
    """50 steps: the episode layout's one sequence grows with every turn; the turn layout's largest prompt is the
    task, two earlier turns and the state, about the size of its third prompt, whatever the episode's length."""
    task = get_task("alfworld", **FAST, max_steps=50, task_types="pick_and_place")
    turned, _ = play(task, "turn", 50)
    whole, _ = play(task, "episode", 50)
    prompts = [len(t.prompt_ids) for t in turned.turns]
    assert len(prompts) == 50
    largest = max(prompts)
    # bounded: the history window (2 turns) caps it near the first windowed prompts, not the episode's length
    assert largest <= 2 * max(prompts[:3])
    assert turned.summary()["tokens"] == max(p + len(t.token_ids) for p, t in zip(prompts, turned.turns, strict=True))
    # the whole-episode sequence of the same 50 steps is many times larger
    assert whole.summary()["tokens"] > 8 * largest
    print(f"50-step episode: largest turn prompt {largest} tokens (first {prompts[0]}), "
          f"episode layout's sequence {whole.summary()['tokens']} tokens")


def test_turn_samples_are_rendered_as_verl_agent_with_rewards_and_anchors():
    task = get_task("alfworld", **FAST, max_steps=4, history_length=2, task_types="pick_and_place")
    ep, tok = play(task, "turn", 4)
    texts = [tok.decode(t.prompt_ids) for t in ep.turns]
    assert "Your task is to:" in texts[0] and "Prior to this step" not in texts[0]
    for step, text in enumerate(texts[1:], start=1):
        assert f"Prior to this step, you have already taken {step} step(s)" in text
        assert text.count("[Observation ") == min(step, 2)  # the history window: the last two turns only
        assert f"You are now at step {step + 1}" in text
        assert "Your task is to:" in text
    # each turn's anchor is the state it was taken in: the env's text of it, without the prompt around it
    assert ep.turns[0].anchor and ep.turns[0].anchor in texts[0]
    assert all(t.anchor in text for t, text in zip(ep.turns, texts, strict=True))
    assert [t.reward for t in ep.turns] == ep.rewards
    responses = ep.turn_responses(episode_id=7)
    assert [r.step.index for r in responses] == [0, 1, 2, 3] and {r.step.episode for r in responses} == {7}
    assert all(r.reward.score == sum(ep.rewards) for r in responses)
    assert responses[0].episode is not None and all(r.episode is None for r in responses[1:])
    # collate puts each turn's own prompt before its action, left-padded
    batch = collate([Group(0, {}, responses[0].prompt_ids, responses)], tok.pad_token_id)
    for i, r in enumerate(responses):
        prompt = batch.input_ids[i, : batch.prompt_width][batch.attention_mask[i, : batch.prompt_width] == 1]
        assert prompt.tolist() == r.prompt_ids
        assert batch.response_mask[i].sum() == len(r.token_ids)


def test_layout_combinations_fail_at_start_with_one_line():
    def algo_for(*flags, multi_turn=True):
        return build_algorithm(parse_config(list(flags)), multi_turn)

    with pytest.raises(ValueError, match="gigpo needs the per-step rewards .* --rollout.agent_layout turn"):
        algo_for("--algo", "gigpo", "--task", "alfworld")
    assert algo_for("--algo", "gigpo", "--task", "alfworld", "--rollout.agent_layout", "turn").needs_steps
    with pytest.raises(ValueError, match="gvpo needs whole responses to one prompt"):
        algo_for("--algo", "gvpo", "--task", "alfworld", "--rollout.agent_layout", "turn")
    with pytest.raises(ValueError, match="agent_layout turn is for multi-turn"):
        algo_for("--algo", "grpo", "--rollout.agent_layout", "turn", multi_turn=False)
    with pytest.raises(ValueError, match="rollout.agent_layout must be episode or turn"):
        from mmrl.run.config import validate

        validate(parse_config(["--rollout.agent_layout", "turns"]))
    # Dr.GRPO's constant normaliser is one turn's budget in the turn layout, a whole episode's otherwise
    turn = algo_for("--algo", "dr_grpo", "--task", "alfworld", "--rollout.agent_layout", "turn")
    whole = algo_for("--algo", "dr_grpo", "--task", "alfworld")
    assert (turn.max_tokens, whole.max_tokens) == (40, 3072)


@pytest.mark.parametrize("name", ["gigpo", pytest.param("grpo", marks=pytest.mark.slow)])
def test_training_two_steps_in_the_turn_layout(tmp_path, small_config, name):
    cfg = small_config(tmp_path, **{"task.name": "alfworld", "model.name": AGENT, "algo.name": name,
                                    "rollout.agent_layout": "turn", "rollout.prompts_per_step": 2,
                                    "rollout.samples_per_prompt": 2, "rollout.max_new_tokens": 16,
                                    "optim.micro_batch_size": 3, "run.eval_samples": 1,
                                    **{f"task.{k}": v for k, v in FAST.items()}, "task.max_steps": 3})
    trainer = build_trainer(cfg)
    groups, _ = trainer.collect_rollouts()
    responses = [r for g in groups for r in g.responses]
    episodes = [r.episode for r in responses if r.episode]
    assert len(responses) == sum(e["steps"] for e in episodes) and len(episodes) == 4
    assert all(r.prompt_ids is not None and r.step is not None for r in responses)
    batch, _ = trainer.prepare_batch(groups)
    assert batch.advantages.shape == (len(responses),)
    if name == "grpo":  # every turn carries its episode's advantage
        for episode in {r.step.episode for r in responses}:
            rows = [i for i, r in enumerate(responses) if r.step.episode == episode]
            assert len(set(batch.advantages[rows].tolist())) == 1
    # micro-batches split a game's group by rows for objectives whose loss reads no group statistic
    micro = trainer.learner.micro_batches(batch, torch.arange(len(groups)))
    assert max(len(m) for m in micro) <= 3 and sorted(torch.cat(micro).tolist()) == list(range(len(responses)))
    played, collect = [], trainer.collect_rollouts

    def spy(*args, **kwargs):
        out = collect(*args, **kwargs)
        played.append(out[0])
        return out

    trainer.collect_rollouts = spy
    last = trainer.run()
    assert trainer.step == 2 and "eval/success_rate" in last and "grad_norm" in last
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["episode_length"] >= 1 for r in records)
    # the logged reward is the mean return over episodes, each once (not over turns, where long episodes weigh more)
    trained = [r for r in records if "updates" in r]
    for record, groups in zip(trained, played, strict=True):
        returns = [r.reward.score for g in groups for r in g.responses if r.episode]
        assert record["reward"] == pytest.approx(sum(returns) / len(returns), abs=1e-4)


def test_the_sft_warm_up_renders_demonstrations_in_the_turn_layout():
    """A warm start for a turn-layout run imitates the expert on the prompts RL will see: one sample per turn."""
    from mmrl.models import load_model
    from mmrl.trainer.sft import demonstration_loss, render_demonstrations

    task = get_task("alfworld", **FAST, max_steps=15, task_types="pick_and_place")
    tok = load_tokenizer(AGENT)
    demos = render_demonstrations(task, tok, task.train[:1], 4096, layout="turn")
    responses = demos[0].responses
    assert len(responses) >= 2 and [r.step.index for r in responses] == list(range(len(responses)))
    assert "Prior to this step" in tok.decode(responses[1].prompt_ids)
    assert all(r.reward.components["success"] == 1.0 for r in responses)
    assert demos[0].responses[-1].episode is None and len(responses[-1].token_ids) > 0
    loss = demonstration_loss(load_model(AGENT), demos, tok.pad_token_id)
    assert torch.isfinite(loss) and float(loss) > 0


def test_the_sft_warm_up_shows_its_progress(tmp_path, small_config, capsys):
    """The warm-up runs before the first RL step: it shows a progress bar, as the RL loop does."""
    cfg = small_config(tmp_path, **{"task.name": "alfworld", "model.name": AGENT, "rollout.agent_layout": "turn",
                                    "sft.steps": 2, "sft.demos": 1, "run.progress": True,
                                    **{f"task.{k}": v for k, v in FAST.items()}, "task.max_steps": 15,
                                    "task.task_types": "pick_and_place"})
    build_trainer(cfg)
    err = capsys.readouterr().err
    assert "sft warm-up" in err and "2/2" in err
    assert len((tmp_path / "run" / "sft.jsonl").read_text().splitlines()) == 2


def test_held_out_play_is_in_the_layout_the_policy_trained_in(tmp_path):
    """A turn-layout policy is evaluated on turn-layout prompts: the evaluation plays that layout (there is no KV
    cache to carry between its re-built prompts), and ``mmrl.eval`` of a run directory takes the run's layout."""
    from mmrl.eval import parse_command
    from mmrl.models import load_model
    from mmrl.run.run_dir import claim
    from mmrl.train import parse_config
    from mmrl.trainer.evaluate import evaluate_episode_groups

    task = get_task("alfworld", **FAST, max_steps=3, task_types="pick_and_place")
    tok = load_tokenizer(AGENT)
    metrics, groups = evaluate_episode_groups(load_model(AGENT), tok, task, k=1, temperature=0.0, max_new_tokens=8,
                                              layout="turn")
    assert len(groups) == len(task.eval) and 0.0 <= metrics["success_rate"] <= 1.0
    assert all(r.episode["steps"] == 3 or r.episode["won"] for g in groups for r in g.responses)

    run = tmp_path / "run"
    owner = claim(parse_config(["--task", "alfworld", "--rollout.agent_layout", "turn", "--out", str(run)]))
    owner.record_config(parse_config(["--task", "alfworld", "--rollout.agent_layout", "turn", "--out", str(run)]),
                        step=0)
    owner.lock.release()
    assert parse_command(["--model", str(run)])[0].rollout.agent_layout == "turn"
    assert parse_command(["--model", str(run), "--rollout.agent_layout", "episode"])[0].rollout.agent_layout == \
        "episode"
    assert parse_command(["--task", "alfworld"])[0].rollout.agent_layout == "episode"


def test_per_episode_metrics_count_each_episode_once():
    """A won episode of three turns and a lost one of one turn: the mean return is 5 over episodes, 7.5 over turns."""
    from mmrl.batch import Response
    from mmrl.rewards.base import RewardResult
    from mmrl.trainer.step_metrics import episode_responses

    def turns(n: int, score: float) -> list[Response]:
        return [Response([1], reward=RewardResult(score), episode={"steps": n} if i == 0 else None) for i in range(n)]

    responses = turns(3, 10.0) + turns(1, 0.0)
    picked = episode_responses(responses, turn_layout=True)
    assert [r.reward.score for r in picked] == [10.0, 0.0]
    assert episode_responses(responses, turn_layout=False) == responses
