"""Any :class:`~mmrl.envs.base.TextEnv` as a ``gymnasium.Env`` with text observation and action spaces.

    from mmrl.envs.adapters.gymnasium_env import TextGymEnv, register
    env = TextGymEnv(AlfWorldEnv(game_path))          # or: register(); gymnasium.make("mmrl/AlfWorld-v0", ...)
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<think>...</think><action>go to cabinet 1</action>")

``terminated`` is a win or loss decided by the game, ``truncated`` the env's step limit (``info["truncated"]``).
Spaces are ``gymnasium.spaces.Text`` over printable ASCII (what ALFWorld emits); the action space describes what the
engine understands, but the wrapped env accepts any string (it scores malformed output itself), so this wrapper does
not reject actions outside it. The async env runs to completion on each call (:func:`mmrl.envs.sync.run_sync`).
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium
from gymnasium import spaces

from mmrl.envs.base import TextEnv
from mmrl.envs.sync import run_sync
from mmrl.errors import UserError

ENV_ID = "mmrl/AlfWorld-v0"
MAX_TEXT = 1 << 16  # characters; a 40-receptacle ALFWorld prompt is ~4k


class TextGymEnv(gymnasium.Env):
    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, env: TextEnv, *, render_mode: str | None = None, max_text: int = MAX_TEXT) -> None:
        if render_mode not in (None, "ansi"):
            raise UserError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.env = env
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=max_text, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=max_text, min_length=0, charset=string.printable)
        self._last_observation = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        observation, info = run_sync(self.env.reset(seed=seed, options=options))
        self._last_observation = observation
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        result = run_sync(self.env.step(action))
        self._last_observation = result.observation
        truncated = bool(result.info.get("truncated", False))
        terminated = bool(result.done and not truncated)
        return result.observation, float(result.reward), terminated, truncated, result.info

    def render(self) -> str | None:
        return self._last_observation if self.render_mode == "ansi" else None

    def close(self) -> None:
        run_sync(self.env.close())
        super().close()


class AlfWorldGymEnv(TextGymEnv):
    """``AlfWorldEnv(game_path, **kwargs)`` as a gymnasium env: the entry point of ``mmrl/AlfWorld-v0``."""

    def __init__(self, game_path: str, render_mode: str | None = None, **env_kwargs: Any) -> None:
        from mmrl.envs.alfworld import AlfWorldEnv

        super().__init__(AlfWorldEnv(game_path, **env_kwargs), render_mode=render_mode)


def register(env_id: str = ENV_ID) -> str:
    """Register ``AlfWorldGymEnv`` with gymnasium (explicitly: importing this module changes no registry)."""
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=f"{__name__}:AlfWorldGymEnv")
    return env_id
