"""What every write of every bundled map promises, each checked so that breaking it
fails here: the generated gate takes exactly what the runtime's checked path takes
(Note [One body]), a cast that would wrap or drop values is refused on every path,
and seeds are the caller's values as they were, applied at the next resolve."""

from __future__ import annotations

import importlib
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from relay_runtime_support import Batch, buffer_copies, buffers_unchanged, slots

from relay import RelayError, runtime
from relay.codegen.loader import load_schema
from relay.schema import Field, Lane, Schema

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = sorted(p.stem for p in (ROOT / "relay" / "schemas").glob("*.py"))
POOL = 9
#: A size for every symbolic dim a bundled schema declares.
DIMS = {"topk": 2, "hidden": 4, "draft_tokens": 3, "vocab": 5, "dsa_topk": 2}
DIMS["draft_token_num"] = DIMS["num_speculative_tokens"] = 3


def _bundled(stem: str) -> tuple[Schema, Any]:
    schema = load_schema(ROOT / "relay" / "schemas" / f"{stem}.py", stem)
    cls = getattr(importlib.import_module(f"relay.maps.{stem}"), schema.name)
    return schema, cls


def _new(schema: Schema, cls: Any) -> Any:
    wanted = {d for f in schema.fields if f.alloc.value == "eager" for d in f.shape}
    return cls("cpu", POOL, **{d: DIMS[d] for d in wanted if isinstance(d, str)})


def _value(f: Field, n: int, base: int) -> torch.Tensor:
    dtype = f.dtype if isinstance(f.dtype, torch.dtype) else torch.float32
    row = tuple(DIMS[d] if isinstance(d, str) else d for d in f.shape)
    values = torch.arange(base, base + n * max(1, _size(row))) % 5 + 1
    return values.reshape(n, *row).to(dtype)


def _size(row: tuple[int, ...]) -> int:
    out = 1
    for d in row:
        out *= d
    return out


def _payload(cls: Any, fields: list[Field], n: int, **change: object) -> Any:
    module = importlib.import_module(cls.__module__)
    payload_cls = next(
        v for k, v in vars(module).items() if k.endswith("Payload") and k != "Payload"
    )
    values: dict[str, object] = {
        f.payload_name: _value(f, n, 3 * i) for i, f in enumerate(fields)
    }
    for f in fields:  # a counted scatter's producer count: none of the row is real
        if f.scatter is not None and f.scatter.lengths is not None:
            counts = f.scatter.lengths.rsplit(".", 1)[-1]
            values[counts] = torch.zeros(n, dtype=torch.int64)
    values.update(change)
    return payload_cls(**values)


def _bad_values(f: Field, n: int) -> dict[str, object]:
    """Values of field ``f`` the gate must not take as they are."""
    good = _value(f, n, 0)
    bad: dict[str, object] = {
        "a list": good.tolist(),
        "one row short": good[:-1],
        "another row shape": torch.cat([good, good], dim=-1)
        if f.shape
        else good[:, None],
        "on another device": good.to("meta"),
        "requiring grad": good.float().requires_grad_(),
    }
    if not good.dtype.is_floating_point:
        bad["fractional floats"] = good.float() + 0.5
        bad["wider integers"] = good.to(torch.int64) + (1 << 40)
    return bad


def _outcome(call: Any, relay: Any) -> object:
    before = buffer_copies(relay)
    try:
        call()
    except RelayError as error:
        assert buffers_unchanged(relay, before), error
        return str(error)
    return {k: v.tolist() for k, v in buffer_copies(relay).items()}


def _both_paths(stem: str, target: Field, bad: object) -> list[object]:
    """What the generated write and the runtime's checked path each do with ``bad``
    as ``target``'s value (the other fields' values good)."""
    schema, cls = _bundled(stem)
    forward = [f for f in schema.fields if f.lane is Lane.FORWARD]
    schedule = [f for f in schema.fields if f.lane is Lane.SCHEDULE]
    outcomes = []
    for generated in (True, False):
        relay = _new(schema, cls)
        relay.stash(slots(1, 2), _payload(cls, forward, 2))  # lazy buffers exist
        if target.lane is Lane.FORWARD:
            payload = _payload(cls, forward, 2, **{target.payload_name: bad})
            call = (
                partial(relay.stash, slots(3, 4), payload)
                if generated
                else partial(runtime.stash, relay._state, slots(3, 4), payload)
            )
        else:
            values = {f.payload_name: _value(f, 2, 1) for f in schedule}
            values[target.payload_name] = bad
            ordered = tuple(values[f.payload_name] for f in schedule)
            call = (
                partial(relay.publish, slots(3, 4), **values)
                if generated
                else partial(runtime.publish, relay._state, slots(3, 4), ordered)
            )
        outcomes.append(_outcome(call, relay))
    return outcomes


