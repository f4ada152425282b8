"""Every hand-written function of relay fits in 80 lines, so each reads in one screen
(the generated maps in relay/maps/ are laid out by the generator, not by hand)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "relay"
LIMIT = 80


def test_no_function_is_over_80_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "maps":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    where = path.relative_to(PACKAGE.parent)
                    long.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
