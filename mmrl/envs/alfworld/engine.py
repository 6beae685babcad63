"""One ALFWorld game on the real TextWorld engine, with the wrapper stack alfworld itself uses.

``textworld.start`` loads the ``.tw-pddl`` game into ``textworld.envs.PddlEnv`` (Fast Downward grounds the PDDL) and
applies alfworld's ``AlfredDemangler`` (object ids -> "apple 1") and ``AlfredInfos`` (the game file in the infos):
the stack ``textworld.gym`` builds for alfworld's ``AlfredTWEnv`` (``textworld/gym/envs/textworld_batch.py``), driven
directly so that one process can hold many games and a reset does not reload the game file. With ``expert=True`` the
``AlfredExpert`` planner wrapper adds Fast Downward's plan (the walkthrough) to every state.

TextWorld's ``PddlEnv`` loads a private copy of Fast Downward's shared library (34 MB, copied to a temporary file and
``dlopen``-ed, since the library keeps the game's state in globals) for every env it builds, and never unloads it: a
process that builds an engine per episode maps a new copy each time, and the deleted copies keep their disk space
until it exits (a long run filled this machine's disk). :class:`Engine` builds the same env with a copy taken from a
per-process pool instead, and returns it on :meth:`Engine.close`; loading a game (``PddlState``) re-initialises
every global of the library, so a returned copy is as good as a new one. Copies alive = engines open at once.

Fast Downward overwrites ``sys.argv`` whenever it parses a problem (load and reset); every call that can reach it runs
under :func:`keep_argv`. Any exception from the engine, and the ``SystemExit`` Fast Downward's PDDL parser raises on
a malformed problem, becomes :class:`~mmrl.envs.base.EnvError` naming the game.

Threads: TextWorld parses game logic and text templates with two module-level tatsu parsers
(``textworld.logic._PARSER``, ``textworld.envs.pddl.textgen._PARSER``), which keep their parse state in the parser
object, and Fast Downward rewrites the process-wide ``sys.argv``; engines used from two threads at once corrupt each
other's parses (``IndexError: pop from empty list``, tatsu ``FailedToken``). Every engine call (load, reset, step,
close) therefore holds :data:`ENGINE_LOCK`, one per process. An engine per thread would not help (the parsers are
shared by the module, not the engine), and the lock costs no throughput: the engine is pure Python apart from Fast
Downward's grounding, so under the GIL two threads never stepped engines in parallel anyway (``benchmarks/envs.py``
measures threads against one thread). Parallel engine steps come from processes (:class:`~mmrl.envs.pool.EnvPool`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
from pathlib import Path

from mmrl.envs.alfworld.grammar import UnsafeGrammar, check_logic
from mmrl.envs.base import EnvError


@contextlib.contextmanager
def keep_argv():
    saved = list(sys.argv)
    try:
        yield
    finally:
        sys.argv[:] = saved


class DownwardLibraries:
    """Fast Downward library copies of closed engines, for the next engines of this process to reuse."""

    def __init__(self) -> None:
        self._free: list = []
        self._lock = threading.Lock()
        self.loaded = 0  # copies this process has loaded

    def acquire(self):
        with self._lock:
            if self._free:
                return self._free.pop()
            self.loaded += 1
        import fast_downward

        return fast_downward.load_lib()

    def release(self, library) -> None:
        with self._lock:
            self._free.append(library)


LIBRARIES = DownwardLibraries()  # per process (EnvPool workers are processes, each with its own)
# Serialises every use of TextWorld's module-level parsers and of sys.argv in this process (see the module docstring).
ENGINE_LOCK = threading.RLock()


@functools.cache
def _pooled_pddl_env_class():
    from textworld.envs.pddl import PddlEnv

    class PooledPddlEnv(PddlEnv):
        def __init__(self, infos, library) -> None:
            super(PddlEnv, self).__init__(infos)  # PddlEnv's own __init__ would load another library copy
            self.downward_lib = library

    return PooledPddlEnv


def pddl_env(infos, library):
    """textworld's ``PddlEnv`` built around ``library`` instead of a fresh copy of it."""
    return _pooled_pddl_env_class()(infos, library)


@dataclasses.dataclass(frozen=True)
class EngineState:
    feedback: str  # the engine's text for the last command (the intro after a reset)
    admissible: list[str]  # admissible commands, sorted (textworld's order)
    won: bool
    plan: list[str] | None = None  # the planner's remaining plan (expert=True only)


class Engine:
    """A loaded game: ``reset()`` and ``step(command)`` return :class:`EngineState`; commands match exactly."""

    def __init__(self, game_path: str | Path, *, template_cache: bool = True, expert: bool = False) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos

        self.game_path = str(game_path)
        if not Path(self.game_path).is_file():
            raise EnvError(f"ALFWorld game file not found: {self.game_path}")
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        wrappers = [functools.partial(AlfredDemangler, shuffle=False), AlfredInfos]
        if expert:
            wrappers.append(functools.partial(AlfredExpert, expert_type="planner"))
        self._expert = expert
        self._library = LIBRARIES.acquire()
        try:
            with ENGINE_LOCK, keep_argv():
                env = pddl_env(infos, self._library)
                for wrapper in wrappers:  # what textworld.start does for a .tw-pddl game
                    env = wrapper(env)
                env.load(self.game_path)  # parses the grammar; nothing of it is evaluated before a reset
                self._env = env
                check_logic(self._pddl_env()._logic, self.game_path)  # what reset and step would evaluate
        except UnsafeGrammar as err:
            self._env = None
            LIBRARIES.release(self._library)
            self._library = None
            raise EnvError(str(err)) from None
        except (Exception, SystemExit) as err:  # bad PDDL (Fast Downward may sys.exit), unreachable goal, ...
            self._env = None
            LIBRARIES.release(self._library)
            self._library = None
            raise EnvError(f"cannot load ALFWorld game {self.game_path}: {type(err).__name__}: {err}") from err
        if template_cache:
            from mmrl.envs.alfworld import template_cache as cache

            with ENGINE_LOCK:
                cache.install(self._pddl_env())

    def _pddl_env(self):
        from textworld.envs.pddl import PddlEnv

        env = self._env
        while not isinstance(env, PddlEnv):  # unwrap textworld.core.Wrapper layers (they forward attributes)
            env = env._wrapped_env
        return env

    def _state(self, state) -> EngineState:
        plan = list(state["extra.expert_plan"]) if self._expert else None
        return EngineState(state["feedback"], list(state["admissible_commands"]), bool(state["won"]), plan)

    def reset(self) -> EngineState:
        try:
            with ENGINE_LOCK, keep_argv():
                return self._state(self._env.reset())
        except (Exception, SystemExit) as err:
            raise EnvError(f"ALFWorld reset failed on {self.game_path}: {type(err).__name__}: {err}") from err

    def step(self, command: str) -> EngineState:
        try:
            with ENGINE_LOCK, keep_argv():
                state, _, _ = self._env.step(command)
                return self._state(state)
        except (Exception, SystemExit) as err:
            message = f"ALFWorld step {command!r} failed on {self.game_path}: {type(err).__name__}: {err}"
            raise EnvError(message) from err

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        library, self._library = getattr(self, "_library", None), None
        try:
            if env is not None:
                with ENGINE_LOCK:
                    env.close()
        finally:
            if library is not None:
                LIBRARIES.release(library)
