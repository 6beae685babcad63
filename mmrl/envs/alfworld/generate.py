"""Write ALFWorld games of all six task types in the official layout, solved by alfworld's own planner.

    python -m mmrl.envs.alfworld.generate --out data/alfworld --n-per-type 20 --n-eval-per-type 5 --seed 0

writes ``<out>/json_2.1.1/{train,valid_seen,valid_unseen}/<task>-<Obj>-None-<Recep>-<scene>/<trial>/`` with
``initial_state.pddl``, ``traj_data.json`` and ``game.tw-pddl`` (domain, grammar with the task sentence, problem,
``solvable`` and the planner's ``walkthrough``): the files ``alfworld-generate --expert_type planner`` produces from
ALFRED's data, so ``AlfredTWEnv``, verl-agent and :func:`mmrl.envs.alfworld.games.list_games` read them unchanged.
Point ``ALFWORLD_DATA`` at ``<out>`` to use them anywhere ALFWorld's downloaded data is expected.

Each game is checked end to end before it is kept: the planner's walkthrough is replayed through the engine and must
win. Everything is a function of ``--seed`` (no clock, no global random): the same arguments give the same files.
Rooms are small by default (8 receptacles, 4 distractor objects) so that a CPU runs them fast; ``--receptacles 30``
gives ALFWorld-sized rooms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

from mmrl.envs.alfworld.pddl import problem_text, task_description, traj_data, trial_dir_name
from mmrl.envs.alfworld.scenes import SEEN_SCENES, UNSEEN_SCENES, Scene, sample_scene
from mmrl.envs.alfworld.tasks import TASK_TYPES, official_task_type
from mmrl.envs.base import EnvError

SPLITS = ("train", "valid_seen", "valid_unseen")
SPLIT_CODES = {"train": "t", "valid_seen": "s", "valid_unseen": "u"}
MAX_ATTEMPTS = 25


def solve(game_path: Path) -> list[str]:
    """Fast Downward's plan for the game (via alfworld's AlfredExpert planner wrapper), replayed to check it wins."""
    from mmrl.envs.alfworld.engine import Engine

    engine = Engine(game_path, expert=True)
    try:
        state = engine.reset()
        plan = list(state.plan or [])
        if state.won:
            raise EnvError(f"{game_path} is won at reset")
        for command in plan:
            if command not in state.admissible:
                raise EnvError(f"planner command {command!r} is not admissible in {game_path}")
            state = engine.step(command)
        if not plan or not state.won:
            raise EnvError(f"the planner's walkthrough does not win {game_path}")
        return plan
    finally:
        engine.close()


def write_game(scene: Scene, out_dir: Path, *, task_id: str, task_desc: str, seed: int) -> list[str]:
    """Write the three files of one game into ``out_dir``; returns the walkthrough. Raises EnvError if unsolvable."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    out_dir.mkdir(parents=True, exist_ok=True)
    problem = problem_text(scene, f"plan_{task_id}")
    (out_dir / "initial_state.pddl").write_text(problem)
    (out_dir / "traj_data.json").write_text(json.dumps(traj_data(scene, task_id, task_desc, seed), indent=1))
    game = {
        "pddl_domain": Path(ALFRED_PDDL_PATH).read_text(),
        "grammar": Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", task_desc),
        "pddl_problem": problem,
        "solvable": False,
        "walkthrough": None,
    }
    game_path = out_dir / "game.tw-pddl"
    game_path.write_text(json.dumps(game))
    walkthrough = solve(game_path)
    game.update(solvable=True, walkthrough=walkthrough)
    game_path.write_text(json.dumps(game))
    return walkthrough


