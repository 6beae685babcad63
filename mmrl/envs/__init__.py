"""Text environments for language-model agents, importable with no trainer installed (see base.py, docs/envs.md).

- ``mmrl.envs.alfworld``: ALFWorld on the real TextWorld engine, its game generator and loader (``alfworld`` extra);
- ``mmrl.envs.pool``: many envs per worker process, async stepping, timeouts, crash isolation;
- ``mmrl.envs.adapters``: gymnasium, TRL and OpenRLHF front-ends.
"""

from mmrl.envs.actions import ParsedAction, format_action, parse_action
from mmrl.envs.base import EnvError, EnvInfo, StepResult, TextEnv

__all__ = ["EnvError", "EnvInfo", "ParsedAction", "StepResult", "TextEnv", "format_action", "parse_action"]
