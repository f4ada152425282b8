"""A schedule lane that names its own slots and owners (``Schema(schedule=
ScheduleSlots(indices=, owners=))``, Note [Slots per lane]): refused where it cannot
work, at the line of the declaration that meets another, with the fix; generated, the schedule resolves read the scheduler's own
object, typed with a Protocol of their own, and debug mode names that lane's requests."""

from __future__ import annotations

import typing
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from relay import RelayDebugError
from relay.codegen.validate import validate
from relay.schema import (
    Field,
    HostCopy,
    IfNone,
    Lane,
    Resolve,
    Scatter,
    ScheduleSlots,
    Schema,
    Tails,
)
from relay.testing import load_map_class

FWD, SCHED = Lane.FORWARD, Lane.SCHEDULE


def tokens(**options: Any) -> Field:
    """A forward token field."""
    options.setdefault("target", "input_ids")
    return Field("tokens", lane=FWD, dtype=torch.int64, **options)


def lens(**options: Any) -> Field:
    """A schedule lengths field."""
    options.setdefault("target", "seq_lens")
    return Field("lens", lane=SCHED, dtype=torch.int64, **options)


def drafts(**options: Any) -> Field:
    """A counted forward scatter (offsets and lengths on the batch)."""
    return Field(
        "drafts",
        lane=FWD,
        dtype=torch.int64,
        shape=(2,),
        target="flat_ids",
        resolve=Scatter(offsets="starts", lengths="counts"),
        **options,
    )


def slots(**options: Any) -> dict[str, Any]:
    """``schedule=ScheduleSlots(**options)``, as schema options."""
    return {"schedule": ScheduleSlots(**options)}


#: (id, schema options, fields, a phrase of the problem, a phrase of the fix, where
#: the issue is reported: "schema", "slots" (the ScheduleSlots), or a field's name and
#: the group of it ("lens", "lens.host", "drafts.resolve"))
REFUSED: list[tuple[str, dict[str, Any], list[Field], str, str, str]] = [
    (
        "slots-not-a-path",
        slots(indices="req slots"),
        [lens()],
        "ScheduleSlots(indices=...) must be a dotted attribute path",
        'write indices="req_pool_indices"',
        "slots",
    ),
    (
        "owners-not-a-path",
        slots(owners=3),
        [lens()],
        "ScheduleSlots(owners=...) must be a dotted attribute path",
        'write owners="rids"',
        "slots",
    ),
    (
        "not-a-group",
        {"schedule": "slots"},
        [lens()],
        "schedule must be a ScheduleSlots(...) or None (got 'slots' that is a str)",
        'write schedule=ScheduleSlots(indices="slots", owners="req_ids")',
        "schema",
    ),
    (
        "nothing-named",
        slots(),
        [lens()],
        "ScheduleSlots() names neither the schedule lane's slots nor its owners",
        "remove schedule=...",
        "slots",
    ),
    (
        "slots-without-schedule-fields",
        slots(indices="sched_slots"),
        [tokens()],
        "the schema has no schedule-lane field",
        "remove schedule=...",
        "slots",
    ),
    (
        "owners-without-schedule-fields",
        slots(owners="sched_rids"),
        [tokens()],
        "the schema has no schedule-lane field",
        "remove schedule=...",
        "slots",
    ),
    (
        "slots-are-a-target",
        slots(indices="seq_lens"),
        [lens()],
        "target 'seq_lens' is also the schema's ScheduleSlots(indices=...)",
        "give the target of field 'lens' a batch attribute of its own",
        "lens",
    ),
    (
        "slots-are-a-host-copy",
        slots(indices="seq_lens_cpu"),
        [lens(host=HostCopy(mirror="seq_lens_cpu"))],
        "HostCopy(mirror=...) 'seq_lens_cpu' is also the schema's ScheduleSlots(",
        "give the HostCopy(mirror=...) of field 'lens' a batch attribute of its own",
        "lens.host",
    ),
    (
        "slots-are-offsets",
        slots(indices="starts"),
        [drafts(), lens()],
        "Scatter(offsets=...) 'starts' is also the schema's ScheduleSlots(indices=...)",
        "give the Scatter(offsets=...) of field 'drafts'",
        "drafts.resolve",
    ),
    (
        "slots-are-lengths",
        slots(indices="counts"),
        [drafts(), lens()],
        "Scatter(lengths=...) 'counts' is also the schema's ScheduleSlots(indices=...)",
        "give the Scatter(lengths=...) of field 'drafts'",
        "drafts.resolve",
    ),
    (
        "slots-are-the-owners",
        {"owners": "rids", **slots(indices="rids")},
        [lens()],
        "ScheduleSlots(indices=...) 'rids' is also the schema's owners",
        "give ScheduleSlots(indices=...) a batch attribute of its own",
        "slots",
    ),
    (
        "owners-are-the-slots",
        slots(owners="req_pool_indices"),
        [lens()],
        "ScheduleSlots(owners=...) 'req_pool_indices' is also the schema's indices",
        "give ScheduleSlots(owners=...)",
        "slots",
    ),
    (
        "owners-are-the-schedule-slots",
        slots(indices="sched", owners="sched"),
        [lens()],
        "ScheduleSlots(owners=...) 'sched' is also the schema's ScheduleSlots(indices=",
        "a batch attribute of its own",
        "slots",
    ),
    (
        "slots-through-a-target",
        slots(indices="seq_lens.slots"),
        [lens()],
        "target 'seq_lens' also holds 'seq_lens.slots', the schema's ScheduleSlots(",
        "give the target of field 'lens'",
        "lens",
    ),
    (
        "slots-holding-a-target",
        slots(indices="sched"),
        [Field("lens", lane=SCHED, dtype=torch.int64, target="sched.seq_lens")],
        "target 'sched.seq_lens' goes through 'sched', the schema's ScheduleSlots(",
        "give the target of field 'lens'",
        "lens",
    ),
    (
        "owners-through-an-optional-parent",
        {
            **slots(indices="lookup.slots", owners="lookup.rids"),
            "optional_parents": {"lookup": IfNone.SKIP},
        },
        [lens()],
        (
            "ScheduleSlots(owners=...) 'lookup.rids' goes through the optional parent "
            "'lookup'"
        ),
        "outside optional_parents",
        "schema",
    ),
    (
        "protocol-name-taken",
        slots(indices="sched_slots"),
        [tokens(target="schedule_batch.ids"), lens()],
        (
            "would be named LanesScheduleBatch, a name the module already defines (the "
            "schedule lane's batch Protocol)"
        ),
        "rename the attribute 'schedule_batch' on the batch, or the schema",
        "tokens",
    ),
]


