"""Reference players on an ALFWorld game set: the scripted explorer (what the warm-up imitates) and a player that
picks a random admissible command, each for ``--episodes`` seeds per game, on the real engine. They bracket what the
learned agent of ``benchmarks/alfworld.py`` reaches.

    python benchmarks/alfworld_players.py --games runs/bench/alfworld/games [--max-steps 15] [--episodes 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

# This directory holds alfworld.py, which would shadow the alfworld package: keep it off the import path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

from mmrl.envs.alfworld import AlfWorldEnv, list_games  # noqa: E402
from mmrl.envs.alfworld.explorer import Explorer  # noqa: E402


def random_player(game_path: str, rng: random.Random):
    def act(feedback: str, admissible: list[str]) -> tuple[str, str]:
        return "random", rng.choice([a for a in admissible if a != "help"])

    return act


def explorer_player(game_path: str, rng: random.Random):
    return Explorer.for_game(game_path, rng).act


async def play(game_path: str, player, max_steps: int) -> tuple[bool, int]:
    env = AlfWorldEnv(game_path, max_steps=max_steps)
    try:
        _, info = await env.reset()
        while True:
            think, command = player(info["feedback"], info["admissible_actions"])
            result = await env.step(f"<think>{think}</think><action>{command}</action>")
            info = result.info
            if result.done:
                return bool(info["won"]), info["step"]
    finally:
        await env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", required=True, help="a game tree in the official layout")
    parser.add_argument("--splits", default="valid_seen,valid_unseen")
    parser.add_argument("--max-steps", type=int, default=15)
    parser.add_argument("--episodes", type=int, default=8, help="seeds per game")
    parser.add_argument("--out", default="", help="JSON file for the table (optional)")
    args = parser.parse_args()
    rows = []
    for split in args.splits.split(","):
        games = list_games(args.games, split)
        for name, make in (("explorer", explorer_player), ("random admissible", random_player)):
            results = [asyncio.run(play(str(g.path), make(str(g.path), random.Random(seed)), args.max_steps))
                       for g in games for seed in range(args.episodes)]
            rows.append({"split": split, "player": name, "games": len(games), "episodes": len(results),
                         "success": sum(w for w, _ in results) / len(results),
                         "steps": sum(s for _, s in results) / len(results)})
    print("split | player | games | episodes | success | mean steps")
    for r in rows:
        print(f"{r['split']} | {r['player']} | {r['games']} | {r['episodes']} | {r['success']:.3f} | {r['steps']:.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
