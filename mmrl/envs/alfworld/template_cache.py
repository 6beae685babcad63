"""The memoised step of TextWorld's PDDL engine: parses, texts, operators and translations computed once; everything
it reports (feedback, admissible commands, won, the planner's plan) is unchanged byte for byte.

Profile of one ALFWorld step (textworld 1.7, ``PddlEnv.step``): about three quarters of the time goes to the tatsu
PEG parser, re-parsing the same few dozen strings on every step: each admissible command's template
(``ContextSensitiveGrammar.derive`` parses its start string), each rule's condition and each ``{expr | query}``
(``Rule.parse_conjunctive_query``). Parsing is a pure function of the string, so we parse each string once:

- symbol lists are cached pristine and handed out as deep copies (the derivation mutates the symbols it gets);
- conjunctive queries are cached as ``Rule`` objects and shared (``State.all_assignments`` only reads them);
- ``{expression}`` parts are compiled once (textgen's ``eval`` of the string compiled it on every use), and a
  template made only of text and such parts is evaluated directly (:func:`flat_plan`);
- the per-symbol contexts are copied one level deep instead of deep-copied (see :func:`fresh_context`), and symbols
  are cloned by :func:`clone_symbol` instead of ``copy.deepcopy``.

Once parsing is memoised, a step is deriving texts: the feedback, and the text of every admissible command (one
grammar derivation per applicable operator). A text is a function of its template, the arguments its queries and
expressions can read, the arguments a query's new placeholders must not take (``all_assignments`` skips variables
already in the mapping) and the facts its queries can read (the conditions and ``{x | query}`` parts reachable from
the template through the grammar, each predicate with its sub-types), and nothing else: the entity names are fixed per
game. :class:`CachedSteps` memoises the commands and the feedback under exactly that key (:meth:`CachedSteps._key_plan`
works out what it is from the template, once per template and kind of action), so "go to drawer 1" is derived once
per game, from whichever location, while the drawers' locations stay the same, and "You arrive at drawer 1. ..." once
per state of what it describes; a template whose text could depend on anything else (an expression that can read
textgen's own frame, a symbol kind this analysis does not know) is derived every time. The facts a key names are
frozen once per change (:class:`CachedFacts`, which also keeps each signature's facts sorted for the queries instead of
sorting them on every query).

The rest of a step rebuilt per-problem constants: the textworld ``Action`` of every applicable Fast Downward operator
(a function of the operator's id, :class:`ProblemTables`), the parsed effect atoms, and at every reset the problem's
two Fast Downward translations (~80 ms, most of a reset: :func:`translated_state`).

It is enabled per environment, never globally: :func:`install` swaps the class of one loaded game's grammar and of
the symbols in its rules for the subclasses below, whose ``derive``/``replace`` run the same algorithm as textworld's
(``textworld/envs/pddl/textgen/__init__.py``) with the parses memoised, and the class of the env for one whose
``reset``/``step``/``_gather_infos`` are textworld's (``textworld/envs/pddl/pddl.py``) with the memos above; the
memos live in the env (per engine), so nothing is shared between processes or games. ``tests/test_envs_alfworld.py``
checks that full episodes (walkthroughs, random walks with resets and invalid commands, the planner's plans) are
byte-identical with and without it, and that the memo is what answers.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

from textworld.envs.pddl import textgen
from textworld.logic import Rule, Signature


@functools.lru_cache(maxsize=8192)
def _pristine_symbols(text: str) -> tuple[Any, ...]:
    symbols = textgen._parse_and_convert(text, rule_name="symbols")
    return tuple(_with_cached_classes(symbol) for symbol in symbols)


@functools.lru_cache(maxsize=8192)
def conjunctive_query(expression: str) -> Rule:
    """``Rule.parse_conjunctive_query`` memoised (a Rule is immutable for every use the text generator makes)."""
    return Rule.parse_conjunctive_query(expression)


def parse_symbols(text: str) -> list[Any]:
    """A fresh, mutable copy of the parsed symbols of ``text``."""
    return [clone_symbol(symbol) for symbol in _pristine_symbols(text)]


def clone_symbol(symbol: Any) -> Any:
    """What ``copy.deepcopy`` of a context-free symbol gives, ~10x cheaper: a shallow copy with an empty context and
    its nested symbols (a conditional's expression, a list's element) cloned too. Everything else a symbol holds is an
    immutable string, and the derivation only ever assigns ``context``."""
    new = object.__new__(type(symbol))
    new.__dict__.update(symbol.__dict__)
    new.context = {}
    for child in ("expression", "symbol"):
        inner = getattr(new, child, None)
        if isinstance(inner, textgen.Symbol):
            setattr(new, child, clone_symbol(inner))
    return new


def _with_cached_classes(symbol: Any) -> Any:
    """Swap ConditionalSymbol and EvalSymbol for their cached subclasses, recursively (in place; returns ``symbol``)."""
    if type(symbol) is textgen.ConditionalSymbol:
        symbol.__class__ = CachedConditionalSymbol
    elif type(symbol) is textgen.EvalSymbol:
        symbol.__class__ = CachedEvalSymbol
    for child in ("expression", "symbol"):
        inner = getattr(symbol, child, None)
        if isinstance(inner, textgen.Symbol):
            _with_cached_classes(inner)
    return symbol


def fresh_context(context: dict[str, Any]) -> dict[str, Any]:
    """textgen.copy_context without deep-copying the entity infos and variables: the derivation only adds keys to the
    two dicts and never mutates the objects in them (the ALFRED grammar only reads ``name``/``indefinite``), and the
    deep copies were most of a step once parsing is memoised."""
    return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}


def _query(expression: str, context: dict[str, Any]) -> list[dict[str, Any]]:
    """textgen.query with the parsed rule memoised."""
    contexts = []
    for mapping in context["state"].all_assignments(conjunctive_query(expression), context["mapping"]):
        new_context = fresh_context(context)
        new_context["variables"].update({ph.name: new_context["entity_infos"][var.name] for ph, var in mapping.items()})
        new_context["mapping"].update(mapping)
        contexts.append(new_context)
    return contexts


_NONE = object()


@functools.lru_cache(maxsize=8192)
def compiled(expression: str):
    """``expression`` compiled as ``eval`` compiles it (textgen has no ``__future__`` flags to inherit)."""
    return compile(expression, "<string>", "eval", dont_inherit=True)


# The names textgen's EvalSymbol.derive binds in the frame it evaluates in (it evaluates in its own locals after
# ``locals().update(variables)``: its parameters shadow the variables, and its not-yet-bound ``value`` hides one).
_FRAME_NAMES = frozenset({"self", "context", "value"})


class CachedEvalSymbol(textgen.EvalSymbol):
    def derive(self, context=None):
        """textgen's: the expression evaluated over the context's variables, with its compilation memoised and the
        same namespace (the variables, then ``self`` and ``context``, without ``value``; textgen's globals)."""
        context = context or self.context
        namespace = dict(context["variables"])
        namespace.pop("value", None)
        namespace["self"], namespace["context"] = self, context
        return [textgen.TerminalSymbol(eval(compiled(self.expression), vars(textgen), namespace))]


@functools.lru_cache(maxsize=8192)
def flat_plan(text: str) -> tuple | None:
    """For a template made only of text and plain ``{expression}`` parts (an EvalSymbol, or a ConditionalSymbol with
    no query around one) whose expressions read only the variables, its parts in order: a string for text, a code
    object for an expression. Its derivation is then exactly the concatenation of the text and ``str`` of each
    expression evaluated over the variables (no grammar rule, no state query, no context copy). None otherwise."""
    parts: list = []
    for symbol in _pristine_symbols(text):
        if type(symbol) is textgen.TerminalSymbol:
            parts.append(str(symbol))
            continue
        if isinstance(symbol, textgen.ConditionalSymbol) and not symbol.given:
            symbol = symbol.expression
        if type(symbol) is not CachedEvalSymbol:
            return None
        code = compiled(symbol.expression)
        if _FRAME_NAMES & set(code.co_names):  # could read textgen's frame, not just the variables
            return None
        parts.append(code)
    return tuple(parts)


class CachedConditionalSymbol(textgen.ConditionalSymbol):
    def derive(self):
        if len(self.context) == 0:
            raise ValueError("Empty context")
        context = fresh_context(self.context)
        contexts = _query(self.given, context) if self.given else [context]
        derived = []
        for c in contexts:  # textgen's Symbol.copy: a deep copy of the (context-free) expression, then its context
            expression = clone_symbol(self.expression)
            expression.context = fresh_context(c)
            derived.append(expression)
        return derived


class CachedGrammar(textgen.ContextSensitiveGrammar):
    def replace(self, start):
        rules = self._rules.get(str(start))
        if not rules:
            raise textgen.CSGUnknownSymbolError(start)

        def applicable(rule) -> bool:
            if not rule.condition:
                return True
            mappings = start.context["state"].all_assignments(conjunctive_query(rule.condition),
                                                              start.context["mapping"])
            return next(iter(mappings), _NONE) is not _NONE  # one match is enough (textworld lists them all)

        chosen = next((rule for rule in rules if applicable(rule)), None)
        if chosen is None:
            raise IndexError(f"no production of #{start}# applies")
        symbols = [clone_symbol(symbol) for symbol in chosen.rhs]
        for symbol in symbols:
            symbol.context = fresh_context(start.context)
        return symbols

    def derive(self, start: str, context=None) -> str:
        context = {} if context is None else context
        plan = flat_plan(start)
        if plan is not None and context:
            namespace = vars(textgen)
            return "".join(part if type(part) is str else str(eval(part, namespace, dict(context["variables"])))
                           for part in plan)
        stack = parse_symbols(start)[::-1]  # a derivation stack, top at the end
        for symbol in stack:
            symbol.context = fresh_context(context)
        derived = []
        while stack:
            symbol = stack.pop()
            if isinstance(symbol, textgen.TerminalSymbol):
                derived.append(symbol)
            elif isinstance(symbol, textgen.NonterminalSymbol):
                stack += self.replace(symbol)[::-1]
            elif isinstance(symbol, (textgen.ConditionalSymbol, textgen.EvalSymbol, textgen.ListSymbol)):
                stack += symbol.derive()[::-1]
            else:
                # TextWorld's grammar has exactly the four symbol kinds above; anything else is an engine version we
                # do not know, which must fail loudly (the env turns it into EnvError) rather than derive wrong text
                raise TypeError(f"textgen symbol of unknown type {type(symbol).__name__}")
        return "".join(map(str, derived))


_UNCACHEABLE = None


@dataclasses.dataclass(frozen=True)
class Dependencies:
    """What the derivation of a template can read besides the entity infos (fixed per game): the conjunctive queries
    it can evaluate (its own ``{x | query}`` parts, and the conditions and parts of every rule reachable from it) and
    the names its ``{expression}`` parts can read (variables, or textgen's globals)."""

    queries: frozenset[str]
    names: frozenset[str]


def template_dependencies(grammar: CachedGrammar, template: str) -> Dependencies | None:
    """The :class:`Dependencies` of ``template``, or None when its text could depend on more (a symbol kind this
    analysis does not know, an expression that can read textgen's frame). Memoised per grammar."""
    memo = grammar.__dict__.setdefault("_mmrl_template_dependencies", {})
    if template not in memo:
        queries: set[str] = set()
        names: set[str] = set()
        ok = _collect(grammar, parse_symbols(template), queries, names, set())
        memo[template] = Dependencies(frozenset(queries), frozenset(names)) if ok else _UNCACHEABLE
    return memo[template]


def _collect(grammar, symbols, queries: set[str], names: set[str], seen_rules: set[str]) -> bool:
    for symbol in symbols:
        if isinstance(symbol, textgen.TerminalSymbol):
            continue
        if isinstance(symbol, textgen.EvalSymbol):
            code_names = set(compiled(symbol.expression).co_names)  # attribute names too: a superset, which is safe
            if code_names & _FRAME_NAMES:
                return False
            names |= code_names
        elif isinstance(symbol, textgen.ConditionalSymbol):
            if symbol.given:
                queries.add(symbol.given)
            if not _collect(grammar, [symbol.expression], queries, names, seen_rules):
                return False
        elif isinstance(symbol, textgen.ListSymbol):  # joined with the list_* rules (textgen.display_list)
            joins = [textgen.NonterminalSymbol(n) for n in ("list_empty", "list_separator", "list_last_separator")]
            if not _collect(grammar, [symbol.symbol, *joins], queries, names, seen_rules):
                return False
        elif isinstance(symbol, textgen.NonterminalSymbol):
            name = str(symbol)
            if name in seen_rules:
                continue
            seen_rules.add(name)
            for rule in grammar._rules.get(name, []):
                if rule.condition:
                    queries.add(rule.condition)
                if not _collect(grammar, rule.rhs, queries, names, seen_rules):
                    return False
        else:
            return False
    return True


def query_signatures(state: Any, expression: str) -> tuple:
    """The signatures whose facts ``state.all_assignments`` can read for the query ``expression``: each precondition's
    predicate under every combination of sub-types (as ``State._all_applicable_assignments`` enumerates them)."""
    signatures = []
    logic_types = state._logic.types
    for predicate in conjunctive_query(expression).preconditions:
        types = [logic_types.get(t) for t in predicate.signature.types]
        for subtypes in logic_types.multi_subtypes(types):
            signatures.append(Signature(predicate.signature.name, [t.name for t in subtypes]))
    return tuple(signatures)


class ProblemTables:
    """What :class:`CachedSteps` keeps for one loaded problem (one Fast Downward translation): Fast Downward numbers
    the grounded operators of a problem once, so everything textworld rebuilds from an operator on every step is a
    function of its id (its name and arguments, hence the textworld ``Action`` and, for a template whose queries read
    nothing that changed, the command text), and the facts Fast Downward reports are functions of its atom strings."""

    FEEDBACK_ENTRIES = 4096  # bound on the memoised feedback texts (keys include changing facts); cleared when full

    def __init__(self, sas: str) -> None:
        self.sas = sas
        self.operators: dict[int, tuple[str, Any, int]] = {}  # id -> (name, Action, number of effect atoms)
        self.commands: dict[tuple, tuple[str, str]] = {}  # (id, facts read) -> (derived template, command)
        self.effects: dict[bytes, tuple] = {}  # Fast Downward atom string -> (its Proposition, that one's negation)
        self.command_templates: list[str] | None = None  # state["command_templates"]: fixed per game
        self.feedback: dict[tuple, str] = {}  # (feedback rule, id, facts read) -> text
        self.plans: dict[tuple[str, str], tuple | None] = {}  # (template, action name) -> CachedSteps._key_plan


class CachedFacts:
    """Mixed into a loaded ``PddlState``'s class: per-signature frozen and sorted copies of its facts, taken when first
    needed and dropped when a fact of that signature is added or removed. ``_all_applicable_assignments`` is
    textworld's (``textworld/logic/__init__.py``) with the sorted copy reused instead of sorting the facts of every
    signature on every query, and memo keys use the frozen copies instead of copying every fact set they name."""

    _mmrl_frozen: dict
    _mmrl_sorted: dict
    _mmrl_signatures: dict

    def add_fact(self, prop):
        self._mmrl_frozen.pop(prop.signature, None)
        self._mmrl_sorted.pop(prop.signature, None)
        super().add_fact(prop)

    def remove_fact(self, prop):
        self._mmrl_frozen.pop(prop.signature, None)
        self._mmrl_sorted.pop(prop.signature, None)
        super().remove_fact(prop)

    def frozen_facts(self, signature) -> frozenset:
        frozen = self._mmrl_frozen.get(signature)
        if frozen is None:
            frozen = self._mmrl_frozen[signature] = frozenset(self.facts_with_signature(signature))
        return frozen

    def sorted_facts(self, signature) -> tuple:
        ordered = self._mmrl_sorted.get(signature)
        if ordered is None:
            ordered = self._mmrl_sorted[signature] = tuple(sorted(self.facts_with_signature(signature)))
        return ordered

    def _signatures_of(self, predicate_signature) -> tuple:
        """The signatures of a predicate under every combination of its types' sub-types (fixed per game)."""
        signatures = self._mmrl_signatures.get(predicate_signature)
        if signatures is None:
            types = [self._logic.types.get(t) for t in predicate_signature.types]
            signatures = self._mmrl_signatures[predicate_signature] = tuple(
                Signature(predicate_signature.name, [t.name for t in subtypes])
                for subtypes in self._logic.types.multi_subtypes(types))
        return signatures

    def _all_applicable_assignments(self, rule, mapping, used_vars, new_phs_by_depth, depth):
        new_phs = new_phs_by_depth[depth]
        if depth >= len(rule.preconditions):
            # as textworld: no applicability constraints on the free variables, solve them unconstrained
            yield from self._all_assignments(new_phs, mapping, used_vars, False)
            return
        pred = rule.preconditions[depth]
        for signature in self._signatures_of(pred.signature):
            for prop in self.sorted_facts(signature):
                for ph, var in zip(pred.parameters, prop.arguments, strict=False):  # as textworld
                    existing = mapping.get(ph)
                    if existing is None:
                        if var in used_vars:
                            break
                        mapping[ph] = var
                        used_vars.add(var)
                    elif existing != var:
                        break
                else:
                    yield from self._all_applicable_assignments(rule, mapping, used_vars, new_phs_by_depth, depth + 1)
                for ph in new_phs:  # reset the mapping to what it was before the recursive call
                    var = mapping.pop(ph, None)
                    used_vars.discard(var)


@functools.cache
def _with_cached_facts(state_class: type) -> type:
    return type(f"CachedFacts{state_class.__name__}", (CachedFacts, state_class), {})


def cached_facts(state: Any) -> CachedFacts:
    """``state`` (a loaded ``PddlState``) with :class:`CachedFacts` mixed in (once)."""
    if not isinstance(state, CachedFacts):
        state._mmrl_frozen, state._mmrl_sorted, state._mmrl_signatures = {}, {}, {}
        state.__class__ = _with_cached_facts(type(state))
    return state


def translated_state(downward_lib: Any, pddl_problem: str, logic: Any, translated: Any) -> Any:
    """textworld's ``PddlState(downward_lib, pddl_problem, logic)`` (``textworld/envs/pddl/logic/__init__.py``), with
    Fast Downward's two translations of the problem (``pddl2sas``, plain and optimised: ~80 ms, most of a reset)
    taken from ``translated``, an earlier state of the same problem. The translator's output is a function of the
    domain and problem texts (it sorts what it emits; the same problem translates to the same SAS text every time),
    and the state only reads the translated task."""
    import fast_downward
    from textworld.envs.pddl.logic import Atom, PddlState
    from textworld.logic import Proposition, Type, Variable

    state = PddlState.__new__(PddlState)
    state._facts = collections.defaultdict(set)
    state._vars_by_name = {}
    state._vars_by_type = collections.defaultdict(set)
    state._var_counts = collections.Counter()
    state._logic = logic
    state.downward_lib = downward_lib
    state.pddl_problem = pddl_problem
    state.task, state.sas, state.sas_replan = translated.task, translated.sas, translated.sas_replan
    state._actions = {a.name: a for a in state.task.actions}
    for type_ in state.task.types:
        try:
            logic.types.add(Type(type_.name, type_.supertype_names))
        except ValueError:  # as textworld: already known
            pass
    downward_lib.load_sas(state.sas.encode("utf-8"))
    downward_lib.load_sas_replan(state.sas_replan.encode("utf-8"))
    state.name2type = {o.name: o.type_name for o in state.task.objects}

    def proposition(atom):  # textworld's _atom2proposition
        if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
            if atom.predicate == "=":
                return None
            return Proposition(atom.predicate, [Variable(arg, state.name2type[arg]) for arg in atom.args])
        if isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
            if atom.fluent.symbol == "total-cost":
                return None
            name = f"{atom.expression.value}"
            if str.isdigit(name):  # distance relations are discarded
                return None
            return Proposition(name, [Variable(arg, state.name2type[arg]) for arg in atom.fluent.args])
        return None

    state.add_facts(list(filter(None, map(proposition, state.task.init))))
    atoms = (Atom * downward_lib.get_state_size())()
    downward_lib.get_state(atoms)
    facts = [atom.get_fact(state.name2type) for atom in atoms]
    state.add_facts([fact for fact in facts if not fact.is_negation])
    return state


class CachedSteps:
    """Mixed into a loaded ``PddlEnv``'s class: ``step`` and ``_gather_infos`` as textworld's
    (``textworld/envs/pddl/pddl.py`` and ``PddlState.all_applicable_actions``/``apply``), with per-problem tables
    (:class:`ProblemTables`) instead of rebuilding operators, effects and texts on every step, and each derived text
    (admissible commands, the step's feedback) memoised under the facts its templates can read (module docstring)."""

    def _tables(self) -> ProblemTables:
        """This problem's tables (and its state with :class:`CachedFacts`: a reset builds a new state)."""
        cached_facts(self._pddl_state)
        tables = self.__dict__.get("_mmrl_tables")
        sas = self._pddl_state.sas
        if tables is None or tables.sas is not sas:
            if tables is None or tables.sas != sas:  # a new problem (a reset translates the same one again)
                tables = self.__dict__["_mmrl_tables"] = ProblemTables(sas)
            tables.sas = sas
        return tables

    def _applicable_actions(self, tables: ProblemTables) -> list:
        """``PddlState.all_applicable_actions``: one textworld Action per applicable operator name, in Fast Downward's
        order; the Action of an operator id is built once per problem (and reused: nothing mutates it after
        ``_gather_infos`` has set its derived command template)."""
        import fast_downward
        from textworld.logic import Action, Placeholder, Variable

        state = self._pddl_state
        library = state.downward_lib
        operators = (fast_downward.Operator * library.get_applicable_operators_count())()
        library.get_applicable_operators(operators)
        actions = []
        seen = set()
        known = tables.operators
        for operator in operators:
            entry = known.get(operator.id)
            if entry is None:
                name_and_arguments = operator.name
                name, *arguments = name_and_arguments.split()
                action = Action(name=name, preconditions=[], postconditions=[])
                action.id = operator.id
                action.mapping = {Placeholder(p.name.strip("?"), p.type_name): Variable(arg, p.type_name)
                                  for p, arg in zip(state._actions[name].parameters, arguments, strict=False)}
                action.command_template = self._logic.actions[name].template
                action.feedback_rule = self._logic.actions[name].feedback_rule
                entry = known[operator.id] = (name_and_arguments, action, operator.nb_effect_atoms)
            if entry[0] in seen:
                continue
            seen.add(entry[0])
            actions.append(entry[1])
        return actions

    def _apply(self, action, tables: ProblemTables) -> None:
        """``PddlState.apply``: Fast Downward applies the operator and reports its effect atoms, which update the
        facts; each atom string is parsed once per problem."""
        from textworld.envs.pddl.logic import Atom

        state = self._pddl_state
        effects = (Atom * tables.operators[action.id][2])()
        state.downward_lib.apply_operator(action.id, effects)
        parsed = tables.effects
        for effect in effects:
            raw = effect._name
            entry = parsed.get(raw)
            if entry is None:
                prop = effect.get_fact(state.name2type)
                entry = parsed[raw] = (prop, prop.negate())
            state.remove_fact(entry[1])
            state.add_fact(entry[0])

    def _key_plan(self, template: str, action) -> tuple | None:
        """How to key ``template`` derived for an operator of ``action``'s kind (its placeholders are those of every
        operator of that kind), from the template's :class:`Dependencies`: the arguments its queries or expressions
        can read, the types an argument must have to be excluded from a query's new placeholders
        (``all_assignments`` never binds a new placeholder to a variable already in the mapping), and per query the
        signatures whose facts it can read. None: not memoisable."""
        deps = template_dependencies(self._logic.grammar, template)
        if deps is _UNCACHEABLE:
            return None
        logic_types = self._pddl_state._logic.types
        read_placeholders: set = set()
        excludable_types: set[str] = set()
        signatures = []
        for query in sorted(deps.queries):
            signatures.append(query_signatures(self._pddl_state, query))
            for predicate in conjunctive_query(query).preconditions:
                for placeholder in predicate.parameters:
                    if placeholder in action.mapping:
                        read_placeholders.add(placeholder)
                    else:
                        excludable_types.update(t.name for t in logic_types.get(placeholder.type).subtypes)
        read = tuple(ph for ph in action.mapping if ph in read_placeholders or ph.name in deps.names)
        excludable = tuple(ph for ph in action.mapping if ph.type in excludable_types)
        return read, excludable, tuple(signatures)

    def _memo_key(self, template: str, action, tables: ProblemTables, prefix: tuple):
        """The key ``template`` derived for ``action`` is memoised under in this state (None: derive it every time):
        the arguments it can read or exclude, and the facts of every signature its queries can read. Operators that
        differ in nothing their text can read share it ("go to drawer 1" from any start location)."""
        plan = tables.plans.get((template, action.name), _NONE)
        if plan is _NONE:
            plan = tables.plans[(template, action.name)] = self._key_plan(template, action)
        if plan is None:
            return None
        read, excludable, signatures = plan
        mapping, state = action.mapping, self._pddl_state
        facts = tuple(tuple(state.frozen_facts(signature) for signature in query) for query in signatures)
        return (*prefix, template, tuple(mapping[ph] for ph in read), tuple(mapping[ph] for ph in excludable), facts)

    def _context(self, action, facts: list) -> dict[str, Any]:
        return {"state": self._pddl_state, "facts": facts,
                "variables": {ph.name: self._entity_infos[var.name] for ph, var in action.mapping.items()},
                "mapping": action.mapping, "entity_infos": self._entity_infos}

    def reset(self):
        """textworld's ``PddlEnv.reset``, with the problem's translation reused (:func:`translated_state`)."""
        from textworld.core import GameState

        self._pddl_state = translated_state(self.downward_lib, self._game_data["pddl_problem"], self._logic,
                                            self._pddl_state)
        self.prev_state = None
        self.state = GameState()
        self._last_action = None
        self._moves = 0
        context = {"state": self._pddl_state, "facts": list(self._pddl_state.facts), "variables": {}, "mapping": {},
                   "entity_infos": self._entity_infos}
        self.state.feedback = self._logic.grammar.derive("#intro#", context)
        self.state.raw = self.state.feedback
        self._gather_infos()
        if "walkthrough" in self.request_infos.extras:
            self.state["extra.walkthrough"] = self.walkthrough or self._pddl_state.replan(self._entity_infos)
        return self.state

    def step(self, command: str):
        from textworld.core import GameState

        command = command.strip()
        self.prev_state = self.state
        self.state = GameState()
        self.state.last_command = command
        self._last_action = None
        tables = self._tables()
        facts = None
        try:
            # as textworld: the command must be one of the last state's commands, else nothing happens
            idx = self.prev_state["_valid_commands"].index(command)
            self._last_action = self.prev_state["_valid_actions"][idx]
            self._apply(self._last_action, tables)
            rule = self._last_action.feedback_rule
            key = self._memo_key(rule, self._last_action, tables, (rule,))
            feedback = tables.feedback.get(key) if key is not None else None
            if feedback is None:
                facts = list(self._pddl_state.facts)
                feedback = self._logic.grammar.derive(rule, self._context(self._last_action, facts))
                if key is not None:
                    if len(tables.feedback) >= tables.FEEDBACK_ENTRIES:
                        tables.feedback.clear()
                    tables.feedback[key] = feedback
            self.state.feedback = feedback
            self._moves += 1
        except ValueError:
            self.state.feedback = "Nothing happens."
        self.state.raw = self.state.feedback
        self._gather_infos(facts)
        if "walkthrough" in self.request_infos.extras:
            self.state["extra.walkthrough"] = self.prev_state["extra.walkthrough"]
        self.state["score"] = 1 if self.state["won"] else 0
        self.state["done"] = self.state["won"] or self.state["lost"]
        return self.state, self.state["score"], self.state["done"]

    def _gather_infos(self, facts: list | None = None):
        """``facts``: the state's fact list if the caller has just taken it (the state has not changed since)."""
        tables = self._tables()
        if tables.command_templates is None:
            tables.command_templates = sorted(set(action.template for action in self._logic.actions.values()))
        self.state["command_templates"] = list(tables.command_templates)
        self.state["won"] = self._pddl_state.check_goal()
        self.state["lost"] = False  # as textworld: the planner is not asked whether the game is lost
        self.state["_entity_infos"] = dict(self._entity_infos)
        facts = list(self._pddl_state.facts) if facts is None else facts
        self.state["_facts"] = facts
        if self.request_infos.facts:
            self.state["facts"] = list(map(self._get_human_readable_fact, facts))
        self.state["last_action"] = None
        self.state["_last_action"] = self._last_action
        self.state["_valid_actions"] = self._applicable_actions(tables)

        grammar = self._logic.grammar
        memo = tables.commands
        mapping = None
        commands = self.state["_valid_commands"] = []
        for action in self.state["_valid_actions"]:
            template = self._logic.actions[action.name].template  # the action's own (underived) template
            key = self._memo_key(template, action, tables, ())
            if key is not None and key in memo:
                action.command_template, command = memo[key]
                commands.append(command)
                continue
            if mapping is None:
                mapping = {k: info.name for k, info in self._entity_infos.items()}
            action.command_template = grammar.derive(template, self._context(action, facts))
            command = action.format_command(mapping)
            if key is not None:
                memo[key] = (action.command_template, command)
            commands.append(command)

        # as textworld: sorted, duplicates removed
        self.state["admissible_commands"] = sorted(set(commands))
        if self.request_infos.moves:
            self.state["moves"] = self._moves
        if self.request_infos.policy_commands:
            self.state["policy_commands"] = self._pddl_state.replan(self._entity_infos)


@functools.cache
def _with_cached_steps(env_class: type) -> type:
    return type(f"CachedSteps{env_class.__name__}", (CachedSteps, env_class), {})


def install(pddl_env: Any) -> None:
    """Make one loaded ``textworld.envs.PddlEnv`` use the memoised parses and commands (call after every ``load``)."""
    grammar = pddl_env._logic.grammar
    if type(grammar) is not textgen.ContextSensitiveGrammar:
        if isinstance(grammar, CachedGrammar):
            return
        raise TypeError(f"unexpected grammar class {type(grammar).__name__}; textworld changed, run without the cache")
    grammar.__class__ = CachedGrammar
    for rules in grammar._rules.values():
        for rule in rules:
            for symbol in rule.rhs:
                _with_cached_classes(symbol)
    if not isinstance(pddl_env, CachedSteps):
        pddl_env.__class__ = _with_cached_steps(type(pddl_env))
