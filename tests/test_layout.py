"""The folders are the architecture: who may import whom, and no import cycles.

Read from the source with :mod:`ast` (module-level imports only; an import
inside a function runs later and cannot make a cycle at import time).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dsched", "agent", "controller", "predict", "spark_stream", "testbed", "bench")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = _module_name(path)
            deps: set[str] = set()
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.Import):
                    deps.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    deps.add(node.module)
                    deps.update(f"{node.module}.{a.name}" for a in node.names)
            graph[name] = deps
    known = set(graph)
    return {m: {d for d in deps if d in known and d != m} for m, deps in graph.items()}


GRAPH = _imports()


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(GRAPH[m]):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles():
    assert _cycle() is None, " -> ".join(_cycle() or [])


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("spark_stream", ("controller", "agent", "testbed", "bench")),
        ("agent", ("controller", "spark_stream", "predict", "testbed", "bench")),
        ("predict", ("controller", "agent", "spark_stream", "testbed", "bench")),
        ("controller", ("agent", "testbed", "bench")),
        ("dsched", ("agent", "controller", "spark_stream", "predict", "testbed", "bench")),
    ],
)
def test_who_may_import_whom(package, forbidden):
    bad = sorted(
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        if m.split(".")[0] == package
        for d in deps
        if d.split(".")[0] in forbidden
    )
    assert not bad, bad


def test_the_controllers_pure_stages_do_no_io():
    """controller/stages/ and controller/epoch.py import no edge, store or transport."""
    io = ("controller.edges", "grpc", "sqlite3", "dsched_pb", "spark_stream", "urllib", "socket")
    pure = [m for m in GRAPH if m.startswith("controller.stages") or m == "controller.epoch"]
    assert pure
    for m in pure:
        path = ROOT / (m.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / m.replace(".", "/") / "__init__.py"
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {n for n in names if n.startswith(io)}, (m, names)
