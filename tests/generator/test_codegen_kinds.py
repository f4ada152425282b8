"""Kinds: a Guard member is its enum entry, its rule in validate.py and its runtime
helper (the generator names it ``_rt.guard_<value>``); Guard.FINITE works end to end."""

from __future__ import annotations

import math
import types

import pytest
import torch

from relay import runtime
from relay.codegen.render import render
from relay.codegen.validate import validate
from relay.schema import FROM_PAYLOAD, Alloc, Field, Guard, Lane, Schema
from relay.testing.model import ReferenceRelay


def test_every_guard_has_its_runtime_check() -> None:
    """Each Guard but NONE has its runtime check, and the generated table declares the
    field's guard as the schema does (Note [One model of a field])."""
    for guard in Guard:
        assert guard in runtime._GUARDS
        if guard is Guard.NONE:
            continue
        assert callable(runtime._GUARDS[guard])
        schema = Schema(
            name="GFutureMap",
            fields=[Field("x", lane=Lane.FORWARD, dtype=torch.float32, guard=guard)],
        )
        assert f"guard=_rt.Guard.{guard.name}" in render(
            schema, source="schemas/g.py", command="relay generate"
        )


FINITE = Schema(
    name="FiniteFutureMap",
    fields=[
        Field(
            "hidden_states",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("hidden",),
            target="spec_info.hidden_states",
            guard=Guard.FINITE,
        ),
        Field(
            "probs",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            alloc=Alloc.LAZY,
            optional=True,
            shape=(2,),
            target="spec_info.probs",
            guard=Guard.FINITE,
        ),
    ],
)


@pytest.fixture(scope="module")
def finite() -> types.ModuleType:
    """The generated module of a schema with two Guard.FINITE fields."""
    module = types.ModuleType("relay_finite_map")
    content = render(FINITE, source="schemas/finite.py", command="relay generate")
    exec(compile(content, "finite.py", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", ["hidden_states", "probs"])
def test_finite_guard_refuses_nan_and_inf_in_debug_mode(
    finite: types.ModuleType, bad: float, field: str
) -> None:
    """In debug mode NaN and infinities are refused, naming the field, and the model says
    the same; with debug off nothing is checked and the value is written as given."""
    values = {
        "hidden_states": torch.zeros(2, 3),
        "probs": torch.zeros(2, 2, dtype=torch.bfloat16),
    }
    values[field][1, 0] = bad
    payload = finite.FinitePayload(**values)
    slots = torch.tensor([1, 2])
    assert not ReferenceRelay(FINITE).accepts(field, values[field])
    relay = finite.FiniteFutureMap("cpu", 4, hidden=3, debug=True)
    with pytest.raises(
        RuntimeError,
        match=rf"FiniteFutureMap\.{field}: guard failed, values must be finite",
    ):
        relay.stash(slots, payload)
    plain = finite.FiniteFutureMap("cpu", 4, hidden=3)
    plain.stash(slots, payload)
    written = getattr(plain, f"{field}_buf")[2, 0].item()
    assert math.isnan(written) if math.isnan(bad) else written == bad


def test_finite_guard_accepts_finite_values(finite: types.ModuleType) -> None:
    """Finite values, negative and zero included, pass the guard in debug mode."""
    values = {"hidden_states": torch.tensor([[-1.0, 0.0, 3.5]]), "probs": None}
    assert ReferenceRelay(FINITE).accepts("hidden_states", values["hidden_states"])
    relay = finite.FiniteFutureMap("cpu", 4, hidden=3, debug=True)
    relay.stash(torch.tensor([3]), finite.FinitePayload(**values))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_finite_guard_on_a_non_floating_field_is_refused(dtype: torch.dtype) -> None:
    """Guard.FINITE on an integer or bool field is a located schema issue with the fix."""
    field = Field("tokens", lane=Lane.FORWARD, dtype=dtype, guard=Guard.FINITE)
    (issue,) = validate(Schema("BadFutureMap", [field]), str)
    assert issue.field == "tokens"
    assert issue.problem == (
        "guard=Guard.FINITE refuses NaN and infinities, which only floating values hold "
        f"(got dtype={dtype})"
    )
    assert issue.fix.startswith("remove the guard, or give the field a floating dtype")
