"""One role per batch attribute path (Note [One role per path] in relay/codegen/roles.py):
a path two declarations give roles that cannot share it is refused at the later
declaration's line, naming both and the fix, whichever options they are."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from relay.codegen.roles import Kind, role_table
from relay.codegen.validate import validate
from relay.schema import (
    Field,
    HostCopy,
    IfNone,
    Lane,
    Scatter,
    ScheduleSlots,
    Schema,
    SourceLocation,
    Tails,
    TailsKv,
)


def tokens(**options: Any) -> Field:
    """The forward token field."""
    options.setdefault("target", "input_ids")
    return Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, **options)


def lens(**options: Any) -> Field:
    """The schedule lengths field, mirrored to the host."""
    options.setdefault("host", HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"))
    return Field(
        "lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens", **options
    )


def drafts(scatter: Scatter) -> Field:
    """A counted scatter of drafts into a flat target."""
    return Field(
        "drafts",
        lane=Lane.FORWARD,
        dtype=torch.int64,
        shape=(3,),
        target="draft_ids",
        resolve=scatter,
    )


def tails(**options: Any) -> Tails:
    """The mixed batch's tails, with ``options`` (KV locations and table by default)."""
    options.setdefault("kv", TailsKv(locations="out_cache_loc", table="req_to_token"))
    return Tails(rows="mix_running_indices", **options)


def _one_issue(schema: Schema) -> Any:
    issues = validate(schema, str)
    assert len(issues) == 1, [str(i) for i in issues]
    return issues[0]


#: (id, the schema, the line reported, a phrase of the problem, the fix). Each schema
#: is one the flat vocabulary accepted, and a map generated from it handed wrong data
#: back or failed later.
def _cases() -> list[tuple[str, Schema, SourceLocation, str, str]]:
    found = []
    kv = TailsKv(locations="req_pool_indices", table="req_to_token")
    schema = Schema("RolesFutureMap", [tokens(), lens(tails=tails(kv=kv))])
    found.append(
        (
            "kv-locations-are-the-slots",
            schema,
            kv.declared_at,
            (
                "TailsKv(locations=...) 'req_pool_indices' is also the schema's indices "
                f"({schema.declared_at}): one batch attribute cannot be both (read as "
                "slots there, written here)"
            ),
            "give the TailsKv(locations=...) of field 'lens' a batch attribute of its own",
        )
    )
    kv = TailsKv(locations="mix_running_indices", table="req_to_token")
    t = tails(kv=kv)
    found.append(
        (
            "kv-locations-are-the-tails-rows",
            Schema("RolesFutureMap", [tokens(), lens(tails=t)]),
            kv.declared_at,
            (
                "TailsKv(locations=...) 'mix_running_indices' is also the Tails(rows=...) "
                f"of field 'lens' ({t.declared_at}): one batch attribute cannot be both "
                "(read as slots there, written here)"
            ),
            "give the TailsKv(locations=...) of field 'lens' a batch attribute of its own",
        )
    )
    kv = TailsKv(locations="rids", table="req_to_token")
    found.append(
        (
            "kv-locations-are-the-owners",
            Schema(
                "RolesFutureMap", [tokens(), lens(tails=tails(kv=kv))], owners="rids"
            ),
            kv.declared_at,
            "TailsKv(locations=...) 'rids' is also the schema's owners",
            "give the TailsKv(locations=...) of field 'lens' a batch attribute of its own",
        )
    )
    kv = TailsKv(locations="req_to_token", table="req_to_token")
    found.append(
        (
            "kv-locations-are-their-table",
            Schema("RolesFutureMap", [tokens(), lens(tails=tails(kv=kv))]),
            kv.declared_at,
            (
                "TailsKv(table=...) 'req_to_token' is also the TailsKv(locations=...) of "
                "field 'lens': one batch attribute cannot be both (written there, read as a "
                "request-to-token table here)"
            ),
            "give the TailsKv(table=...) of field 'lens' a batch attribute of its own",
        )
    )
    counted = Scatter(offsets="starts", lengths="req_pool_indices")
    found.append(
        (
            "lengths-are-the-slots",
            Schema("RolesFutureMap", [drafts(counted)]),
            counted.declared_at,
            "Scatter(lengths=...) 'req_pool_indices' is also the schema's indices",
            "give the Scatter(lengths=...) of field 'drafts' a batch attribute of its own",
        )
    )
    t = tails(prefix="seq_lens_cpu")
    found.append(
        (
            "prefix-is-the-host-mirror",
            Schema("RolesFutureMap", [tokens(), lens(tails=t)]),
            t.declared_at,
            (
                "Tails(prefix=...) 'seq_lens_cpu' is also the HostCopy(mirror=...) of field "
                "'lens'"
            ),
            "give the Tails(prefix=...) of field 'lens' a batch attribute of its own",
        )
    )
    t = tails(prefix="input_ids")
    found.append(
        (
            "prefix-is-a-target",
            Schema("RolesFutureMap", [tokens(), lens(tails=t)]),
            t.declared_at,
            "Tails(prefix=...) 'input_ids' is also the target of field 'tokens'",
            "give the Tails(prefix=...) of field 'lens' a batch attribute of its own",
        )
    )
    t = tails(prefix="prefix_lens")
    found.append(
        (
            "schedule-slots-are-the-prefix",
            Schema(
                "RolesFutureMap",
                [tokens(), lens(tails=t)],
                schedule=ScheduleSlots(indices="prefix_lens"),
            ),
            t.declared_at,
            (
                "Tails(prefix=...) 'prefix_lens' is also the schema's "
                "ScheduleSlots(indices=...)"
            ),
            "give the Tails(prefix=...) of field 'lens' a batch attribute of its own",
        )
    )
    t = tails(prefix="spec_info")
    found.append(
        (
            "prefix-holds-a-target",
            Schema(
                "RolesFutureMap",
                [tokens(target="spec_info.ids"), lens(tails=t)],
            ),
            t.declared_at,
            (
                "Tails(prefix=...) 'spec_info' also holds 'spec_info.ids', the target of "
                "field 'tokens'"
            ),
            "give the Tails(prefix=...) of field 'lens' a batch attribute of its own",
        )
    )
    host = HostCopy(mirror="seq_lens_cpu", sum="seq_lens_cpu")
    found.append(
        (
            "host-sum-is-the-mirror",
            Schema("RolesFutureMap", [lens(host=host)]),
            host.declared_at,
            (
                "HostCopy(sum=...) 'seq_lens_cpu' is also the HostCopy(mirror=...) of field "
                "'lens': one batch attribute cannot be both (written there, written here)"
            ),
            "give the HostCopy(sum=...) of field 'lens' a batch attribute of its own",
        )
    )
    parented = lens(host=HostCopy(mirror="spec_info.seq_lens_cpu"))
    found.append(
        (
            "host-mirror-through-an-optional-parent",
            Schema(
                "RolesFutureMap",
                [tokens(target="spec_info.ids"), parented],
                optional_parents={"spec_info": IfNone.SKIP},
            ),
            parented.host.declared_at if parented.host else SourceLocation("", 0),
            (
                "HostCopy(mirror=...) 'spec_info.seq_lens_cpu' goes through the optional "
                "parent 'spec_info'; it is written whatever the batch holds"
            ),
            "name an attribute outside optional_parents for HostCopy(mirror=...)",
        )
    )
    return found


