"""The reference model and the lockstep harness (``relay.testing``): every bundled schema
runs 10,000 operations against the model with no divergence, and a divergence is caught."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.codegen.loader import load_schema
from relay.maps.decode import DecodeFutureMap
from relay.schema import (
    Alloc,
    BatchRows,
    Field,
    Guard,
    HostCopy,
    IfNone,
    Lane,
    Layout,
    Resolve,
    Scatter,
    ScheduleSlots,
    Schema,
    Tails,
    TailsKv,
    TargetShape,
    Unwritten,
    extra,
)
from relay.testing import (
    LockstepDivergence,
    Namespace,
    ReferenceRelay,
    check_lockstep,
    load_map_class,
    run_lockstep,
)
from relay.testing.pytest_plugin import relay_lockstep  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = sorted(path.stem for path in (ROOT / "relay" / "schemas").glob("*.py"))


def _bundled(name: str) -> tuple[Schema, type[Any]]:
    schema = load_schema(
        ROOT / "relay" / "schemas" / f"{name}.py", f"relay/schemas/{name}.py"
    )
    cls: type[Any] = getattr(importlib.import_module(f"relay.maps.{name}"), schema.name)
    return schema, cls


@pytest.mark.parametrize("name", BUNDLED)
def test_each_bundled_schema_runs_10000_operations_in_lockstep(name: str) -> None:
    """The generated map in debug mode and the model agree on 10,000 operations."""
    schema, cls = _bundled(name)
    assert check_lockstep(schema, cls, operations=10_000, steps=200) >= 10_000


def test_lockstep_with_real_worker_threads() -> None:
    """The same on real ThreadStream workers: forward work queued, schedule resolves on the host."""
    schema, cls = _bundled("eagle")
    assert check_lockstep(schema, cls, operations=600, steps=100, threads=True) >= 600


def test_a_schema_declared_in_the_test_is_rendered_and_checked(
    relay_lockstep: Callable[..., int],  # noqa: F811
) -> None:
    """The one-call path: a user's schema (bool and int32 fields, optional schedule field)."""
    schema = Schema(
        name="FlagsFutureMap",
        fields=[
            Field(
                "token",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                target="input_ids",
                resolve=Resolve.PLACEHOLDER,
            ),
            Field("done", lane=Lane.FORWARD, dtype=torch.bool, target="spec_info.done"),
            Field(
                "ids",
                lane=Lane.FORWARD,
                dtype=torch.int32,
                shape=("k",),
                alloc=Alloc.LAZY,
                optional=True,
                target="spec_info.ids",
            ),
            Field(
                "score",
                lane=Lane.SCHEDULE,
                dtype=torch.float32,
                target="score",
                host=HostCopy(mirror="score_cpu"),
            ),
        ],
    )
    assert relay_lockstep(schema, operations=1_000, dims={"k": 2}) >= 1_000


class CorruptDecodeMap(DecodeFutureMap):
    """A planted bug: slot 3's token comes back off by one."""

    def resolve_future(self, batch: Any) -> None:
        slots = batch.req_pool_indices.clone()
        super().resolve_future(batch)
        if slots.numel():
            batch.input_ids += (slots == 3).to(batch.input_ids.dtype)


def test_a_divergence_is_reported_with_the_operations_before_it() -> None:
    """The harness is not vacuous: a map that corrupts one slot's value fails it."""
    schema, _ = _bundled("decode")
    with pytest.raises(
        LockstepDivergence, match=r"after resolve_future.*batch\.input_ids differs"
    ):
        check_lockstep(
            schema,
            CorruptDecodeMap,
            operations=2_000,
            steps=100,
            debug=False,
            shrink=False,
        )


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_run_lockstep_inside_a_users_own_given(data: st.DataObject) -> None:
    """run_lockstep composes with a user's own Hypothesis test and reports the count."""
    schema, cls = _bundled("decode")
    assert run_lockstep(schema, cls, data, steps=20, debug=False) == 20


def _optional_schema() -> Schema:
    return Schema(
        name="OptFutureMap",
        fields=[
            Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="tok"),
            Field(
                "extra",
                lane=Lane.FORWARD,
                dtype=torch.float32,
                shape=(2,),
                optional=True,
                alloc=Alloc.LAZY,
                target="extra",
            ),
        ],
    )


def test_the_model_hands_over_an_optional_field_only_after_a_stash_carrying_it() -> (
    None
):
    """Note [Optional fields] in the model: the latest non-empty stash decides, never stale rows."""
    model = ReferenceRelay(_optional_schema())
    model.stash([1], {"tok": torch.tensor([5]), "extra": torch.ones(1, 2)})
    batch = Namespace(req_pool_indices=torch.tensor([1]))
    model.resolve_future(batch)
    assert batch.tok.tolist() == [5] and batch.extra.tolist() == [[1.0, 1.0]]
    model.stash([1], {"tok": torch.tensor([6]), "extra": None})
    model.stash(
        [], {"tok": torch.empty(0, dtype=torch.int64), "extra": torch.ones(0, 2)}
    )
    model.resolve_future(batch)
    assert batch.tok.tolist() == [6] and batch.extra is None


