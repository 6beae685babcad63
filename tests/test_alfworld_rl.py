"""Multi-turn RL on ALFWorld with the real TextWorld engine and the real embedded agent model: episode masks and
log-probs, every objective on episodes, a crashed env, the SFT warm-up. Short episodes (max_steps 3) and tiny groups
keep it fast; the learning demo is benchmarks/alfworld.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
from functools import partial
from pathlib import Path

import pytest
import torch

pytest.importorskip("alfworld")
pytest.importorskip("mmrl.envs.alfworld")

import mmrl.algos as algos  # noqa: E402
from mmrl.batch import Group, collate  # noqa: E402
from mmrl.envs.episode import TurnRenderer  # noqa: E402
from mmrl.models import load_model, load_tokenizer  # noqa: E402
from mmrl.tasks import get_task  # noqa: E402
from mmrl.tasks.alfworld import walkthrough  # noqa: E402
from mmrl.trainer.episodes import Episode, model_policy, run_episodes  # noqa: E402
from mmrl.trainer.local import build_trainer  # noqa: E402
from mmrl.trainer.rollout import batch_logprobs  # noqa: E402
from mmrl.trainer.sft import demonstration_loss, render_demonstrations, sft_warmup  # noqa: E402

AGENT = "embedded:tiny-qwen2-agent"
FAST = {"n_per_type": 1, "n_eval_per_type": 1, "max_steps": 3, "max_eval_games": 2}


@pytest.fixture(scope="module")
def task():
    return get_task("alfworld", **FAST)


@pytest.fixture(scope="module")
def agent():
    torch.manual_seed(0)
    return load_model(AGENT), load_tokenizer(AGENT)


def alfworld_config(small_config, tmp_path, **overrides):
    options = {f"task.{k}": v for k, v in FAST.items()}
    return small_config(tmp_path, **{"task.name": "alfworld", "model.name": AGENT, "rollout.prompts_per_step": 2,
                                     "rollout.samples_per_prompt": 2, "rollout.max_new_tokens": 16,
                                     "rollout.max_episode_tokens": 2048, "run.eval_samples": 1, **options,
                                     **overrides})


def test_episode_masks_and_rescoring_equal_the_samplers_turn_logprobs(task, agent):
    model, tok = agent
    renderer = TurnRenderer(tok, task.system_prompt)
    episodes = [Episode(task.make_env(row), seed=7) for row in task.train[:2] for _ in range(2)]
    torch.manual_seed(0)
    run_episodes(episodes, renderer, model_policy(model, tok, 24, 1.0, with_logprobs=True), 2048)
    assert all(ep.outcome in ("done", "truncated") for ep in episodes)
    assert episodes[0].prompt_ids == episodes[1].prompt_ids  # same game and seed: identical starts
    for ep in episodes:
        mask = torch.tensor(ep.loss_mask)
        ids = torch.tensor(ep.token_ids)
        # the model's tokens (mask 1) are exactly its turns; the env's (mask 0) are the feedback turns
        model_text = tok.decode(ids[mask == 1])
        assert all(a in model_text for a in ep.actions)
        env_text = tok.decode(ids[mask == 0])
        shown = ep.observations[1:-1]  # the feedback to the last step ends the episode and is not appended
        assert shown and all(obs in env_text for obs in shown)
        assert not any(obs[:40] in model_text for obs in shown)
        assert ep.steps >= 1 and len(ep.actions) >= ep.steps
    groups = [Group(i, {}, ep.prompt_ids, [ep.response()]) for i, ep in enumerate(episodes)]
    batch = collate(groups, tok.pad_token_id)
    rescored, _ = batch_logprobs(model, batch, temperature=1.0)
    for row, ep in enumerate(episodes):
        n = len(ep.token_ids)
        sampler = torch.tensor([x if x is not None else 0.0 for x in ep.sampler_logprobs])
        assert batch.response_mask[row, :n].tolist() == [float(m) for m in ep.loss_mask]
        torch.testing.assert_close(rescored[row, :n], sampler, atol=2e-4, rtol=0)
        assert (rescored[row, :n][torch.tensor(ep.loss_mask) == 0] == 0).all()


@pytest.mark.parametrize("name", [n if n == "gmpo" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(algos.ALGORITHMS)])
def test_every_algorithm_trains_two_steps_on_alfworld(tmp_path, small_config, name):
    params = {"algo.valid_threshold": 0.0} if name == "gpg" else {}
    if algos.ALGORITHMS[name].needs_steps:  # per-step rewards and observations: the turn layout
        params["rollout.agent_layout"] = "turn"
    trainer = build_trainer(alfworld_config(small_config, tmp_path, **{"algo.name": name, **params}))
    last = trainer.run()
    assert trainer.step == 2
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("success_rate", "valid_action_rate", "format_rate", "episode_length", "env_failures", "grad_norm",
                "entropy", "lr", "kl_step", "kl_step_max", "adv_group_std", "adv_mean", "eval/pass@1",
                "eval/success_rate", "eval/valid_action_rate", "eval/episode_length"):
        assert key in last, key
    assert any(k.startswith("success/") for k in records[0])
    assert any(k.startswith("eval/success/") for k in last)
    assert all(0 <= r["valid_action_rate"] <= 1 and r["episode_length"] >= 1 for r in records)
    # the task's KL band: every step's updated policy stays within optim.target_kl of π_old (rounding aside: the
    # band is checked on the mini-batch's rows in their order, this over the batch's)
    assert trainer.cfg.optim.target_kl == 0.02
    assert all(r["kl_step"] <= 0.02 + 1e-6 for r in records)


def test_a_crashed_env_ends_its_episode_not_the_run(tmp_path, small_config, task):
    games = tmp_path / "games"
    shutil.copytree(Path(task.train[0]["game"]).parents[3], games / "json_2.1.1")  # json_2.1.1/split/type/trial/game
    cfg = alfworld_config(small_config, tmp_path, **{"task.games_root": str(games), "run.steps": 2,
                                                     "rollout.prompts_per_step": 3, "task.max_eval_games": 1})
    trainer = build_trainer(cfg)
    for game in sorted(games.rglob("train/**/game.tw-pddl"))[1::2]:
        game.write_text("{ this is not a game")  # half the training games' engines can no longer load them
    trainer.run()
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and sum(r["env_failures"] for r in records) > 0


def test_a_killed_env_worker_fails_only_its_episodes(task, agent):
    """A real crash mid-episode: an EnvPool worker is SIGKILLed after the first env step; the episodes it held end
    as failed with the EnvError, the others play on."""
    from mmrl.envs.pool import EnvPool

    model, tok = agent
    pool = EnvPool(task.env_class, num_workers=2, step_timeout=60)
    try:
        episodes = [Episode(partial(pool.env, **task.env_kwargs(row)), seed=1) for row in task.train[:2]
                    for _ in range(2)]
        sample = model_policy(model, tok, 16, 1.0)
        turns = []

        def policy(running):
            turns.append(len(running))
            if len(turns) == 2:
                os.kill(pool.worker_pids()[0], signal.SIGKILL)
            return sample(running)

        run_episodes(episodes, TurnRenderer(tok, task.system_prompt), policy, 2048)
    finally:
        pool.close()
    failed = [ep for ep in episodes if ep.outcome == "failed"]
    assert 0 < len(failed) < len(episodes)
    assert all("EnvError" in ep.error and ep.steps == 1 for ep in failed)
    assert all(ep.steps == 3 for ep in episodes if ep.outcome != "failed")  # max_steps 3: the others finished


def test_a_training_run_with_the_env_pool(tmp_path, small_config):
    trainer = build_trainer(alfworld_config(small_config, tmp_path, **{"rollout.env_workers": 1, "run.steps": 1,
                                                                      "task.max_eval_games": 1}))
    last = trainer.run()
    assert last["env_failures"] == 0 and last["updates"] == 1 and last["episode_length"] >= 1


def test_sft_warmup_lowers_the_loss_on_expert_tokens(agent):
    _, tok = agent
    model = load_model(AGENT)  # a fresh copy: the module's model stays untrained
    task = get_task("alfworld", **{**FAST, "max_steps": 20})  # long enough for every walkthrough to win
    shortest = sorted(task.train, key=lambda row: len(walkthrough(row["game"])))[:2]
    demos = render_demonstrations(task, tok, shortest, max_episode_tokens=3072)
    assert demos and all(g.responses[0].episode["won"] for g in demos)
    response = demos[0].responses[0]
    assert 0 < sum(response.loss_mask) < len(response.loss_mask)  # expert turns train, env feedback does not
    with torch.no_grad():
        before = float(demonstration_loss(model, demos, tok.pad_token_id))
    losses = sft_warmup(model, demos, tok.pad_token_id, steps=8, lr=3e-3, batch_size=2)
    with torch.no_grad():
        after = float(demonstration_loss(model, demos, tok.pad_token_id))
    assert after < 0.8 * before and losses[-1] < losses[0]
