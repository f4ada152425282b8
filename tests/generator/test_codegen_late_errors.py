"""Refusals of graph-written, kept, stream-ordered and late-bound-tail declarations: each
combination that cannot work is reported at the field's line, with the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from relay.codegen.validate import validate
from relay.schema import (
    FROM_PAYLOAD,
    Alloc,
    Field,
    HostCopy,
    IfNone,
    Lane,
    Layout,
    Scatter,
    Schema,
    Tails,
    TailsKv,
)

FWD, SCHED = Lane.FORWARD, Lane.SCHEDULE


def tokens(**options: Any) -> Field:
    """A forward token field with ``options``."""
    return Field("tokens", lane=FWD, dtype=torch.int64, target="input_ids", **options)


def lens(**options: Any) -> Field:
    """A schedule lengths field with ``options``."""
    return Field("lens", lane=SCHED, dtype=torch.int64, target="seq_lens", **options)


TAILS = Tails(rows="mix_running_indices")

#: (id, the field at fault, its companions, a phrase of the problem, a phrase of the fix)
CASES: list[tuple[str, Field, list[Field], str, str]] = [
    (
        "graph-lazy",
        tokens(graph_written=True, alloc=Alloc.LAZY),
        [],
        "needs alloc=Alloc.EAGER and a fixed dtype",
        "remove alloc=Alloc.LAZY",
    ),
    (
        "graph-from-payload",
        Field(
            "h",
            lane=FWD,
            dtype=FROM_PAYLOAD,
            alloc=Alloc.LAZY,
            target="h",
            graph_written=True,
        ),
        [],
        "needs alloc=Alloc.EAGER and a fixed dtype",
        "give a torch dtype",
    ),
    (
        "graph-optional",
        tokens(graph_written=True, optional=True),
        [],
        "cannot also be optional",
        "remove optional=True",
    ),
    (
        "kept-schedule",
        lens(kept=True),
        [tokens()],
        "on the schedule lane, which no stash writes",
        "remove kept=True",
    ),
    (
        "every-forward-field-kept",
        tokens(kept=True),
        [],
        "stash_partial would write nothing",
        "leave kept=True off",
    ),
    (
        "host-copy-forward",
        tokens(host=HostCopy(stream_ordered=True)),
        [],
        "so it needs lane=Lane.SCHEDULE",
        "remove host=...",
    ),
    (
        "host-copy-of-nothing",
        lens(host=HostCopy()),
        [],
        "HostCopy() declares no host copy",
        'write HostCopy(mirror="seq_lens_cpu")',
    ),
    (
        "tails-forward",
        tokens(tails=TAILS),
        [],
        "needs lane=Lane.SCHEDULE",
        "remove tails",
    ),
    (
        "tails-optional",
        lens(optional=True, tails=TAILS),
        [],
        "cannot be optional",
        "remove optional=True",
    ),
    (
        "tails-rows",
        Field(
            "lens",
            lane=SCHED,
            dtype=torch.int64,
            shape=(2,),
            target="seq_lens",
            tails=TAILS,
        ),
        [],
        "needs shape=() and an integer dtype",
        "dtype=torch.int64",
    ),
    (
        "tails-float",
        Field("lens", lane=SCHED, dtype=torch.float32, target="seq_lens", tails=TAILS),
        [],
        "needs shape=() and an integer dtype",
        "dtype=torch.int64",
    ),
    (
        "tails-host-sum-alone",
        lens(host=HostCopy(sum="seq_lens_sum"), tails=TAILS),
        [],
        "so it needs HostCopy(mirror=...) as well",
        'add mirror="seq_lens_cpu" to the HostCopy',
    ),
    (
        "tails-prefix-without-host-mirror",
        lens(tails=Tails(rows="mix_running_indices", prefix="prefix_lens")),
        [],
        "from the host copy of the published lengths, so it needs host=HostCopy(",
        'add host=HostCopy(mirror="seq_lens_cpu"), or remove prefix',
    ),
    (
        "tails-prefix-not-a-path",
        lens(
            host=HostCopy(mirror="seq_lens_cpu"),
            tails=Tails(rows="mix_running_indices", prefix="prefix lens"),
        ),
        [],
        "Tails(prefix=...) must be a dotted attribute path",
        'write Tails(prefix="prefix_lens")',
    ),
    (
        "tails-kv-not-a-path",
        lens(
            tails=Tails(
                rows="mix_running_indices",
                kv=TailsKv(locations="out_cache_loc", table=7),  # type: ignore[arg-type]
            )
        ),
        [],
        "TailsKv(table=...) must be a dotted attribute path",
        'write TailsKv(table="req_to_token")',
    ),
    (
        "tails-add-negative",
        lens(tails=Tails(rows="mix_running_indices", add=-1)),
        [],
        "Tails(add=...) must be 0 or a positive int",
        "add=0 where they count it",
    ),
    (
        "tails-not-a-path",
        lens(tails=Tails(rows="mix running")),
        [],
        "Tails(rows=...) must be a dotted attribute path",
        'write Tails(rows="mix_running_indices")',
    ),
    (
        "tails-is-a-target",
        lens(tails=Tails(rows="seq_lens")),
        [],
        "Tails(rows=...) 'seq_lens' is also the target of field 'lens'",
        "give the Tails(rows=...) of field 'lens' a batch attribute of its own",
    ),
    (
        "tails-not-a-group",
        lens(tails="mix_running_indices"),
        [],
        "tails must be a Tails(...) or None (got 'mix_running_indices' that is a str)",
        'write tails=Tails(rows="mix_running_indices")',
    ),
    (
        "tails-kv-not-a-group",
        lens(tails=Tails(rows="mix_running_indices", kv="out_cache_loc")),  # type: ignore[arg-type]
        [],
        "Tails(kv=...) must be a TailsKv(locations=..., table=...)",
        'write kv=TailsKv(locations="out_cache_loc", table="req_to_token")',
    ),
    (
        "stream-order-not-a-bool",
        lens(host=HostCopy(mirror="seq_lens_cpu", stream_ordered="yes")),  # type: ignore[arg-type]
        [],
        "HostCopy(stream_ordered=...) must be True or False (got 'yes' that is a str)",
        "write stream_ordered=True, or leave it out",
    ),
    (
        "host-not-a-group",
        lens(host="seq_lens_cpu"),
        [],
        "host must be a HostCopy(...) or None (got 'seq_lens_cpu' that is a str)",
        'write host=HostCopy(mirror="seq_lens_cpu")',
    ),
    (
        "kept-not-bool",
        tokens(kept="yes"),
        [],
        "kept must be True or False",
        "write kept=True",
    ),
]


@pytest.mark.parametrize(
    ("case", "at_fault", "others", "problem", "fix"),
    CASES,
    ids=[case[0] for case in CASES],
)
def test_each_refusal_names_the_field_line_and_fix(
    case: str, at_fault: Field, others: list[Field], problem: str, fix: str
) -> None:
    """One issue, naming the field, the problem and the fix, at the line of the
    declaration at fault: the field's, or the group's inside it that the problem
    names (a ``Tails(...)``, a ``HostCopy(...)``)."""
    schema = Schema(name="BadFutureMap", fields=[*others, at_fault])
    issues = validate(schema, str)
    assert len(issues) == 1, [str(i) for i in issues]
    (issue,) = issues
    assert issue.line == _site_of(at_fault, case)
    assert issue.field == at_fault.name
    assert problem in issue.problem
    assert fix in issue.fix


#: The cases whose problem lies in a group of the field, reported at the group's line.
AT_GROUP = {
    "host-copy-forward": "host",
    "host-copy-of-nothing": "host",
    "tails-forward": "tails",
    "tails-optional": "tails",
    "tails-rows": "tails",
    "tails-float": "tails",
    "tails-host-sum-alone": "tails",
    "tails-prefix-without-host-mirror": "tails",
    "tails-prefix-not-a-path": "tails",
    "tails-kv-not-a-path": "tails.kv",
    "tails-kv-not-a-group": "tails",
    "stream-order-not-a-bool": "host",
    "tails-add-negative": "tails",
    "tails-not-a-path": "tails",
    "tails-is-a-target": "tails",
}


def _site_of(f: Field, case: str) -> int:
    """The line case ``case``'s problem belongs to: the group's it names, else the
    field's."""
    at: Any = f
    for name in AT_GROUP.get(case, "").split("."):
        at = getattr(at, name) if name else at
    line: int = at.declared_at.line
    return line


