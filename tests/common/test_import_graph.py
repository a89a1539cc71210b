"""Imports flow one way (STYLE.md, habit 8): no module cycles, and the server imports nothing
of the parts it runs for others (alerts). Read from the source with ``ast``: every import,
at module level or inside a function (an import inside a function that closes a cycle is
still a cycle, only hidden until the function runs)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = (
    "inferpath",
    "instrumentation",
    "collectors",
    "server",
    "storage",
    "analysis",
    "dashboard",
    "alerts",
    "demo",
)


def _modules() -> dict[str, Path]:
    found = {}
    for component in COMPONENTS:
        for path in (ROOT / component).rglob("*.py"):
            if "__pycache__" in path.parts or path.is_symlink():
                continue
            relative = path.relative_to(ROOT).with_suffix("")
            parts = list(relative.parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts[0] != "inferpath":
                parts.insert(0, "inferpath")
            found[".".join(parts)] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the inferpath modules it imports (``TYPE_CHECKING`` blocks left out)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def visit(node: ast.AST, module: str = module, package: str = package) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        anchor = package
                        for _ in range(child.level - 1):
                            anchor = anchor.rpartition(".")[0]
                        base = f"{anchor}.{base}" if base else anchor
                    names = [base, *(f"{base}.{alias.name}" for alias in child.names)]
                for name in names:
                    target = resolve(name) if name.startswith("inferpath") else None
                    if target and target != module:
                        graph[module].add(target)
                visit(child)

        visit(ast.parse(path.read_text(encoding="utf-8")))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in list(graph):
        if node not in index:
            connect(node)
    return found


def test_imports_have_no_cycle() -> None:
    modules = _modules()
    assert len(modules) > 100 and "inferpath.vocabulary" in modules
    cycles = _cycles(_imports(modules))
    assert not cycles, sorted(sorted(c) for c in cycles)


def test_the_server_does_not_import_alerts() -> None:
    graph = _imports(_modules())
    into_alerts = sorted(
        (m, t)
        for m, targets in graph.items()
        if m.startswith("inferpath.server")
        for t in targets
        if t.startswith("inferpath.alerts")
    )
    assert into_alerts == []
    # The alert evaluator reaches the server through the composition above both.
    assert "inferpath.alerts.service" in graph["inferpath.serve"]
    assert "inferpath.server.services" in graph["inferpath.server.runtime"]


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert graph == [frozenset({"a", "b", "c"})]
    # A function-level import is an edge: inferpath.cli imports the demo only when run.
    assert "inferpath.demo.run" in _imports(_modules())["inferpath.cli"]
