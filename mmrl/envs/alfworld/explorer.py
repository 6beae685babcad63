"""A scripted ALFWorld agent that acts only on what a player sees: the goal, the feedback, the admissible commands.

The planner's walkthrough stored in each game knows where every object is, so cloning it teaches a model to walk
straight to a place it cannot know about in an unseen room: on held-out games such a policy has nothing to go on.
:class:`Explorer` is the demonstration a learner *can* imitate. It searches: it visits receptacles it has not seen
yet (in an order drawn from its own ``rng``, so demonstrations of one game differ and the cloned policy keeps the
spread a group needs), opens closed ones, takes a target object as soon as one is in sight, remembers where it saw
things, and then does what the task type asks (clean / heat / cool at the appliance, use the lamp, put it in a
receptacle of the goal's type, twice for ``pick_two``).

Each turn it also says, in a few words, what it is doing (``find keychain``, ``take keychain``, ``heat bread``,
``put keychain in drawer``): that is its ``<think>``. The words are the goal's own object and receptacle names, so
the action that follows mostly copies names already in front of it.

The goal comes from the game's ``traj_data.json`` (``task_type`` and ``pddl_params``, present in ALFWorld's own data
and in generated games): the task sentence states the same thing in one of many phrasings.

    explorer = Explorer.for_game(game_path, rng=random.Random(0))
    think, command = explorer.act(info["feedback"], info["admissible_actions"])   # after reset, then every step
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

from mmrl.envs.alfworld.tasks import APPLIANCE
from mmrl.errors import UserError

VERB = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "heat",
        "pick_cool_then_place_in_recep": "cool"}
_ARRIVE = re.compile(r"You arrive at ([a-z]+ \d+)\.")
_PICK = re.compile(r"You pick up the ([a-z]+ \d+) from the ([a-z]+ \d+)\.")
_MOVE = re.compile(r"You move the ([a-z]+ \d+) to the ([a-z]+ \d+)\.")
_CHANGE = re.compile(r"You (?:clean|heat|cool) the ([a-z]+ \d+) using the ([a-z]+ \d+)\.")
_OPEN = re.compile(r"You open the ([a-z]+ \d+)\.")
_CONTENTS = re.compile(r"(?:On the ([a-z]+ \d+)|The ([a-z]+ \d+) is open\. In it), you see ([^.]*)\.")
_THING = re.compile(r"\ban? ([a-z]+ \d+)")


def kind(name: str) -> str:
    """``"drawer 2"`` -> ``"drawer"``."""
    return name.rsplit(" ", 1)[0]


@dataclasses.dataclass(frozen=True)
class Goal:
    task_type: str  # official name
    obj: str  # object type, lower case ("keychain")
    recep: str  # receptacle type to put it in ("drawer"); "" for look_at_obj_in_light
    toggle: str  # lamp type for look_at_obj_in_light ("desklamp"), else ""

    @classmethod
    def for_game(cls, game_path: str | Path) -> Goal:
        """The goal of the game at ``game_path`` from the ``traj_data.json`` beside it; an error names the file."""
        traj = Path(game_path).parent / "traj_data.json"
        try:
            data = json.loads(traj.read_text())
            params = data["pddl_params"]
            return cls(data["task_type"], params["object_target"].lower(), params["parent_target"].lower(),
                       params["toggle_target"].lower())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise UserError(f"explorer: cannot read the goal from {traj}: {type(exc).__name__}: {exc}") from exc


class Explorer:
    """One episode's scripted player; call :meth:`act` with the feedback of reset, then of every step."""

    def __init__(self, goal: Goal, rng: random.Random | None = None):
        self.goal = goal
        self.rng = rng or random.Random(0)
        self.location = ""
        self.holding = ""
        self.changed = False  # the held object was cleaned / heated / cooled
        self.placed: list[tuple[str, str]] = []  # (object, receptacle) put at the goal
        self.visited: set[str] = set()
        self.opened: set[str] = set()
        self.seen: dict[str, str] = {}  # thing -> where it was last seen
        self.order: list[str] = []  # exploration order, drawn once from the first admissible "go to"s

    @classmethod
    def for_game(cls, game_path: str | Path, rng: random.Random | None = None) -> Explorer:
        return cls(Goal.for_game(game_path), rng)

    def observe(self, feedback: str) -> None:
        if m := _ARRIVE.search(feedback):
            self.location = m.group(1)
            self.visited.add(self.location)
        if m := _PICK.search(feedback):
            self.holding = m.group(1)
            self.changed = False
            self.seen.pop(self.holding, None)
        if m := _MOVE.search(feedback):
            if kind(m.group(1)) == self.goal.obj and kind(m.group(2)) == self.goal.recep:
                self.placed.append((m.group(1), m.group(2)))
            self.seen[m.group(1)] = m.group(2)
            self.holding = ""
        if (m := _CHANGE.search(feedback)) and m.group(1) == self.holding:
            self.changed = True
        if m := _OPEN.search(feedback):
            self.opened.add(m.group(1))
        for m in _CONTENTS.finditer(feedback):
            where = m.group(1) or m.group(2)
            for thing in _THING.findall(m.group(3)):
                self.seen[thing] = where

    def act(self, feedback: str, admissible: list[str]) -> tuple[str, str]:
        """(think, command) for the current state; ``command`` is always one of ``admissible``."""
        self.observe(feedback)
        allowed = [a for a in admissible if a != "help"]
        if not self.order:
            self.order = [a[len("go to "):] for a in allowed if a.startswith("go to ")]
            self.rng.shuffle(self.order)
        g = self.goal
        if self.holding and kind(self.holding) == g.obj:
            if g.toggle:
                return self._to_lamp(f"look at {g.obj} under {g.toggle}", g.toggle, allowed)
            if g.task_type in VERB and not self.changed:
                verb, appliance = VERB[g.task_type], APPLIANCE[g.task_type][0].lower()
                command = f"{verb} {self.holding} with {self.location}"
                if kind(self.location) == appliance and command in allowed:
                    return f"{verb} {g.obj}", command
                return f"{verb} {g.obj}", self._go_to_kind(appliance, allowed)
            return self._put(allowed)
        wanted = [t for t, where in self.seen.items() if kind(t) == g.obj and (t, where) not in self.placed]
        for thing in wanted:
            command = f"take {thing} from {self.location}"
            if command in allowed:
                return f"take {g.obj}", command
        if wanted and (goto := f"go to {self.seen[wanted[0]]}") in allowed:
            return f"take {g.obj}", goto
        return self._search(g.obj, allowed)

    def _put(self, allowed: list[str]) -> tuple[str, str]:
        g = self.goal
        think = f"put {g.obj} in {g.recep}"
        target = self.placed[0][1] if self.placed else ""  # pick_two: both in the same receptacle
        if kind(self.location) == g.recep and (not target or self.location == target):
            command = f"move {self.holding} to {self.location}"
            if command in allowed:
                return think, command
            if f"open {self.location}" in allowed:
                return think, f"open {self.location}"
        if target and f"go to {target}" in allowed:
            return think, f"go to {target}"
        return think, self._go_to_kind(g.recep, allowed)

    def _to_lamp(self, think: str, lamp: str, allowed: list[str]) -> tuple[str, str]:
        for command in allowed:
            if command.startswith(f"use {lamp} "):
                return think, command
        where = [w for t, w in self.seen.items() if kind(t) == lamp]
        if where and f"go to {where[0]}" in allowed:
            return think, f"go to {where[0]}"
        return self._search(lamp, allowed, think=think)

    def _search(self, thing: str, allowed: list[str], think: str | None = None) -> tuple[str, str]:
        think = think or f"find {thing}"
        if self.location and self.location not in self.opened and f"open {self.location}" in allowed:
            return think, f"open {self.location}"
        for place in self.order:
            if place not in self.visited and f"go to {place}" in allowed:
                return think, f"go to {place}"
        # Everything seen once and the thing not found: look again in a random other place (closed ones were
        # opened; a thing may have been missed only if a receptacle was listed later).
        gotos = [a for a in allowed if a.startswith("go to ")]
        return think, self.rng.choice(gotos) if gotos else "look"

    def _go_to_kind(self, receptacle: str, allowed: list[str]) -> str:
        places = sorted(a for a in allowed if a.startswith(f"go to {receptacle} "))
        return places[0] if places else self._search(receptacle, allowed)[1]
