"""One check of a value against the type of its field's default, for config fields, objective hyper-parameters and
task options alike.

The three differ only in what text they read, which the caller passes as ``read_text``:

* config fields: :func:`yaml_scalar` (a flag's ``5e-4`` is a float, ``[0.9, 0.99]`` a list);
* task options: :func:`exact_scalar` (text becomes a number or a flag only where the option is one, so a text option
  keeps exactly what was written: ``"007"`` stays ``"007"``);
* objective hyper-parameters: none (they arrive typed, from the config's ``algo`` section or from Python).

Whatever the text, the value must then be of the default's kind: a flag is ``true`` / ``false``; an integer is an
integer (``1e3`` written as a float is 1000, ``2.5`` is refused, ``true`` is not 1); a number is finite (an inf
learning rate turns every weight into NaN in one step); text is text (a YAML ``5`` for a text field is refused, not
re-written as ``"5"``; a path is text); a fixed-length tuple is checked element by element, and a list must be a list.
A mapping is left to its owner's own check (``cluster.extra`` names what it must map).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import yaml

from mmrl.errors import UserError

TextReader = Callable[[str, Any], Any]


# A config holds hundreds of values. YAML aliases let a few hundred bytes stand for billions of them (the "billion
# laughs"): the parser shares one object per anchor, so the blow-up comes later, when the config is checked, printed
# or saved. Counting every alias as the values it stands for refuses such a document at once.
MAX_YAML_VALUES = 100_000


class YAMLBoundError(yaml.MarkedYAMLError):
    """A document over :data:`MAX_YAML_VALUES` values once its aliases are expanded, or one that contains itself."""


class YAMLRepeatedKeyError(yaml.MarkedYAMLError):
    """A mapping that writes one key twice."""


class _BoundedLoader(yaml.SafeLoader):
    def compose_document(self):
        node = super().compose_document()
        _expanded_size(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        # PyYAML keeps the last of two equal keys without a word: a second ``task:`` section would replace the
        # first whole. A merge (``<<: *base``) may still be overridden by the mapping's own keys.
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise YAMLRepeatedKeyError(problem=f"key {key!r} is repeated (first at line "
                                                   f"{seen[key].start_mark.line + 1}); YAML would keep only the last",
                                           problem_mark=key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep)


def _expanded_size(root: yaml.Node) -> int:
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    aliased = [False]  # whether an alias was met: the refusal says what made the document this large

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            aliased[0] = True
            return sizes[key]
        if key in open_nodes:
            raise YAMLBoundError(problem="an alias refers to a value that contains it", problem_mark=node.start_mark)
        open_nodes.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        open_nodes.discard(key)
        if total > MAX_YAML_VALUES:
            why = (f"aliases expand this value to more than {MAX_YAML_VALUES} values" if aliased[0] else
                   f"this value holds more than {MAX_YAML_VALUES} values (a config holds hundreds)")
            raise YAMLBoundError(problem=why, problem_mark=node.start_mark)
        sizes[key] = total
        return total

    return size(root)


def safe_yaml(text: str) -> Any:
    """``yaml.safe_load`` with its aliases bounded (:data:`MAX_YAML_VALUES`); nesting deeper than Python's recursion
    limit is a ``yaml.YAMLError`` too, not a ``RecursionError``."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 -- a SafeLoader: plain values only
    except RecursionError:
        raise yaml.YAMLError("the document nests values too deeply") from None


def yaml_scalar(text: str, default: Any = None) -> Any:
    """A CLI/YAML string as a Python value: ``5e-4`` is a float (YAML 1.1 alone would keep it a string); text YAML
    cannot read stays text."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    try:
        return safe_yaml(text) if text.strip() else text
    except yaml.YAMLError:
        return text


def exact_scalar(text: str, default: Any) -> Any:
    """Text read as the default's kind only: ``true`` / ``false`` for a flag, ``int()`` / ``float()`` for a number;
    anything else is returned unread (and then refused by :func:`as_default_type`)."""
    if isinstance(default, bool):
        word = text.strip().lower()
        return word == "true" if word in ("true", "false") else text
    if isinstance(default, (int, float)):
        try:
            return int(text) if isinstance(default, int) else float(text)
        except ValueError:
            return text
    return text


def as_default_type(where: str, value: Any, default: Any, read_text: TextReader | None = None, *,
                    allow_none: bool = False) -> Any:
    """``value`` as the type of ``default``, or ValueError ``"<where> must be <kind>, got <value>"``. ``read_text``
    reads a string given for a field that is not text; ``allow_none`` also accepts None (a field whose default is
    None passes an example default of its type)."""
    if allow_none and value is None:
        return None
    if isinstance(value, str) and read_text is not None and not isinstance(default, str):
        value = read_text(value, default)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise UserError(f"{where} must be true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise UserError(f"{where} must be an integer{' or null' if allow_none else ''}, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise UserError(f"{where} must be a finite number, got {value!r}")
    if isinstance(default, str):
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, str):
            return value
        raise UserError(f"{where} must be text, got {value!r} (quote it in YAML)")
    if isinstance(default, tuple):
        if isinstance(value, (list, tuple)) and len(value) == len(default):
            return tuple(as_default_type(f"{where}[{i}]", v, d, read_text)
                         for i, (v, d) in enumerate(zip(value, default, strict=True)))
        raise UserError(f"{where} must be a list of {len(default)} values, got {value!r}")
    if isinstance(default, list):
        if isinstance(value, list):
            return value
        raise UserError(f"{where} must be a list, got {value!r}")
    return value  # a mapping or a None default: its owner checks it (e.g. cluster.extra, by config.validate)
