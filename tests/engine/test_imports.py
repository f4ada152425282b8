"""relay/engine imports flow one way: no module reaches itself through its imports."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import relay.engine

PACKAGE = "relay.engine"
ROOT = Path(relay.engine.__file__).parent


def _imports(module: str, source: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` imports, anywhere in the file (under
    ``TYPE_CHECKING`` and inside functions too: mypy and a reader follow those)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module != PACKAGE:
                found.add(node.module)
                continue
            # ``from relay.engine import trace`` names a submodule; any other name
            # comes from the package's __init__.
            for alias in node.names:
                sub = f"{PACKAGE}.{alias.name}"
                found.add(sub if sub in modules else PACKAGE)
    return {m for m in found if m in modules and m != module}


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """Each module of ``sources`` (dotted name to text) and the ones it imports."""
    modules = set(sources)
    return {m: _imports(m, text, modules) for m, text in sources.items()}


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that ends where it starts, or ``None``."""
    done: set[str] = set()
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        if m in path:
            return [*path[path.index(m) :], m]
        if m in done:
            return None
        path.append(m)
        for n in sorted(graph[m]):
            cycle = visit(n)
            if cycle is not None:
                return cycle
        path.pop()
        done.add(m)
        return None

    for m in sorted(graph):
        cycle = visit(m)
        if cycle is not None:
            return cycle
    return None


def engine_sources() -> dict[str, str]:
    """relay/engine's modules, by dotted name."""
    sources = {}
    for path in sorted(ROOT.glob("*.py")):
        name = PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def test_engine_has_no_import_cycle() -> None:
    """No module of relay/engine imports itself through others."""
    graph = import_graph(engine_sources())
    assert graph.get(f"{PACKAGE}.runner"), "nothing parsed"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_planted_cycle_is_found() -> None:
    """The check sees a cycle closed only under TYPE_CHECKING, and one through the
    package's __init__."""
    typed = {
        "relay.engine.a": "from relay.engine.b import B\n",
        "relay.engine.b": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from relay.engine.a import A\n"
        ),
    }
    assert find_cycle(import_graph(typed)) == [
        "relay.engine.a",
        "relay.engine.b",
        "relay.engine.a",
    ]
    through_init = {
        "relay.engine": "from relay.engine.a import A\n",
        "relay.engine.a": "def f():\n    from relay.engine import Config\n",
        "relay.engine.trace": "",
    }
    assert find_cycle(import_graph(through_init)) is not None
    submodule = {
        "relay.engine": "from relay.engine.a import A\n",
        "relay.engine.a": "from relay.engine import trace\n",
        "relay.engine.trace": "",
    }
    assert find_cycle(import_graph(submodule)) is None
