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


def test_the_houses_that_grew_before_stay_within_their_size() -> None:
    """The bench, its doc and the validator grew past what one reader keeps in mind
    more than once; each stays within the size it was brought back to."""
    root = PACKAGE.parent
    limits = {
        "relay/bench": 1_500,
        "docs/bench.md": 200,
        "relay/codegen/validate.py": 1_000,
    }
    over = []
    for place, limit in limits.items():
        path = root / place
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        lines = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)
        if lines > limit:
            over.append(f"{place}: {lines} lines, over {limit}")
    assert over == []
