"""A game file's text grammar is checked before TextWorld runs any of it.

TextWorld writes a game's texts from the context-sensitive grammar stored in the game file (its ``grammar`` field:
action templates, feedback rules and ``{expression}`` parts). Every ``{expression}`` is run by Python's ``eval``
(``EvalSymbol.derive`` in ``textworld/envs/pddl/textgen``, and ``str.format`` of the templates when it plans), so a
game file is code: ``{__import__('os').system('…')}`` in a rule would run when the game starts.

What ALFWorld's own grammar (``alfworld/data/alfred.twl2``) evaluates is attribute reads of the placeholders, text and
``+`` / ``or`` (``r.name``, ``o.indefinite + ' ' + o.name``, ``r.name or r.id``). :func:`check_logic` walks a loaded
game's grammar and templates and refuses any expression beyond that (a call, a subscript, a name or attribute with
``_``, anything Python cannot parse) with one line naming the game file. :func:`check_grammar_text` does the same on
a file's text before anything is loaded; a grammar that is ALFWorld's own with only the task sentence filled in (the
generated sets and the official data) is recognised without parsing it again.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

from mmrl.errors import UserError

_NODES = (ast.Expression, ast.Name, ast.Attribute, ast.Constant, ast.BinOp, ast.Add, ast.BoolOp, ast.Or, ast.And,
          ast.Load)
# What a task sentence may hold to stay plain text in the rule that quotes it: no quote, escape or grammar mark.
_SENTENCE = re.compile(r"[\w .,:()/'-]*")
_PLACEHOLDER = "UNKNOWN GOAL"


class UnsafeGrammar(UserError):
    """A game's grammar holds something TextWorld would run as code beyond reading placeholders."""


@functools.lru_cache(maxsize=4096)
def plain_expression(expression: str) -> bool:
    """True when ``expression`` only reads names and attributes (none starting with ``_``) and joins text."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            return False
        if isinstance(node, ast.Name) and node.id.startswith("_"):
            return False
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            return False
        if isinstance(node, ast.Constant) and type(node.value) not in (str, int, float):
            return False
    return True


def _expressions(symbol: Any) -> list[str]:
    """The ``{expression}`` texts inside one parsed textgen symbol (nested ones included)."""
    from textworld.envs.pddl import textgen

    if isinstance(symbol, textgen.EvalSymbol):
        return [symbol.expression]
    if isinstance(symbol, textgen.ConditionalSymbol):
        return _expressions(symbol.expression)
    if isinstance(symbol, textgen.ListSymbol):
        return _expressions(symbol.symbol)
    if isinstance(symbol, (textgen.TerminalSymbol, textgen.NonterminalSymbol)):
        return []
    raise UnsafeGrammar(f"a grammar symbol of a kind this check does not know ({type(symbol).__name__})")


@functools.lru_cache(maxsize=4096)
def _template_expressions(text: str) -> tuple[str, ...]:
    from textworld.envs.pddl import textgen

    try:
        symbols = textgen._parse_and_convert(text, rule_name="symbols")
    except Exception as exc:  # noqa: BLE001 -- tatsu raises its own parse errors: refused, named below
        raise UnsafeGrammar(f"a template TextWorld cannot parse ({text[:60]!r}: {type(exc).__name__})") from None
    return tuple(e for symbol in symbols for e in _expressions(symbol))


def check_logic(logic: Any, game_path: str | Path) -> None:
    """Refuse a loaded ``GameLogic`` (``PddlEnv._logic``) whose rules or action templates hold code; raises
    :class:`UnsafeGrammar` naming ``game_path``."""
    try:
        found = [e for rules in logic.grammar._rules.values() for rule in rules for symbol in rule.rhs
                 for e in _expressions(symbol)]
        for action in logic.actions.values():
            found += _template_expressions(action.template) + _template_expressions(action.feedback_rule)
    except UnsafeGrammar as exc:
        raise UnsafeGrammar(f"ALFWorld game {game_path}: refused, its grammar holds {exc}") from None
    bad = next((e for e in found if not plain_expression(e)), None)
    if bad is not None:
        raise UnsafeGrammar(f"ALFWorld game {game_path}: refused, its grammar holds {{{bad.strip()[:80]}}}, which "
                            "TextWorld would run as Python code (a game file may only read placeholders such as "
                            "{r.name}); play only game files you trust")


@functools.cache
def _alfworld_grammar() -> tuple[str, str] | None:
    """ALFWorld's bundled grammar split around its task placeholder, checked once per process."""
    from alfworld.info import ALFRED_TWL2_PATH

    text = Path(ALFRED_TWL2_PATH).read_text()
    if text.count(_PLACEHOLDER) != 1:
        return None
    _check_parsed(text, ALFRED_TWL2_PATH)
    before, after = text.split(_PLACEHOLDER)
    return before, after


def _check_parsed(text: str, game_path: str | Path) -> None:
    from textworld.envs.pddl.logic import GameLogic

    try:
        logic = GameLogic(domain="", grammar=text)
    except Exception as exc:  # noqa: BLE001 -- tatsu's parse errors: one line naming the file
        raise UnsafeGrammar(f"ALFWorld game {game_path}: its grammar cannot be parsed ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None
    check_logic(logic, game_path)


def check_grammar_text(text: str, game_path: str | Path) -> None:
    """Refuse a game file's ``grammar`` text that holds code (see the module docstring), before it is loaded."""
    known = _alfworld_grammar()
    if known is not None:
        before, after = known
        sentence = text[len(before): len(text) - len(after)]
        if (len(text) >= len(before) + len(after) and text.startswith(before) and text.endswith(after)
                and _SENTENCE.fullmatch(sentence)):
            return
    _check_parsed(text, game_path)