def test_grouped_options_cannot_be_written_apart() -> None:
    """What the grouped declarations make unwritable: a KV table without its locations,
    a scatter without offsets, a prefix without tails (each a ``TypeError`` where it is
    written)."""
    with pytest.raises(TypeError, match="locations"):
        TailsKv(table="req_to_token")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="offsets"):
        Scatter(lengths="num_draft_tokens")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="rows"):
        Tails(prefix="prefix_lens")  # type: ignore[call-arg]


def test_graph_written_in_a_packed_group_is_refused() -> None:
    """A packed field's buffer is a view of the map's own: it cannot be the engine's."""
    at_fault = Field("a", lane=FWD, dtype=torch.int64, target="a", graph_written=True)
    schema = Schema(
        name="BadFutureMap",
        layout=Layout.PACKED,
        fields=[at_fault, Field("b", lane=FWD, dtype=torch.int64, target="b")],
    )
    (issue,) = validate(schema, str)
    assert issue.line == at_fault.declared_at.line
    assert "Layout.PACKED" in issue.problem and "Layout.SEPARATE" in issue.fix


def test_a_second_tails_field_is_refused_at_its_line() -> None:
    """A map has one resolve_tails: the second declaration names the first."""
    first = lens(tails=TAILS)
    second = Field("more", lane=SCHED, dtype=torch.int64, target="more", tails=TAILS)
    (issue,) = validate(Schema(name="BadFutureMap", fields=[first, second]), str)
    assert issue.line == second.declared_at.line
    assert "also declared on field 'lens'" in issue.problem
    assert "a map has one resolve_tails" in issue.problem


def test_tails_through_an_optional_parent_is_refused() -> None:
    """A mixed batch may lack an optional parent: the tails cannot go through one."""
    at_fault = lens(tails=Tails(rows="spec_info.mix_running_indices"))
    other = Field("t", lane=FWD, dtype=torch.int64, target="spec_info.t")
    schema = Schema(
        name="BadFutureMap",
        fields=[other, at_fault],
        optional_parents={"spec_info": IfNone.SKIP},
    )
    (issue,) = validate(schema, str)
    assert at_fault.tails is not None
    assert issue.line == at_fault.tails.declared_at.line
    assert "goes through the optional parent 'spec_info'" in issue.problem


def test_every_option_together_is_valid() -> None:
    """The options combine where they can: no issue for a schema using them all."""
    schema = Schema(
        name="GoodFutureMap",
        fields=[
            tokens(graph_written=True),
            Field("topk", lane=FWD, dtype=torch.float32, target="topk", kept=True),
            lens(
                graph_written=True,
                host=HostCopy(
                    mirror="seq_lens_cpu", sum="seq_lens_sum", stream_ordered=True
                ),
                tails=Tails(
                    rows="mix_running_indices",
                    kv=TailsKv(locations="out_cache_loc", table="req_to_token"),
                    prefix="prefix_lens",
                ),
            ),
        ],
    )
    assert validate(schema, str) == []
