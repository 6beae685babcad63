"""The ``alfworld`` task: multi-turn household games on the real TextWorld engine (GMPO's Table 1d / App. D, the
GiGPO / verl-agent setup), played by :class:`mmrl.envs.alfworld.AlfWorldEnv`.

Rows are games: ``{"game": path, "task_type": ...}`` from a generated set (built into the cache on first use by
``mmrl.envs.alfworld.games.ensure_games``) or from the official layout (``games_root`` or ``$ALFWORLD_DATA``). The
env renders the prompt (task, observation, admissible actions), parses ``<action>…</action>`` from the model's raw
text and pays 10·won at the end minus ``invalid_action_penalty`` per step without a well-formed action.

Demonstrations for the SFT warm-up (``expert``):

- ``explorer`` (default): :class:`mmrl.envs.alfworld.explorer.Explorer`, a scripted player that acts only on what the
  model sees (it searches unvisited receptacles in a seeded order, opens closed ones, takes the target when in sight,
  remembers where things are), with a short ``<think>`` naming its sub-goal ("find keychain", "put keychain in
  drawer"). It is imitable: every decision is a function of the episode's text.
- ``walkthrough``: the planner's solution stored in the game file, ``<think>the task</think><action>step</action>``.
  The planner knows where everything is, so cloning it teaches walking to places a player cannot know about; kept
  for comparison (benchmarks/alfworld.py measured it: no held-out game won).

Nothing here imports the engine at module import: ``alfworld`` is an optional extra (``pip install mmrl[alfworld]``).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from mmrl.errors import UserError
from mmrl.tasks.base import EnvTask, register_task

# Recommended config for ``--task alfworld`` (under the user's YAML and flags): the embedded agent model (a tokenizer
# with ALFWorld's vocabulary and a long context), per-turn and per-episode token budgets, small groups.
ALFWORLD_DEFAULTS = {
    "model.name": "embedded:tiny-qwen2-agent",
    "rollout.max_new_tokens": 40,
    "rollout.max_episode_tokens": 3072,
    "rollout.prompts_per_step": 4,
    "rollout.samples_per_prompt": 4,
    "rollout.generation_batch_size": 64,
    "optim.lr": 2e-4,
    "optim.micro_batch_size": 8,
    # A fresh Adam moves every weight by the full lr on its first step (m/sqrt(v) = sign g): k3 KL to pi_old
    # far above 1 after step 0 in runs without warm-up, and some of those runs collapse. 10 optimizer steps of linear
    # warm-up remove it (docs/alfworld.md, "Choices").
    "optim.warmup_steps": 10,
    # The warm start is nearly deterministic (token entropy 0.04 nats): one Adam step moves a few tokens' probability
    # by e^5 or more while the mean barely moves, and neither the ratio clip nor the gradient clip binds. Each
    # optimizer step is held at mean k3 KL to pi_old <= 0.02, just above what the first warm-up steps move
    # (docs/alfworld.md, "The KL band").
    "optim.target_kl": 0.02,
    "run.steps": 30,
    "run.eval_samples": 2,
    "run.checkpoint_every": 0,
    "sft.steps": 0,
}

GOAL = re.compile(r"Your task is to:\s*(.+?)\s*(?:\.\s*$|\.\s*\n|\n|$)", re.MULTILINE)


def goal_of(observation: str) -> str:
    """The task sentence of a first observation ("Your task is to: put a clean apple in fridge.")."""
    found = GOAL.search(observation)
    return found.group(1).strip() if found else ""


def walkthrough(game_path: str | Path) -> list[str]:
    """The expert's actions stored in a ``.tw-pddl`` game file (``walkthrough``), or an error naming the file."""
    path = Path(game_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"alfworld: cannot read game file {path}: {exc}") from exc
    steps = data.get("walkthrough")
    if not isinstance(steps, list) or not steps:
        raise UserError(f"alfworld: game file {path} has no walkthrough")
    return [str(s) for s in steps]


def expert_text(goal: str, action: str) -> str:
    return f"<think>{goal}</think><action>{action}</action>"


EXPERTS = ("explorer", "walkthrough")


def explorer_player(game_path: str, seed: int):
    """An :class:`Explorer` for one episode as an SFT player: (observation, info) -> turn text."""
    from mmrl.envs.alfworld.explorer import Explorer

    explorer = Explorer.for_game(game_path, random.Random(seed))

    def play(observation: str, info: dict[str, Any]) -> str:
        think, command = explorer.act(info.get("feedback", ""), list(info.get("admissible_actions", [])))
        return expert_text(think, command)

    return play


