"""Two generated shapes of each map (Note [Two shapes] in relay/runtime.py): the public
class runs its work alone, debug mode is a generated subclass, and both agree with the
reference model."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from codegen_support import REPO

from relay.codegen import naming
from relay.codegen.loader import load_schema
from relay.errors import RelayError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.schema import Schema
from relay.testing import check_lockstep

BUNDLED = sorted(p.stem for p in (REPO / "relay" / "schemas").glob("*.py"))


def _bundled(stem: str) -> tuple[Schema, type[Any]]:
    schema = load_schema(REPO / "relay" / "schemas" / f"{stem}.py", f"relay/schemas/{stem}.py")
    module = importlib.import_module(f"relay.maps.{stem}")
    return schema, getattr(module, schema.name)


def _methods(cls: type[Any]) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(cls).items()
        if inspect.isfunction(value) and name != "__init__"
    }


@pytest.mark.parametrize("stem", BUNDLED)
def test_debug_off_methods_hold_no_debug_branch(stem: str) -> None:
    """No method of the public class (debug off) names debug mode's checker: each holds
    only its work; the debug subclass overrides every one of them."""
    schema, cls = _bundled(stem)
    debug_cls = getattr(
        importlib.import_module(cls.__module__), naming.debug_class(schema)
    )
    methods = _methods(cls)
    assert "stash" in methods or "publish" in methods
    for name, method in methods.items():
        assert "_debug" not in inspect.getsource(method), f"{cls.__name__}.{name}"
    assert set(_methods(debug_cls)) == set(methods)
    for method in _methods(debug_cls).values():
        assert "self._debug." in inspect.getsource(method)


@pytest.mark.parametrize("stem", BUNDLED)
def test_debug_flag_picks_the_shape(stem: str) -> None:
    """debug=False builds the public class itself; debug=True its debug subclass, still an
    instance of the public class with the same constructor and attributes."""
    schema, cls = _bundled(stem)
    dims = {d: 2 for d in naming.symbolic_dims(schema.fields)}
    plain = cls("cpu", 5, **dims)
    checked = cls("cpu", 5, **dims, debug=True)
    assert type(plain) is cls and plain._debug is None and plain.debug is False
    assert type(checked) is not cls and isinstance(checked, cls)
    assert type(checked).__name__ == naming.debug_class(schema)
    assert checked._debug is not None and checked.debug is True


class CountingDecodeMap(DecodeFutureMap):
    """An engine's own subclass of a generated map, overriding one method."""

    resolves = 0

    def resolve_future(self, batch: Any) -> None:
        CountingDecodeMap.resolves += 1
        super().resolve_future(batch)


def test_an_engines_subclass_keeps_its_overrides_in_debug_mode() -> None:
    """A subclass built with debug=True runs its own override around the debug-mode
    method: the override counts, and debug mode still reports a read of an unwritten
    slot."""
    relay = CountingDecodeMap("cpu", 5, debug=True)
    assert isinstance(relay, CountingDecodeMap)
    assert type(relay).__name__ == "CountingDecodeMap"
    assert type(CountingDecodeMap("cpu", 5, debug=True)) is type(relay)  # made once
    relay.stash(torch.tensor([1]), DecodePayload(next_token_ids=torch.tensor([7])))

    class Batch:
        req_pool_indices = torch.tensor([1])
        input_ids = torch.tensor([0])

    batch = Batch()
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [7]
    batch.req_pool_indices = torch.tensor([2])
    with pytest.raises(RelayError, match="DecodeFutureMap"):
        relay.resolve_future(batch)
    assert CountingDecodeMap.resolves == 2


@pytest.mark.parametrize("stem", BUNDLED)
def test_debug_off_shape_runs_in_lockstep_with_the_model(stem: str) -> None:
    """The debug-off shape agrees with the reference model too (the debug shape's run,
    10,000 operations a map, is in tests/runtime/test_lockstep.py)."""
    schema, cls = _bundled(stem)
    assert (
        check_lockstep(schema, cls, operations=1_000, steps=100, debug=False) >= 1_000
    )


def test_golden_modules_hold_both_shapes() -> None:
    """Every golden module defines the public class and its debug subclass."""
    for path in sorted((REPO / "tests" / "golden" / "maps").glob("*.py.txt")):
        text = path.read_text(encoding="utf-8")
        schema = load_schema(
            REPO / "tests" / "golden" / "schemas" / Path(path.stem).with_suffix(".py"),
            "golden",
        )
        debug = naming.debug_class(schema)
        assert f"\nclass {schema.name}:\n" in text
        assert f"\nclass {debug}({schema.name}):\n" in text
        assert "self.__class__ = _rt.debug_class(" in text
        assert text.count(debug) == 2  # the class and the constructor's switch
