"""The import graph of twin/, executor/ and topologies/: no cycles, executor reached from twin only through the
command list, topologies importing nothing from twin, and no file of twin/cli/ over 400 lines.

The graph is read with `ast` from every .py file: every `import` and `from ... import` statement, at module level,
inside functions and under `if TYPE_CHECKING:` alike, relative ones resolved. An edge goes to the module an import
names: `from pkg import name` to `pkg.name` where that is a module, else to `pkg`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("twin", "executor", "topologies")
COMMAND_LIST = "twin.cli.commands"
MAX_CLI_LINES = 400

def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the packages: dotted name -> (file, whether it is a package's __init__)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _known(name: str, modules: dict) -> str | None:
    """The module `name` is, or the innermost package of ours it lies in; None outside our packages."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of twin, executor and topologies it imports anywhere in its file."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name.split(".") if is_package else name.split(".")[:-1]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_known(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # from . import x, from ..y import z
                    base = package[:len(package) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    targets.add(full if full in modules else _known(source, modules))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle through them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_cycle_through(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle inside a strongly connected component, start module repeated at the end: a -> b -> a."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to start
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def _render(cycle: list[str]) -> str:
    return " -> ".join(cycle)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_sees_function_level_and_relative_imports(graph):
    assert "executor.cli" in graph[COMMAND_LIST]  # module level
    assert "twin.cli.commands" in graph["twin.cli"]  # inside a function
    assert "twin.cli.args" in graph["executor.cli"]
    assert {"twin.cli.args", "twin.cli.runs"} <= graph["twin.cli.fit"]  # from twin.cli import x resolves to x
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycle(graph):
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(_render(c) for c in found)


def test_only_the_command_list_imports_executor(graph):
    importers = sorted(m for m, targets in graph.items()
                       if m.split(".")[0] == "twin" and any(t.split(".")[0] == "executor" for t in targets))
    assert importers == [COMMAND_LIST]


def test_executor_takes_cli_helpers_from_args_only(graph):
    cli = {t for m, targets in graph.items() if m.split(".")[0] == "executor" for t in targets
           if t == "twin.cli" or t.startswith("twin.cli.")}
    assert cli <= {"twin.cli.args"}


def test_helpers_import_no_command_module(graph):
    for helper in ("twin.cli.args", "twin.cli.runs"):
        assert not {t for t in graph[helper] if t.startswith("twin.cli")} - {"twin.cli.args"}, helper


def test_topologies_imports_nothing_from_twin(graph):
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if m.split(".")[0] == "topologies"
                    for t in targets if t.split(".")[0] == "twin")
    assert not upward, f"topologies must not import twin: {', '.join(upward)}"


def test_no_cli_file_over_400_lines():
    long = {p.name: n for p in sorted((REPO / "twin" / "cli").glob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_CLI_LINES}
    assert not long, f"over {MAX_CLI_LINES} lines: {long}"