@pytest.mark.parametrize("stem", BUNDLED)
def test_the_generated_gate_takes_what_the_checked_path_takes(stem: str) -> None:
    """Every bundled map, every forward and schedule field, each bad value: the
    generated stash and publish accept, cast or refuse (same message, nothing
    written) exactly as the runtime's checked path does."""
    schema, _cls = _bundled(stem)
    compared = 0
    for target in schema.fields:
        for why, bad in _bad_values(target, 2).items():
            generated, checked = _both_paths(stem, target, bad)
            assert generated == checked, (stem, target.name, why)
            compared += 1
    assert compared >= 6


@pytest.mark.parametrize("op", ["stash", "publish", "seed"])
def test_a_cast_that_would_wrap_is_refused_on_every_path(op: str) -> None:
    """int64 values into an int32 field (a forward field's, a schedule field's) would
    wrap: refused, named, nothing written, by the gate's and the checked path alike."""
    from relay.testing import load_map_class

    lane = Lane.SCHEDULE if op == "publish" else Lane.FORWARD
    schema = Schema(
        name="NarrowFutureMap",
        seeded=op == "seed",
        fields=[Field("narrow", lane=lane, dtype=torch.int32, target="narrow")],
    )
    cls = load_map_class(schema)
    for checked in (False, True):
        relay = _new(schema, cls)
        wide = torch.tensor([1, 1 << 40])
        if op == "publish":
            args: tuple[Any, ...] = (
                (slots(1, 2), (wide,)) if checked else (slots(1, 2), wide)
            )
        else:
            forward = [f for f in schema.fields if f.lane is Lane.FORWARD]
            args = (slots(1, 2), _payload(cls, forward, 2, narrow=wide))
        call = getattr(runtime, op) if checked else getattr(relay, op)
        first = relay._state if checked else None
        before = buffer_copies(relay)
        with pytest.raises(RelayError, match=r"the cast would wrap"):
            call(first, *args) if checked else call(*args)
        assert buffers_unchanged(relay, before) and not relay._state.seeds


def test_seed_keeps_copies_not_the_callers_tensors() -> None:
    """The values seed took are the caller's as they were when seeded: an engine that
    reuses its tensors after seeding does not change what the next resolve writes."""
    schema, cls = _bundled("eagle")
    relay = _new(schema, cls)
    forward = [f for f in schema.fields if f.lane is Lane.FORWARD]
    payload = _payload(cls, forward, 1)
    relay.seed(slots(3), payload)
    want = payload.bonus_tokens.tolist()
    payload.bonus_tokens.fill_(99)
    batch = Batch(req_pool_indices=slots(3))
    relay.resolve_future(batch)
    assert batch.spec_info.bonus_tokens.tolist() == want


def test_seeds_land_at_the_next_resolve_even_one_of_no_slots() -> None:
    """A resolve of zero slots still writes the queued seeds (on the forward stream):
    they are not left for a later resolve."""
    schema, cls = _bundled("decode")
    relay = _new(schema, cls)
    forward = [f for f in schema.fields if f.lane is Lane.FORWARD]
    relay.seed(slots(3), _payload(cls, forward, 1, next_token_ids=torch.tensor([7])))
    assert relay.output_tokens_buf[3].item() == 0
    relay.resolve_future(Batch(req_pool_indices=slots()))
    assert relay.output_tokens_buf[3].item() == 7 and not relay._state.seeds


