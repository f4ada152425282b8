"""docs/generated.md walks through ``relay/maps/eagle.py``: its header, its table and
every method it quotes must be the generated code as it is, so a generator change that
does not refresh the page fails here (method doc strings are elided there as
``\"\"\"...\"\"\"``)."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

from relay.maps import eagle

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "generated.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
_DEF = re.compile(r"^    def (\w+)\(")


def elided(cls: type, name: str) -> str:
    """The source of method ``name`` of ``cls`` as the page quotes it: indented as in
    the module, its doc string (if any) replaced by ``\"\"\"...\"\"\"``."""
    lines = inspect.getsource(getattr(cls, name)).splitlines()
    func = ast.parse(textwrap.dedent("\n".join(lines))).body[0]
    assert isinstance(func, ast.FunctionDef)
    first = func.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        start, end = first.lineno - 1, (first.end_lineno or first.lineno)
        lines[start:end] = ['        """..."""']
    return "\n".join(lines) + "\n"


def _blocks() -> list[str]:
    return _BLOCK.findall(PAGE.read_text(encoding="utf-8"))


def test_every_quoted_method_is_the_generated_one() -> None:
    """Each quoted ``def`` is the map class's method, as the module spells it."""
    quoted = [b for b in _blocks() if _DEF.match(b)]
    assert len(quoted) >= 5
    cls = eagle.EagleFutureMap
    for block in quoted:
        match = _DEF.match(block)
        assert match is not None
        name = match.group(1)
        assert name in vars(cls), f"docs/generated.md quotes {name}, which is gone"
        assert block == elided(cls, name), f"docs/generated.md quotes an old {name}"


def test_every_other_excerpt_is_in_the_module() -> None:
    """Each quoted block that is not a method (the header, the table) is verbatim
    text of the generated module."""
    module = Path(inspect.getfile(eagle)).read_text(encoding="utf-8")
    others = [b for b in _blocks() if not _DEF.match(b)]
    assert any("_TABLE = _rt.Table(" in b for b in others)
    for block in others:
        assert block in module, (
            f"docs/generated.md quotes text eagle.py lacks:\n{block}"
        )


def test_the_quoted_header_is_the_generated_one() -> None:
    """The header block (hashes included) opens the generated module."""
    header = next(b for b in _blocks() if b.startswith("# @generated"))
    module = Path(inspect.getfile(eagle)).read_text(encoding="utf-8")
    assert module.startswith(header)
