"""The six ALFWorld task types: official names, the short names users type, and what each one needs of a room.

Names follow ALFRED's ``traj_data.json`` ``task_type`` field (alfworld's ``TASK_TYPES``); the room kinds each task may
appear in follow ``alfworld.gen.constants.GOALS_VALID``.
"""

from __future__ import annotations

from mmrl.errors import UserError

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

# Short names (the GMPO paper / verl-agent report per-type success under these) -> official task_type.
SHORT_NAMES: dict[str, str] = {
    "pick_and_place": "pick_and_place_simple",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_clean_then_place": "pick_clean_then_place_in_recep",
    "pick_heat_then_place": "pick_heat_then_place_in_recep",
    "pick_cool_then_place": "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place": "pick_two_obj_and_place",
}
SHORT_OF: dict[str, str] = {official: short for short, official in SHORT_NAMES.items()}

# The appliance a state-change task uses (a receptacle type that must be in the room) and the
# alfworld.gen.constants.VAL_ACTION_OBJECTS class the target object must belong to.
APPLIANCE: dict[str, tuple[str, str]] = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}

# Receptacle types a desk lamp stands on (look_at_obj_in_light needs the lamp *in* a receptacle: ToggleObject's
# precondition in alfred.pddl is (inReceptacle ?o ?r) with ?r at the agent's location).
LAMP_STANDS: tuple[str, ...] = ("Desk", "SideTable", "Dresser")


def official_task_type(name: str) -> str:
    """``pick_and_place`` or ``pick_and_place_simple`` -> ``pick_and_place_simple``; anything else is an error."""
    if name in TASK_TYPES:
        return name
    if name in SHORT_NAMES:
        return SHORT_NAMES[name]
    raise UserError(f"unknown ALFWorld task type {name!r}; expected one of {sorted(SHORT_NAMES)} "
                     f"or {list(TASK_TYPES)}")