CASES = _cases()


@pytest.mark.parametrize(
    ("schema", "at", "problem", "fix"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_path_in_two_roles_is_refused_at_the_later_declaration(
    schema: Schema, at: SourceLocation, problem: str, fix: str
) -> None:
    """One issue, at the line of the later declaration, naming both and the fix."""
    issue = _one_issue(schema)
    assert (issue.path, issue.line) == (at.file, at.line)
    assert problem in issue.problem, issue.problem
    assert issue.fix == fix


def test_reads_of_one_kind_share_a_path() -> None:
    """Slots read as slots by both lanes and the tails, offsets shared by a span, one
    owners attribute for both lanes, the slots path as its own optional parent: one
    role each, no issue."""
    token = Field(
        "tok",
        lane=Lane.FORWARD,
        dtype=torch.int64,
        target="flat",
        resolve=Scatter(offsets="starts"),
    )
    more = Field(
        "more",
        lane=Lane.FORWARD,
        dtype=torch.int64,
        shape=(2,),
        target="flat",
        resolve=Scatter(offsets="starts", lengths="counts", after="tok"),
    )
    schema = Schema(
        "SharedFutureMap",
        [token, more, lens(tails=Tails(rows="slots"))],
        indices="slots",
        owners="rids",
        schedule=ScheduleSlots(indices="slots", owners="rids"),
    )
    assert validate(schema, str) == []
    parented = Schema(
        "ParentFutureMap",
        [tokens(target="spec.ids")],
        indices="spec.slots",
        optional_parents={"spec": IfNone.SKIP, "spec.slots": IfNone.SKIP},
    )
    assert validate(parented, str) == []


def test_the_table_holds_every_path_in_declaration_order() -> None:
    """The schema's options first, then each field's paths as its declaration spells
    them, each with what the map does with it."""
    schema = Schema(
        "TableFutureMap",
        [
            drafts(Scatter(offsets="starts", lengths="counts")),
            lens(tails=tails(prefix="p")),
        ],
        owners="rids",
        schedule=ScheduleSlots(indices="slots"),
        optional_parents={"spec": IfNone.SKIP},
    )
    assert [(r.path, r.option, r.kind) for r in role_table(schema)] == [
        ("req_pool_indices", "indices", Kind.SLOTS),
        ("rids", "owners", Kind.OWNERS),
        ("slots", "ScheduleSlots(indices=...)", Kind.SLOTS),
        ("spec", "optional_parents", Kind.PARENT),
        ("draft_ids", "target", Kind.WRITTEN),
        ("starts", "Scatter(offsets=...)", Kind.OFFSETS),
        ("counts", "Scatter(lengths=...)", Kind.COUNTS),
        ("seq_lens", "target", Kind.WRITTEN),
        ("seq_lens_cpu", "HostCopy(mirror=...)", Kind.WRITTEN),
        ("seq_lens_sum", "HostCopy(sum=...)", Kind.WRITTEN),
        ("mix_running_indices", "Tails(rows=...)", Kind.SLOTS),
        ("out_cache_loc", "TailsKv(locations=...)", Kind.WRITTEN),
        ("req_to_token", "TailsKv(table=...)", Kind.TABLE),
        ("p", "Tails(prefix=...)", Kind.WRITTEN),
    ]


def test_a_thousand_fields_are_checked_in_one_pass() -> None:
    """The rule looks each path up, never compares every pair: 1,000 fields nested
    three deep validate without an issue (a pairwise check would make a million
    comparisons)."""
    fields = [
        Field(f"f{i}", lane=Lane.FORWARD, dtype=torch.int64, target=f"a.b{i % 7}.t{i}")
        for i in range(1000)
    ]
    assert validate(Schema("ManyFutureMap", fields), str) == []
