"""The scripted explorer the SFT warm-up imitates: it wins every task type on the real engine acting only on what a
player sees, seeds change its search order, and its demonstrations render through the trainer's episode driver."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

pytest.importorskip("alfworld")

from mmrl.envs.alfworld import TASK_TYPES, AlfWorldEnv, list_games  # noqa: E402
from mmrl.envs.alfworld.explorer import Explorer, Goal  # noqa: E402


def play(game_path, seed: int, max_steps: int = 40) -> tuple[bool, list[str]]:
    async def episode():
        env = AlfWorldEnv(game_path, max_steps=max_steps)
        _, info = await env.reset()
        explorer = Explorer.for_game(game_path, random.Random(seed))
        commands, won = [], False
        try:
            while True:
                think, command = explorer.act(info["feedback"], info["admissible_actions"])
                assert command in info["admissible_actions"] and think
                commands.append(command)
                result = await env.step(f"<think>{think}</think><action>{command}</action>")
                info, won = result.info, result.info["won"]
                if result.done:
                    return won, commands
        finally:
            await env.close()

    return asyncio.run(episode())


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_the_explorer_wins_every_task_type_from_any_search_order(alfworld_games, task_type):
    games = [g for split in ("train", "valid_seen", "valid_unseen") for g in list_games(alfworld_games, split)
             if g.task_type == task_type]
    assert games
    orders = set()
    for game in games:
        for seed in range(3):
            won, commands = play(game.path, seed)
            assert won, f"{game.path} seed {seed}: {commands}"
            orders.add((str(game.path), tuple(commands)))
    assert len(orders) > len(games)  # the seed changes the search, not only the game


def test_the_explorer_acts_on_what_it_sees(tmp_path):
    traj = tmp_path / "traj_data.json"
    traj.write_text(json.dumps({"task_type": "pick_and_place_simple",
                                "pddl_params": {"object_target": "KeyChain", "parent_target": "Drawer",
                                                "toggle_target": ""}}))
    explorer = Explorer.for_game(tmp_path / "game.tw-pddl", random.Random(0))
    start = ["go to bed 1", "go to desk 1", "go to drawer 1", "help", "inventory", "look"]
    think, command = explorer.act("You are in the middle of a room.", start)
    assert think == "find keychain" and command in start[:3]
    think, command = explorer.act("You arrive at desk 1. On the desk 1, you see a bowl 1, and a keychain 1.",
                                  ["go to bed 1", "go to drawer 1", "take bowl 1 from desk 1",
                                   "take keychain 1 from desk 1"])
    assert (think, command) == ("take keychain", "take keychain 1 from desk 1")
    think, command = explorer.act("You pick up the keychain 1 from the desk 1.", ["go to bed 1", "go to drawer 1"])
    assert (think, command) == ("put keychain in drawer", "go to drawer 1")
    think, command = explorer.act("You arrive at drawer 1. The drawer 1 is closed.", ["go to bed 1", "open drawer 1"])
    assert command == "open drawer 1"
    think, command = explorer.act("You open the drawer 1. The drawer 1 is open. In it, you see nothing.",
                                  ["close drawer 1", "move keychain 1 to drawer 1"])
    assert (think, command) == ("put keychain in drawer", "move keychain 1 to drawer 1")


def test_a_game_without_a_readable_goal_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "traj_data.json").write_text("{not json")
    with pytest.raises(ValueError, match="traj_data.json"):
        Goal.for_game(tmp_path / "game.tw-pddl")


@pytest.mark.parametrize("expert", ["explorer", "walkthrough"])
def test_demonstrations_render_won_episodes_through_the_episode_driver(alfworld_games, expert):
    from mmrl.models import load_tokenizer
    from mmrl.tasks import get_task
    from mmrl.tasks.alfworld import walkthrough
    from mmrl.trainer.sft import render_demonstrations

    task = get_task("alfworld", n_per_type=1, n_eval_per_type=1, max_steps=40, expert=expert)
    tokenizer = load_tokenizer("embedded:tiny-qwen2-agent")
    demos = render_demonstrations(task, tokenizer, task.train, max_episode_tokens=4096, per_row=2)
    assert len(demos) == 2 * len(task.train)  # every demonstration won
    by_game: dict[str, list] = {}
    for group in demos:
        response = group.responses[0]
        assert response.episode["won"] and response.episode["valid_action_rate"] == 1.0
        by_game.setdefault(group.sample["game"], []).append(response)
    if expert == "walkthrough":  # the planner's commands, the same for both seeds
        for game, (first, second) in by_game.items():
            assert first.token_ids == second.token_ids
            assert first.text.count("<action>") == len(walkthrough(game))
    else:  # differently seeded explorers search in different orders
        assert any(first.token_ids != second.token_ids for first, second in by_game.values())


def test_an_unknown_expert_is_a_config_error(alfworld_games):
    from mmrl.tasks import get_task

    with pytest.raises(ValueError, match="task.expert"):
        get_task("alfworld", n_per_type=1, n_eval_per_type=1, expert="oracle")