def walkthrough_player(game_path: str, seed: int):
    """The planner's walkthrough, one command per turn, each with the task sentence as its think."""
    steps, goal = walkthrough(game_path), []

    def play(observation: str, info: dict[str, Any]) -> str:
        if not goal:
            goal.append(str(info.get("task", "")) or goal_of(observation))
        turn = int(info.get("step", 0))
        return expert_text(goal[0], steps[turn]) if turn < len(steps) else ""

    return play


def _rows(games) -> list[dict[str, Any]]:
    return [{"game": str(g.path), "task_type": g.task_type} for g in games]


@register_task("alfworld", config_defaults=ALFWORLD_DEFAULTS)
def alfworld_task(games_root: str = "", n_per_type: int = 8, n_eval_per_type: int = 2, train_split: str = "train",
                  eval_split: str = "valid_seen", max_eval_games: int = 12, max_steps: int = 15,
                  history_length: int = 2, invalid_action_penalty: float = 0.1, task_types: str = "",
                  expert: str = "explorer", seed: int = 0, receptacles: int = 8, distractors: int = 4) -> EnvTask:
    """``games_root``: "" builds (once) the generated set into the cache, ``n_per_type`` training games and
    ``n_eval_per_type`` games of each held-out split per task type (six types); a path (or ``$ALFWORLD_DATA``) reads a
    tree in the official layout. ``max_eval_games``: held-out games used by evaluation (0 = all). ``task_types``: a
    comma-separated subset of the six types (official or short names), "" = all. ``expert``: who the SFT warm-up
    imitates, ``explorer`` (searches like a player) or ``walkthrough`` (the planner's privileged solution).
    ``receptacles`` and ``distractors``: the rooms of the generated set (receptacles per room, objects besides the
    task's own); with ``task_types`` set, only those types are generated."""
    try:
        from mmrl.envs.alfworld import TASK_TYPES, AlfWorldEnv, ensure_games, list_games
        from mmrl.envs.alfworld.tasks import official_task_type
    except ImportError as exc:
        raise UserError(f"task alfworld needs the ALFWorld engine (pip install 'mmrl[alfworld]'): {exc}") from exc
    if max_steps < 1:
        raise UserError(f"task.max_steps must be >= 1, got {max_steps}")
    if expert not in EXPERTS:
        raise UserError(f"task.expert must be one of {EXPERTS}, got {expert!r}")
    if n_per_type < 1 or n_eval_per_type < 1:
        raise UserError(f"task.n_per_type and task.n_eval_per_type must be >= 1, got {n_per_type}, {n_eval_per_type}")
    if receptacles < 4 or distractors < 0:  # every room kind has four fixed receptacles
        raise UserError(f"task.receptacles must be >= 4 and task.distractors >= 0, got {receptacles}, {distractors}")
    try:
        types = [official_task_type(t.strip()) for t in task_types.split(",") if t.strip()] or None
    except ValueError as exc:
        raise UserError(f"task.task_types: {exc}") from None
    try:
        root = games_root or ensure_games(n_per_type=n_per_type, n_eval_per_type=n_eval_per_type, seed=seed,
                                          n_receptacles=receptacles, n_distractors=distractors,
                                          task_types=tuple(types or TASK_TYPES))
        train, held_out = list_games(root, train_split, types), list_games(root, eval_split, types)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(f"task.games_root: {exc}") from exc
    if not train:
        raise UserError(f"task.games_root: no {train_split!r} games under {root}")
    held_out = held_out[:max_eval_games] if max_eval_games else held_out

    def env_kwargs(row: dict[str, Any]) -> dict[str, Any]:
        return {"game_path": row["game"], "max_steps": max_steps, "history_length": history_length,
                "invalid_action_penalty": invalid_action_penalty}

    def expert_player(row: dict[str, Any], player_seed: int):
        make = explorer_player if expert == "explorer" else walkthrough_player
        return make(row["game"], player_seed)

    types = sorted({g.task_type for g in train})
    return EnvTask("alfworld", train=_rows(train), eval=_rows(held_out), env_class=AlfWorldEnv, env_kwargs=env_kwargs,
                   expert=expert_player, turn_env_kwargs={"observation_mode": "window"},
                   description=f"ALFWorld on TextWorld: {len(train)} {train_split} games, {len(held_out)} held-out "
                               f"({eval_split}); task types {', '.join(types)}; max_steps {max_steps}")
