"""OpenRLHF agent file of the agent turn layout: ``--train.agent_func_path`` names this file.

OpenRLHF loads it by path under a module name of its own that is not in ``sys.modules``, where dataclasses and
pickling cannot find its classes by module; so the executor lives in the importable :mod:`mmrl.openrlhf.turns`.
"""

from mmrl.openrlhf.turns import AgentExecutor

__all__ = ["AgentExecutor"]