def generate_game(split_dir: Path, task_type: str, *, seed: int, split: str, index: int, n_receptacles: int = 8,
                  n_distractors: int = 4) -> Path:
    """One solvable game of ``task_type`` under ``split_dir``; returns its game.tw-pddl path."""
    task_type = official_task_type(task_type)
    rng = random.Random(f"mmrl-alfworld/{seed}/{split}/{task_type}/{index}")
    scenes = UNSEEN_SCENES if split == "valid_unseen" else SEEN_SCENES
    errors = []
    for attempt in range(MAX_ATTEMPTS):
        task_id = f"trial_G{seed:04d}_{SPLIT_CODES[split]}{index:04d}_{attempt:02d}"
        try:
            scene = sample_scene(task_type, rng, scene_nums=scenes, n_receptacles=n_receptacles,
                                 n_distractors=n_distractors)
        except ValueError as err:  # this room cannot host the task: draw another
            errors.append(str(err))
            continue
        out_dir = split_dir / trial_dir_name(scene, task_id)
        try:
            write_game(scene, out_dir, task_id=task_id, task_desc=task_description(scene, rng), seed=seed)
            return out_dir / "game.tw-pddl"
        except EnvError as err:
            errors.append(str(err))
            shutil.rmtree(out_dir, ignore_errors=True)
    raise RuntimeError(f"no solvable {task_type} game after {MAX_ATTEMPTS} attempts: {errors[-3:]}")


def generate_games(out: Path, *, n_per_type: int = 4, n_eval_per_type: int = 1, seed: int = 0,
                   task_types: tuple[str, ...] = TASK_TYPES, n_receptacles: int = 8, n_distractors: int = 4,
                   progress: bool = False) -> list[Path]:
    """Games for every task type: ``n_per_type`` in train, ``n_eval_per_type`` in valid_seen and in valid_unseen."""
    counts = {"train": n_per_type, "valid_seen": n_eval_per_type, "valid_unseen": n_eval_per_type}
    paths = []
    for split in SPLITS:
        for task_type in task_types:
            for index in range(counts[split]):
                path = generate_game(Path(out) / "json_2.1.1" / split, task_type, seed=seed, split=split, index=index,
                                     n_receptacles=n_receptacles, n_distractors=n_distractors)
                paths.append(path)
                if progress:
                    print(f"[{len(paths)}] {path.relative_to(out)}", flush=True)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="output root (json_2.1.1/ is created inside)")
    parser.add_argument("--n-per-type", type=int, default=4, help="train games per task type")
    parser.add_argument("--n-eval-per-type", type=int, default=1, help="valid_seen and valid_unseen games per type")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--receptacles", type=int, default=8, help="receptacles per room (ALFWorld rooms have ~10-40)")
    parser.add_argument("--distractors", type=int, default=4, help="objects besides the task's own")
    parser.add_argument("--task-types", nargs="+", default=list(TASK_TYPES), help="subset of the six task types")
    args = parser.parse_args(argv)
    for name, value in (("--n-per-type", args.n_per_type), ("--n-eval-per-type", args.n_eval_per_type),
                        ("--distractors", args.distractors)):
        if value < 0:
            parser.error(f"{name} must be >= 0")
    if args.receptacles < 4:
        parser.error("--receptacles must be >= 4 (every room kind needs its fixed receptacles)")
    try:
        task_types = tuple(official_task_type(t) for t in args.task_types)
    except ValueError as err:
        parser.error(str(err))
    target = args.out / "json_2.1.1"
    if os.path.lexists(target):  # its games may be edited, or of other settings: never written into or mixed
        parser.error(f"--out: {target} already exists; choose another --out or move it away")
    # built in a folder of its own beside the target and renamed into place: an interrupted run leaves no half set
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=args.out, prefix=".generating-"))
    try:
        paths = generate_games(tmp, n_per_type=args.n_per_type, n_eval_per_type=args.n_eval_per_type,
                               seed=args.seed, task_types=task_types, n_receptacles=args.receptacles,
                               n_distractors=args.distractors, progress=True)
        (tmp / "json_2.1.1").mkdir(exist_ok=True)  # no games asked for: still the (empty) layout
        os.rename(tmp / "json_2.1.1", target)  # fails on a folder made there meanwhile unless it is empty
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {len(paths)} games under {target}")


if __name__ == "__main__":
    main()