def test_the_model_refuses_to_invent_a_value() -> None:
    """Reading a released slot is a ModelError: the harness never asks for undefined values."""
    model = ReferenceRelay(_optional_schema())
    model.stash([2], {"tok": torch.tensor([1])})
    model.release([2])
    with pytest.raises(AssertionError, match="tok: slot 2 holds no value"):
        model.resolve_future(Namespace(req_pool_indices=torch.tensor([2])))


def _every_option() -> Schema:
    """One schema that declares every field option, each at a value other than its
    default somewhere (and the schema options seeding and an optional parent): kept
    fields, graph-written ones on both lanes, a stream-ordered read and late-bound
    tails included."""
    return Schema(
        name="EveryOptionFutureMap",
        seeded=True,
        optional_parents={"spec_info": IfNone.SKIP},
        fields=[
            Field(
                "tok",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                source="next_tokens",
                target="input_ids",
                resolve=Resolve.PLACEHOLDER,
                guard=Guard.NON_NEGATIVE,
            ),
            Field(
                "topk_p",
                lane=Lane.FORWARD,
                dtype=torch.float32,
                shape=("topk",),
                target="spec_info.topk_p",
                guard=Guard.FINITE,
            ),
            Field(
                "accept",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                shape=(2,),
                target="spec_info.accept",
                target_shape=TargetShape.FLAT,
                unwritten=Unwritten.ZEROS,
                kept=True,
            ),
            extra(
                "hidden",
                shape=("hidden",),
                target="spec_info.hidden",
                gate="spec_info.has_hidden",
            ),
            Field(
                "bonus",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                target="draft_ids",
                resolve=Scatter(
                    offsets="draft_starts",
                    when="bonus_ready",
                    rows=BatchRows(starts="draft_rows", index="draft_row_of"),
                    cast=torch.int32,
                ),
            ),
            Field(
                "drafts",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                shape=(2,),
                target="draft_ids",
                resolve=Scatter(
                    offsets="draft_starts",
                    lengths="num_drafts",
                    after="bonus",
                    rest_checked=False,
                    cast=torch.int32,
                ),
                graph_written=True,
            ),
            Field(
                "lens",
                lane=Lane.SCHEDULE,
                dtype=torch.int64,
                target="seq_lens",
                host=HostCopy(
                    mirror="seq_lens_cpu",
                    sum="seq_lens_sum",
                    stream_ordered=True,
                    optional=True,
                ),
                guard=Guard.POSITIVE,
                graph_written=True,
                tails=Tails(
                    rows="mix_running_indices",
                    kv=TailsKv(locations="out_cache_loc", table="req_to_token"),
                    add=2,
                    prefix="prefix_lens",
                ),
            ),
            Field(
                "conf",
                lane=Lane.SCHEDULE,
                dtype=torch.float32,
                optional=True,
                target="conf",
            ),
        ],
    )


@pytest.mark.parametrize("layout", [Layout.SEPARATE, Layout.PACKED])
@pytest.mark.parametrize("debug", [True, False], ids=["debug-on", "debug-off"])
def test_a_schema_with_every_option_runs_in_lockstep_through_its_own_table(
    layout: Layout, debug: bool
) -> None:
    """Every field option, rendered and run against the reference model; the generated
    table is the schema's own declarations (Note [One model of a field]): equal to the
    schema the test declared, with nothing translated. Separate, the schedule lane
    names its own slots and owners on a scheduler-side object (the forward lane none);
    packed, both lanes read the batch's."""
    separate = layout is Layout.SEPARATE
    schema = attrs.evolve(
        _every_option(),
        name=f"Every{layout.name.title()}FutureMap",
        layout=layout,
        owners=None if separate else "rids",
        schedule=ScheduleSlots(indices="scheduler.slots", owners="scheduler.rids")
        if separate
        else None,
    )
    covered = {
        a.name
        for a in attrs.fields(Field)
        if any(getattr(f, a.name) != a.default for f in schema.fields)
    }
    assert covered >= {a.name for a in attrs.fields(Field)} - {"doc", "declared_at"}
    # Every grouped declaration, each option of it away from its default.
    groups: list[Any] = [f.resolve for f in schema.fields if f.scatter is not None]
    groups += [f.host for f in schema.fields] + [f.tails for f in schema.fields]
    groups += [f.tails.kv for f in schema.fields if f.tails is not None]
    groups += [f.scatter.rows for f in schema.fields if f.scatter is not None]
    if separate:
        groups.append(schema.schedule)
    declared = {
        (type(g).__name__, a.name)
        for g in groups
        if g is not None
        for a in attrs.fields(type(g))
        if getattr(g, a.name) != a.default
    }
    kinds = [Scatter, BatchRows, HostCopy, Tails, TailsKv]
    kinds += [ScheduleSlots] if separate else []
    every = {
        (k.__name__, a.name)
        for k in kinds
        for a in attrs.fields(k)
        if a.name != "declared_at"
    }
    assert declared >= every, every - declared
    cls = load_map_class(schema)
    assert sys.modules[cls.__module__]._TABLE.schema == schema
    assert check_lockstep(schema, cls, operations=400, steps=100, debug=debug) == 400
