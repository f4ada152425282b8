"""One body per method (Note [One body] in relay/runtime.py): a generated map is one
class whose methods run the common case, with debug off paying one attribute test, and
debug mode the same methods' checked path; both agree with the reference model."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from codegen_support import REPO

from relay.codegen.loader import load_schema
from relay.errors import RelayError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.schema import Schema
from relay.testing import check_lockstep

BUNDLED = sorted(p.stem for p in (REPO / "relay" / "schemas").glob("*.py"))


def _bundled(stem: str) -> tuple[Schema, type[Any]]:
    schema = load_schema(
        REPO / "relay" / "schemas" / f"{stem}.py", f"relay/schemas/{stem}.py"
    )
    module = importlib.import_module(f"relay.maps.{stem}")
    return schema, getattr(module, schema.name)


def _methods(cls: type[Any]) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(cls).items()
        if inspect.isfunction(value) and name != "__init__"
    }


@pytest.mark.parametrize("stem", BUNDLED)
def test_one_class_and_one_attribute_test_for_debug_mode(stem: str) -> None:
    """No class swapping, no version counters, no second copy: each method tests debug
    mode once at most (a write inside ``_rt.write_rows``)."""
    _schema, cls = _bundled(stem)
    text = Path(inspect.getfile(cls)).read_text(encoding="utf-8")
    assert "_version" not in text and "__class__" not in text
    assert not [
        c for c in vars(importlib.import_module(cls.__module__)) if c.endswith("Debug")
    ]
    methods = _methods(cls)
    assert "stash" in methods or "publish" in methods
    for name, method in methods.items():
        source = inspect.getsource(method)
        tests = source.count("self._state.debug is")
        tests += source.count("_rt.write_rows(self._state")
        tests += source.count("debug = self._state.debug")
        assert tests <= 1, f"{cls.__name__}.{name}"


@pytest.mark.parametrize("stem", BUNDLED)
def test_a_value_given_meets_one_none_test(stem: str) -> None:
    """A write's gate tests a value that may be left out for ``None`` after its other
    tests, so a value given meets one ``is None`` test, the write's; and it spells
    those tests out (no call per value)."""
    _schema, cls = _bundled(stem)
    for name in [n for n in ("stash", "publish") if n in vars(cls)]:
        source = inspect.getsource(vars(cls)[name])
        assert "_rt.fits" not in source, f"{cls.__name__}.{name}"
        first = re.findall(r"\(\s*\w+ is None\s+or\b", source)
        assert not first, f"{cls.__name__}.{name} tests None first: {first}"


@pytest.mark.parametrize("stem", BUNDLED)
def test_debug_flag_sets_the_checker_not_the_class(stem: str) -> None:
    """debug=True builds the same class, with debug mode's checker set."""
    _schema, cls = _bundled(stem)
    dims = {d: 2 for d in ("topk", "hidden", "vocab", "draft_tokens", "layers")}
    dims["draft_token_num"] = dims["num_speculative_tokens"] = 2
    params = inspect.signature(cls).parameters
    kwargs = {k: v for k, v in dims.items() if k in params}
    plain, checked = cls("cpu", 4, **kwargs), cls("cpu", 4, **kwargs, debug=True)
    assert type(plain) is cls and type(checked) is cls
    assert plain._state.debug is None and checked._state.debug is not None


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
    assert type(relay) is CountingDecodeMap
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


class ByNameDecodeMap(DecodeFutureMap):
    """An engine's subclass that calls the base methods by name, not through super()."""

    def stash(self, indices: torch.Tensor, payload: DecodePayload) -> None:
        DecodeFutureMap.stash(self, indices, payload)

    def resolve_future(self, batch: Any) -> None:
        DecodeFutureMap.resolve_future(self, batch)


def test_a_subclass_calling_the_base_by_name_gets_debug_mode() -> None:
    """Calling ``DecodeFutureMap.stash(self, ...)`` runs debug mode's bookkeeping as
    ``super()`` does: the stashed row reads once, and a second read is reported."""
    relay = ByNameDecodeMap("cpu", 5, debug=True)
    relay.stash(torch.tensor([1]), DecodePayload(next_token_ids=torch.tensor([7])))

    class Batch:
        req_pool_indices = torch.tensor([1])
        input_ids = torch.tensor([0])

    batch = Batch()
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [7]
    with pytest.raises(RelayError, match="not written since it was last consumed"):
        relay.resolve_future(batch)


@pytest.mark.parametrize("stem", BUNDLED)
def test_debug_off_shape_runs_in_lockstep_with_the_model(stem: str) -> None:
    """The debug-off shape agrees with the reference model too (the debug shape's run,
    10,000 operations a map, is in tests/runtime/test_lockstep.py)."""
    schema, cls = _bundled(stem)
    assert (
        check_lockstep(schema, cls, operations=1_000, steps=100, debug=False) >= 1_000
    )


def test_golden_modules_are_one_class() -> None:
    """Every golden module defines its map once, with no debug subclass."""
    for path in sorted((REPO / "tests" / "golden" / "maps").glob("*.py.txt")):
        text = path.read_text(encoding="utf-8")
        schema = load_schema(
            REPO / "tests" / "golden" / "schemas" / Path(path.stem).with_suffix(".py"),
            "golden",
        )
        assert text.count(f"\nclass {schema.name}") == 1
        assert "Debug(" not in text and "__class__" not in text
