"""How a path a user writes is read, the same for every path field, flag and option.

A shell expands ``~`` and ``$VAR`` before a program sees its arguments, but not inside a YAML file or a quoted flag,
so ``run.out_dir: ~/runs`` would otherwise create a folder named ``~`` in the working directory. Every path mmrl takes
from a user (config path fields, ``--out``, ``--model``, ``--config``, ``task.path``, ``task.eval_path``, the
``mmrl.eval`` output files) goes through `expand_path`: ``~`` and ``~user`` become the home folder, ``$VAR`` and
``${VAR}`` the variable's value, and a variable that is not set is refused in one line naming the field, never kept
as literal text.
"""

from __future__ import annotations

import os
import re

from mmrl.errors import UserError

RULE = "~ and $VAR are expanded as a shell would; an unset variable is an error"
_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_path(field: str, text: str) -> str:
    """``text`` with ``~`` and environment variables expanded; UserError naming ``field`` for an unset variable."""
    if not isinstance(text, str) or not text:
        return text
    expanded = os.path.expanduser(os.path.expandvars(text))
    left = _VARIABLE.search(os.path.expandvars(text))
    if left is not None:
        name = left.group(1).strip("{}")
        raise UserError(f"{field}: {text!r} names the environment variable ${name}, which is not set (in a path, "
                        f"{RULE})")
    return expanded
