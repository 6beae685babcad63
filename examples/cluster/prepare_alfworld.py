#!/usr/bin/env python
"""ALFWorld's games (Shridhar et al.), as the GMPO ALFWorld recipe and its GRPO baseline play them: the train split
(3,553 games) and valid_seen (140, verl-agent's eval_in_distribution, of which the recipe evaluates 128).

    python examples/cluster/prepare_alfworld.py --source "$ALFWORLD_DATA"

--source is the folder alfworld-download fills (pip install alfworld; alfworld-download; it holds json_2.1.1/ with
json_2.1.1/<split>/<task>-<objects>-<scene>/<trial>/{traj_data.json, game.tw-pddl, initial_state.pddl}). A game is
what ALFWorld's own AlfredTWEnv.collect_game_files plays: a known task type, a game file marked solvable, no
movable/Sliced trials (mmrl.envs.alfworld.list_games, which also checks each game's grammar). Each such game's
traj_data.json and game.tw-pddl are copied to --out (default /data/alfworld, the recipe's task.games_root) under
the same json_2.1.1/... path.

Sources: the counts from ALFWorld's data README ("3,553 training games, 140 seen and 134 unseen validation games");
the layout from the same README's File Structure section.
"""

from __future__ import annotations

import os
from pathlib import Path

from prepare_common import Output, parser, run

from mmrl.errors import UserError

GAMES = {"train": 3553, "valid_seen": 140}  # ALFWorld's data README: train 3,553, valid_seen 140 (valid_unseen 134)
OUT = "/data/alfworld"
FILES = ("traj_data.json", "game.tw-pddl")


def expected_games(text: str | None) -> dict[str, int]:
    """``--expect-rows train=N,valid_seen=M`` (each split given), or the official counts."""
    if text is None:
        return dict(GAMES)
    counts = {}
    for item in text.split(","):
        split, _, number = item.partition("=")
        if split.strip() not in GAMES or not number.strip().isdigit():
            raise UserError(f"--expect-rows: {item!r} is not SPLIT=N with SPLIT one of {', '.join(GAMES)}")
        counts[split.strip()] = int(number)
    if set(counts) != set(GAMES):
        raise UserError(f"--expect-rows must give every split: {', '.join(f'{s}=N' for s in GAMES)}")
    return counts


def main(argv: list[str] | None) -> int:
    from mmrl.envs.alfworld import list_games

    args = parser(__doc__, OUT, (str, "SPLIT=N,... game counts to check instead of the official ones")).parse_args(argv)
    source = Path(args.source).expanduser().absolute()
    json_root = source if source.name == "json_2.1.1" else source / "json_2.1.1"
    if not json_root.is_dir():
        raise UserError(f"--source: {json_root} is missing (give the folder alfworld-download filled, which holds "
                         f"json_2.1.1/)")
    counts = expected_games(args.expect_rows)
    games = {}
    for split, expected in counts.items():
        try:
            games[split] = list_games(source, split)
        except FileNotFoundError as exc:
            raise UserError(f"--source: {exc}") from None
        if len(games[split]) != expected:
            raise UserError(f"{json_root / split}: {len(games[split]):,} playable games, but ALFWorld's {split} split "
                             f"has {expected:,} (--source must be the folder alfworld-download filled)")
    out = Path(args.out).expanduser().absolute()
    if out.is_file():
        raise UserError(f"--out: {out} is a file; give the folder to write the games into")
    output = Output(out, args.force, Path(__file__).name)
    copies = {}
    for found in games.values():
        for game in found:
            trial = game.path.parent
            for name in FILES:
                rel = (trial / name).relative_to(json_root.parent)
                copies[out / rel] = trial / name
    output.claim_all(copies)
    for target, origin in copies.items():
        output.write(target, origin.read_bytes(), str(origin))
    output.save_record()
    total = ", ".join(f"{len(g):,} {s}" for s, g in games.items())
    print(f"alfworld: {total} games checked, written to {out / os.path.basename(json_root)}")
    return 0


if __name__ == "__main__":
    run(main)
