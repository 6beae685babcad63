"""The env ``info`` contract (`mmrl.envs.EnvInfo`): what ALFWorld reports is what the contract declares, so a trainer
reading the documented keys reads every key there is, with the documented types."""

from __future__ import annotations

import asyncio
import types
import typing

from mmrl.envs import EnvInfo, format_action

CORE = {"won", "task_type", "admissible_actions", "action_valid", "format_ok"}


def check(info: dict) -> None:
    hints = typing.get_type_hints(EnvInfo)
    assert set(info) <= set(hints), f"keys the contract does not declare: {set(info) - set(hints)}"
    assert CORE <= set(info), f"core keys missing: {CORE - set(info)}"
    for key, value in info.items():
        expected = typing.get_origin(hints[key]) or hints[key]
        if expected is types.UnionType:  # ``int | None``
            expected = typing.get_args(hints[key])
        assert isinstance(value, expected), (key, value, hints[key])


def test_alfworld_info_keys_are_the_contracts(alfworld_games):
    from mmrl.envs.alfworld import AlfWorldEnv, list_games

    game = list_games(alfworld_games, "train")[0]

    async def play() -> list[dict]:
        env = AlfWorldEnv(str(game.path), max_steps=2)
        _, first = await env.reset(seed=0)
        infos = [first]
        for text in (format_action("look", "see what is here"), "no tags at all"):
            result = await env.step(text)
            infos.append(result.info)
        await env.close()
        return infos

    infos = asyncio.run(play())
    for info in infos:
        check(info)
    assert infos[-1]["truncated"] is True and infos[-1]["format_ok"] is False and infos[-1]["reason"]
