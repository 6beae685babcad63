"""The package layering of docs/architecture.md, checked on the source: no import circle among mmrl's packages
(imports inside functions count), the leaf module is a leaf, and no backend or config code asks an objective's name."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "mmrl"
# Top-level modules that every layer may import (docs/architecture.md): they import nothing from mmrl but the error
# types, which import nothing at all, so that a leaf can raise a UserError.
LEAF_MODULES = ("cache", "chat_template", "errors", "files", "hub", "paths", "values")


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every mmrl module ``path`` imports, at any depth of the file (function bodies included)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from mmrl import x` imports mmrl.x
    return {m for m in found if m == "mmrl" or m.startswith("mmrl.")}


def package_of(module: str) -> str:
    """``mmrl.tasks.geoqa`` -> ``tasks``; a top-level module (``mmrl.batch``) is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mmrl"


def package_graph() -> dict[str, dict[str, list[str]]]:
    """{package: {imported package: [importing module -> imported module, ...]}} between different packages."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(SOURCE.rglob("*.py")):
        source = module_name(path)
        for target in imported_modules(path):
            a, b = package_of(source), package_of(target)
            if a != b and b != "mmrl":
                graph[a][b].append(f"{source} -> {target}")
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the DFS stack, 2 done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [node, nxt] if nxt in stack else [node, nxt]
            if nxt not in state:
                found = visit(nxt, stack + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [])
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}}) is not None
    assert find_cycle({"a": {"b": ["x"]}, "b": {"c": ["y"]}}) is None


def module_graph() -> dict[str, dict[str, list[str]]]:
    """{module: {imported module: [edge]}} between mmrl's files. ``from pkg import name`` is an edge to the file
    ``pkg/name.py`` when there is one (the submodule is what the import needs), else to ``pkg``."""
    paths = {module_name(p): p for p in sorted(SOURCE.rglob("*.py"))}
    graph: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                 + ([node.module] if node.module else [])) if node.level else node.module or "")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for target in targets:
                if target in paths and target != name:
                    graph[name][target] = [f"{name} -> {target}"]
    return graph


def test_the_module_graph_reads_a_submodule_import_as_an_edge_to_that_file():
    graph = module_graph()
    assert "mmrl.envs.alfworld.prompts" in graph["mmrl.envs.alfworld.env"]  # `from mmrl.envs.alfworld import prompts`
    assert "mmrl.envs.alfworld" not in graph["mmrl.envs.alfworld.env"]


def test_no_import_circle_between_mmrl_files():
    """No two modules import each other, directly or through others (imports inside functions count): a circle
    hidden in a function body still means neither file can be read, tested or moved without the other."""
    graph = module_graph()
    cycle = find_cycle(graph)
    if cycle:
        pytest.fail("import circle: " + " -> ".join(cycle))


def test_no_import_circle_between_mmrl_packages():
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle:
        edges = [f"{a} -> {b}: {graph[a][b][0]}" for a, b in zip(cycle, cycle[1:], strict=False)]
        pytest.fail("import circle: " + "; ".join(edges))


def test_the_leaf_and_lower_layers_import_nothing_above_them():
    graph = package_graph()
    assert "errors" not in graph, f"mmrl/errors.py must import nothing from mmrl: {dict(graph['errors'])}"
    for leaf in LEAF_MODULES:
        above = set(graph.get(leaf, {})) - {"errors"}
        assert not above, f"mmrl/{leaf}.py must import nothing from mmrl but mmrl.errors: {above}"
    for low in ("algos", "vision", "envs", "rewards"):  # the lower layers of docs/architecture.md
        above = set(graph.get(low, {})) - set(LEAF_MODULES) - {"vision"}
        assert not above, f"{low} imports {above}: {[graph[low][p] for p in above]}"
    assert "models" not in graph.get("tasks", {}), f"tasks import models: {graph['tasks']['models']}"


def test_neither_backend_imports_the_other():
    graph = package_graph()
    assert "trainer" not in graph.get("openrlhf", {}), f"openrlhf imports the local backend: {graph['openrlhf']}"
    assert "openrlhf" not in graph.get("trainer", {}), f"the local backend imports openrlhf: {graph['trainer']}"


def test_the_shared_run_package_imports_no_backend():
    """mmrl/run holds what both backends share, so it sits below both of them."""
    graph = package_graph()
    above = {"trainer", "openrlhf"} & set(graph.get("run", {}))
    assert not above, f"mmrl/run imports a backend: {[graph['run'][p] for p in above]}"


def test_no_code_asks_an_objective_its_name_or_reads_its_fields_by_getattr():
    pattern = re.compile(r'getattr\([^)]*algo|== "gvpo"|algo_name ==')
    hits = [f"{path.relative_to(SOURCE.parent)}:{i}" for path in sorted(SOURCE.rglob("*.py"))
            for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_importing_mmrl_rewards_registers_every_reward_module():
    """Each module of mmrl/rewards that registers a reward is imported by the package (not as a side effect of a
    task): after ``import mmrl.rewards`` alone, every one of them is loaded."""
    import subprocess
    import sys

    registering = sorted(p.stem for p in (SOURCE / "rewards").glob("*.py")
                         if re.search(r"^@reward\b|register_reward\(", p.read_text(), re.MULTILINE)
                         and p.stem != "base")
    code = ("import sys, mmrl.rewards; missing = [m for m in sys.argv[1:] if 'mmrl.rewards.' + m not in sys.modules]; "
            "assert not missing and 'mmrl.tasks' not in sys.modules, missing; "
            "assert {'geoqa_accuracy', 'think_boxed_format'} <= set(mmrl.rewards.REWARDS)")
    proc = subprocess.run([sys.executable, "-c", code, *registering], capture_output=True, text=True, timeout=120,
                          cwd=SOURCE.parent)
    assert "geometry" in registering and proc.returncode == 0, proc.stderr