def test_an_optional_flat_field_is_handed_over_flat_or_as_none() -> None:
    """``TargetShape.FLAT`` on an optional field: the resolve hands ``(n * row,)`` when
    the latest write carried it, and ``None`` when it left it out."""
    from relay.schema import Alloc, TargetShape
    from relay.testing import Namespace, load_map_class

    schema = Schema(
        name="OptionalFlatFutureMap",
        fields=[
            Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="tok"),
            Field(
                "drafts",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                shape=(3,),
                alloc=Alloc.LAZY,
                optional=True,
                target="drafts",
                target_shape=TargetShape.FLAT,
            ),
        ],
    )
    cls = load_map_class(schema)
    payload_cls = importlib.import_module(cls.__module__).OptionalFlatPayload
    for debug in (False, True):
        relay = cls("cpu", POOL, debug=debug)
        drafts = torch.arange(6).reshape(2, 3)
        relay.stash(slots(1, 2), payload_cls(tok=slots(5, 6), drafts=drafts))
        batch = Namespace(req_pool_indices=slots(2, 1))
        relay.resolve_future(batch)
        assert batch.drafts.tolist() == [3, 4, 5, 0, 1, 2]
        relay.stash(slots(1, 2), payload_cls(tok=slots(5, 6)))
        batch = Namespace(req_pool_indices=slots(1, 2))
        relay.resolve_future(batch)
        assert batch.drafts is None


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_a_batch_whose_optional_slots_are_none_is_skipped_or_refused(
    debug: bool,
) -> None:
    """``optional_parents`` naming the slots attribute itself (sglang's
    ``future_indices``): a resolve of a batch without them leaves it alone (SKIP) or
    refuses it naming the attribute (REFUSE); with slots it resolves as usual."""
    from relay.errors import RelayError
    from relay.schema import IfNone
    from relay.testing import Namespace, load_map_class

    for how in (IfNone.SKIP, IfNone.REFUSE):
        schema = Schema(
            name=f"OptionalSlots{how.name.title()}FutureMap",
            indices="future_indices",
            optional_parents={"future_indices": how},
            fields=[
                Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),
                Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens"),
            ],
        )
        cls = load_map_class(schema)
        payload_cls = getattr(
            importlib.import_module(cls.__module__), f"{schema.name[:-9]}Payload"
        )
        relay = cls("cpu", POOL, debug=debug)
        relay.stash(slots(1, 2), payload_cls(tok=slots(7, 8)))
        relay.publish(slots(1, 2), torch.tensor([3, 4]))
        for resolve in (relay.resolve_future, relay.resolve_seq_lens):
            batch = Namespace(future_indices=None)
            if how is IfNone.SKIP:
                resolve(batch)
                assert not hasattr(batch, "input_ids") and not hasattr(
                    batch, "seq_lens"
                )
            else:
                with pytest.raises(RelayError, match="batch.future_indices is None"):
                    resolve(batch)
        batch = Namespace(future_indices=slots(2, 1))
        relay.resolve_future(batch)
        relay.resolve_seq_lens(batch)
        assert batch.input_ids.tolist() == [8, 7] and batch.seq_lens.tolist() == [4, 3]


def test_a_nested_slots_path_named_whole_may_be_none() -> None:
    """``optional_parents`` naming the nested slots path whole (sglang 0.5.23's
    ``spec_info.future_indices``): a draft input without slots is left alone (SKIP) or
    refused naming the path (REFUSE), and one without a draft input is skipped by the
    parent's own entry."""
    from relay.errors import RelayError
    from relay.schema import IfNone
    from relay.testing import Namespace, load_map_class

    for how in (IfNone.SKIP, IfNone.REFUSE):
        schema = Schema(
            name=f"NestedSlots{how.name.title()}FutureMap",
            indices="spec_info.future_indices",
            optional_parents={
                "spec_info": IfNone.SKIP,
                "spec_info.future_indices": how,
            },
            fields=[
                Field(
                    "tok",
                    lane=Lane.FORWARD,
                    dtype=torch.int64,
                    target="spec_info.bonus",
                ),
                Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens"),
            ],
        )
        cls = load_map_class(schema)
        payload_cls = getattr(
            importlib.import_module(cls.__module__), f"{schema.name[:-9]}Payload"
        )
        relay = cls("cpu", POOL)
        relay.stash(slots(1, 2), payload_cls(tok=slots(7, 8)))
        relay.publish(slots(1, 2), torch.tensor([3, 4]))
        for resolve in (relay.resolve_future, relay.resolve_seq_lens):
            resolve(Namespace(spec_info=None))  # the parent's SKIP
            batch = Namespace(spec_info=Namespace(future_indices=None))
            if how is IfNone.SKIP:
                resolve(batch)
                assert not hasattr(batch.spec_info, "bonus")
                assert not hasattr(batch, "seq_lens")
            else:
                with pytest.raises(
                    RelayError, match=r"batch\.spec_info\.future_indices is None"
                ):
                    resolve(batch)
        batch = Namespace(spec_info=Namespace(future_indices=slots(2, 1)))
        relay.resolve_future(batch)
        relay.resolve_seq_lens(batch)
        assert batch.spec_info.bonus.tolist() == [8, 7]
        assert batch.seq_lens.tolist() == [4, 3]
