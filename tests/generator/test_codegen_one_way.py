"""The generator flows one way: from the schema through naming to the emitted text, a
render enters each of relay's generator modules in stage order and seldom goes back to
one it has left."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from codegen_support import REPO

from relay.codegen.loader import load_schema
from relay.codegen.render import render
from relay.schema import bundled_names

#: At most this many returns to a generator module already left, per render.
RETURNS_MAX = 20


def modules_entered(stem: str) -> list[str]:
    """The generator modules a render of bundled schema ``stem`` enters, in order,
    followed call by call: each function on its first call (a function called again
    enters no new stage), consecutive calls in one module counted once. The
    ``__init__`` attrs generates for a module's classes is attrs' code, not the
    module's: it is left out."""
    schema = load_schema(REPO / "relay" / "schemas" / f"{stem}.py", stem)
    entered: list[str] = []
    seen: set[Any] = set()

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("relay.codegen"):
            return
        if frame.f_code in seen or frame.f_code.co_filename.startswith("<attrs"):
            return
        seen.add(frame.f_code)
        if not entered or entered[-1] != module:
            entered.append(module)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        render(schema, source=f"relay/schemas/{stem}.py", command="relay generate")
    finally:
        sys.setprofile(previous)
    return entered


def returns(entered: list[str]) -> int:
    """How many entries go back to a module the render had already left."""
    return sum(module in entered[:i] for i, module in enumerate(entered))


@pytest.mark.parametrize("stem", bundled_names())
def test_a_render_returns_to_a_module_it_left_at_most_twenty_times(stem: str) -> None:
    """Naming spells every identifier first, the bodies are computed in one pass, and
    the views assemble them: the modules a render enters rarely repeat."""
    entered = modules_entered(stem)
    assert returns(entered) <= RETURNS_MAX, entered


def test_views_and_naming_do_not_call_back_and_forth() -> None:
    """Naming is entered once, before the views read its table; the method bodies are
    computed in one call, leaving it only for the literal helpers, before the views
    assemble the methods."""
    entered = modules_entered("sglang_eagle")
    assert entered.count("relay.codegen.naming") == 1, entered
    first = entered.index("relay.codegen.methods")
    last = len(entered) - 1 - entered[::-1].index("relay.codegen.methods")
    between = set(entered[first : last + 1])
    assert between <= {"relay.codegen.methods", "relay.codegen.literals"}, entered
    views = [i for i, m in enumerate(entered) if m == "relay.codegen.views"]
    assert entered.index("relay.codegen.naming") < views[1] and last < views[1], entered


def test_the_count_sees_a_module_entered_again() -> None:
    """The measure itself: a module left and entered again is one return."""
    assert returns(["a", "b", "a", "c", "b"]) == 2
    assert returns(["a", "b", "c"]) == 0


def test_every_bundled_schema_is_measured() -> None:
    """The parametrized test above covers each schema relay ships."""
    shipped = sorted(p.stem for p in (REPO / "relay" / "schemas").glob("*.py"))
    assert [s for s in shipped if not s.startswith("_")] == bundled_names()
    assert Path(REPO / "relay" / "codegen" / "naming.py").is_file()