def _site(schema: Schema, where: str) -> int:
    """The line ``where`` names (see ``REFUSED``)."""
    if where == "schema":
        return schema.declared_at.line
    if where == "slots":
        assert schema.schedule is not None
        return schema.schedule.declared_at.line
    name, _, group = where.partition(".")
    at: Any = next(f for f in schema.fields if f.name == name)
    line: int = (getattr(at, group) if group else at).declared_at.line
    return line


@pytest.mark.parametrize(
    ("options", "fields", "problem", "fix", "where"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_each_refusal_names_its_line_and_the_fix(
    options: dict[str, Any], fields: list[Field], problem: str, fix: str, where: str
) -> None:
    """One issue, at the line of the declaration that meets another, naming the
    problem and the fix."""
    schema = Schema(name="LanesFutureMap", fields=fields, **options)
    issues = validate(schema, str)
    assert len(issues) == 1, [str(i) for i in issues]
    (issue,) = issues
    assert issue.line == _site(schema, where)
    assert problem in issue.problem, issue.problem
    assert fix in issue.fix, issue.fix


def test_a_schedule_placeholder_is_refused_at_its_field() -> None:
    """invalidate writes placeholders on the forward batch; a schedule resolve that
    hands its value to the scheduler's own object would leave them there."""
    at_fault = lens(resolve=Resolve.PLACEHOLDER)
    schema = Schema(
        name="LanesFutureMap", fields=[at_fault], schedule=ScheduleSlots(owners="rids")
    )
    (issue,) = validate(schema, str)
    assert (issue.line, issue.field) == (at_fault.declared_at.line, "lens")
    assert "placeholders would stay where they were written" in issue.problem
    assert "Resolve.GATHER, or remove schedule=..." in issue.fix


@pytest.mark.parametrize(
    "options",
    [
        slots(indices="req_pool_indices"),  # the same name, its own Protocol
        {"owners": "rids", **slots(owners="rids")},
        slots(indices="mix_running_indices"),  # the tails' slots, read as slots
        {  # the scheduler's slots through an optional parent
            **slots(indices="lookup.slots"),
            "optional_parents": {"lookup": IfNone.REFUSE},
        },
        slots(owners="rids"),  # owners for the schedule lane alone
    ],
)
def test_what_can_work_is_accepted(options: dict[str, Any]) -> None:
    """Slots read as slots and owners read as owners may share an attribute; a lane may
    have owners the other lacks; the scheduler's slots may go through an optional
    parent."""
    fields = [tokens(), lens(tails=Tails(rows="mix_running_indices"))]
    assert validate(Schema(name="LanesFutureMap", fields=fields, **options), str) == []


# --- the generated map -------------------------------------------------------------------


def _lanes_map(**options: Any) -> type[Any]:
    schema = Schema(
        name="LanesApartFutureMap",
        owners="rids",
        schedule=ScheduleSlots(indices="lookup.slots", owners="request_ids"),
        optional_parents={"lookup": IfNone.SKIP},
        fields=[
            tokens(),
            lens(
                host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"),
            ),
        ],
        **options,
    )
    assert validate(schema, str) == []
    return load_map_class(schema)


def _lookup(slots: list[int], request_ids: list[str]) -> SimpleNamespace:
    """A scheduler-side object: only what the schedule resolve reads and writes."""
    return SimpleNamespace(
        lookup=SimpleNamespace(slots=torch.tensor(slots)),
        request_ids=request_ids,
        seq_lens=None,
        seq_lens_cpu=None,
        seq_lens_sum=None,
    )


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_each_lane_reads_its_own_object(debug: bool) -> None:
    """The forward batch carries the forward lane's names only, the scheduler's object
    the schedule lane's: each resolve reads its own, in the order its slots give."""
    cls = _lanes_map()
    relay = cls("cpu", 8, debug=debug)
    relay.stash(torch.tensor([3, 5]), cls_payload(cls, [30, 50]), owners=["a", "b"])
    relay.publish(torch.tensor([3, 5]), torch.tensor([7, 9]), owners=["a", "b"])
    lookup = _lookup([5, 3], ["b", "a"])
    relay.resolve_seq_lens_cpu(lookup)
    assert lookup.seq_lens.tolist() == [9, 7]
    assert lookup.seq_lens_cpu.tolist() == [9, 7] and lookup.seq_lens_sum == 16
    assert not hasattr(lookup, "req_pool_indices") and not hasattr(lookup, "rids")
    batch = SimpleNamespace(
        req_pool_indices=torch.tensor([5, 3]), rids=["b", "a"], input_ids=None
    )
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [50, 30]


def cls_payload(cls: type[Any], tokens: list[int]) -> Any:
    """The map's payload class with ``tokens``."""
    payload: type[Any] = typing.get_type_hints(cls.stash)["payload"]
    return payload(tokens=torch.tensor(tokens))


def test_debug_mode_names_a_schedule_read_with_the_schedule_lanes_owners() -> None:
    """Two pending requests' slots swapped on the scheduler's side: the read is named
    with the request ids of the scheduler's object, not the forward batch's."""
    relay = _lanes_map()("cpu", 8, debug=True)
    relay.publish(torch.tensor([3, 5]), torch.tensor([7, 9]), owners=["a", "b"])
    with pytest.raises(
        RelayDebugError,
        match=r"slot 5: resolve_seq_lens_cpu reads it for request 'a' \(position 0\), "
        r"but publish wrote it for request 'b'",
    ):
        relay.resolve_seq_lens_cpu(_lookup([5, 3], ["a", "b"]))


def test_a_scheduler_object_without_its_optional_parent_is_skipped() -> None:
    """The schedule lane's slots through an optional parent declared ``IfNone.SKIP``: a
    scheduler object holding ``None`` there is left alone, with no fence wait."""
    relay = _lanes_map()("cpu", 8, debug=True)
    lookup = _lookup([], [])
    lookup.lookup = None
    relay.resolve_seq_lens_cpu(lookup)  # debug mode: no wait was counted
    assert lookup.seq_lens is None and lookup.seq_lens_cpu is None
    relay.publish(torch.tensor([3]), torch.tensor([7]), owners=["a"])
    fresh = _lookup([3], ["a"])
    relay.resolve_seq_lens_cpu(fresh)
    assert fresh.seq_lens.tolist() == [7]


def _members(protocol: type[Any]) -> set[str]:
    """A generated Protocol's attributes and read-only properties."""
    names = set(getattr(protocol, "__annotations__", {}))
    return names | {n for n in vars(protocol) if not n.startswith("_")}


def test_the_batch_protocols_split_by_lane() -> None:
    """Declared, the module has a schedule-lane batch Protocol with only what the
    schedule resolves read and write; the forward batch's lists none of it."""
    cls = _lanes_map()
    module = __import__(cls.__module__, fromlist=["_"])
    forward = _members(module.LanesApartBatch)
    schedule = _members(module.LanesApartScheduleBatch)
    assert forward == {"req_pool_indices", "rids", "input_ids"}
    assert schedule == {
        "lookup",
        "request_ids",
        "seq_lens",
        "seq_lens_cpu",
        "seq_lens_sum",
    }
    assert _members(module.LanesApartScheduleLookup) == {"slots"}
    hints = typing.get_type_hints(cls.resolve_seq_lens_cpu)
    assert hints["batch"] is module.LanesApartScheduleBatch
    assert typing.get_type_hints(cls.resolve_future)["batch"] is module.LanesApartBatch


def test_derive_keeps_or_changes_the_schedule_lanes_attributes() -> None:
    """``derive`` takes the base's schedule slots and owners unless it is given others."""
    base = Schema.bundled("vllm_drafts")
    kept = base.derive(name="KeptFutureMap", doc="Kept.")
    assert kept.schedule == ScheduleSlots(indices="slots", owners="req_ids")
    changed = base.derive(
        name="ChangedFutureMap",
        doc="Changed.",
        schedule=ScheduleSlots(indices="lookup_slots", owners="lookup_ids"),
    )
    assert changed.schedule == ScheduleSlots(
        indices="lookup_slots", owners="lookup_ids"
    )
    assert changed.slots_of(SCHED) == "lookup_slots"
    assert changed.slots_of(FWD) == "slots"
    assert validate(changed, str) == []
