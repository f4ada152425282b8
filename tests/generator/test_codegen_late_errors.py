"""Refusals of graph-written, kept, stream-ordered and late-bound-tail declarations: each
combination that cannot work is reported at the field's line, with the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from relay.codegen.validate import validate
from relay.schema import FROM_PAYLOAD, Alloc, Field, IfNone, Lane, Layout, Schema

FWD, SCHED = Lane.FORWARD, Lane.SCHEDULE


def tokens(**options: Any) -> Field:
    """A forward token field with ``options``."""
    return Field("tokens", lane=FWD, dtype=torch.int64, target="input_ids", **options)


def lens(**options: Any) -> Field:
    """A schedule lengths field with ``options``."""
    return Field("lens", lane=SCHED, dtype=torch.int64, target="seq_lens", **options)


TAILS = {"tails": "mix_running_indices"}

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
        "stream-ordered-forward",
        tokens(stream_ordered=True),
        [],
        "a forward-lane field has no fence",
        "remove stream_ordered=True",
    ),
    (
        "tails-forward",
        tokens(**TAILS),
        [],
        "needs lane=Lane.SCHEDULE",
        "remove tails",
    ),
    (
        "tails-optional",
        lens(optional=True, **TAILS),
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
            **TAILS,
        ),
        [],
        "needs shape=() and an integer dtype",
        "dtype=torch.int64",
    ),
    (
        "tails-float",
        Field("lens", lane=SCHED, dtype=torch.float32, target="seq_lens", **TAILS),
        [],
        "needs shape=() and an integer dtype",
        "dtype=torch.int64",
    ),
    (
        "tails-host-sum-alone",
        lens(host_sum="seq_lens_sum", **TAILS),
        [],
        "needs host_mirror as well",
        'add host_mirror="seq_lens_cpu"',
    ),
    (
        "tails-kv-alone",
        lens(tails_kv="out_cache_loc", **TAILS),
        [],
        "go together",
        "write both",
    ),
    (
        "tails-kv-without-tails",
        lens(tails_kv="out_cache_loc", tails_kv_table="req_to_token"),
        [],
        "which needs tails=...",
        'add tails="mix_running_indices"',
    ),
    (
        "tails-prefix-without-tails",
        lens(tails_prefix="prefix_lens", host_mirror="seq_lens_cpu"),
        [],
        "host prefix lengths in resolve_tails, which needs tails=...",
        "or remove tails_prefix",
    ),
    (
        "tails-prefix-without-host-mirror",
        lens(tails_prefix="prefix_lens", **TAILS),
        [],
        "from the host copy of the published lengths, so it needs host_mirror",
        'add host_mirror="seq_lens_cpu", or remove tails_prefix',
    ),
    (
        "tails-prefix-not-a-path",
        lens(tails_prefix="prefix lens", host_mirror="seq_lens_cpu", **TAILS),
        [],
        "tails_prefix must be a dotted attribute path",
        'write tails_prefix="prefix_lens"',
    ),
    (
        "tails-add-without-tails",
        lens(tails_add=0),
        [],
        "which needs tails=...",
        "or remove tails_add",
    ),
    (
        "tails-add-negative",
        lens(tails_add=-1, **TAILS),
        [],
        "tails_add must be 0 or a positive int",
        "tails_add=0 where they count it",
    ),
    (
        "tails-not-a-path",
        lens(tails="mix running"),
        [],
        "tails must be a dotted attribute path",
        'write tails="mix_running_indices"',
    ),
    (
        "tails-is-a-target",
        lens(tails="seq_lens"),
        [],
        "is also where field 'lens' resolves",
        "give tails an attribute of its own",
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
    ("at_fault", "others", "problem", "fix"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_each_refusal_names_the_field_line_and_fix(
    at_fault: Field, others: list[Field], problem: str, fix: str
) -> None:
    """One issue, at the faulty field's line, naming the field, the problem and the fix."""
    schema = Schema(name="BadFutureMap", fields=[*others, at_fault])
    issues = validate(schema, str)
    assert len(issues) == 1, [str(i) for i in issues]
    (issue,) = issues
    assert issue.line == at_fault.declared_at.line
    assert issue.field == at_fault.name
    assert problem in issue.problem
    assert fix in issue.fix


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
    first = lens(**TAILS)
    second = Field("more", lane=SCHED, dtype=torch.int64, target="more", **TAILS)
    (issue,) = validate(Schema(name="BadFutureMap", fields=[first, second]), str)
    assert issue.line == second.declared_at.line
    assert "also declared on field 'lens'" in issue.problem
    assert "a map has one resolve_tails" in issue.problem


def test_tails_through_an_optional_parent_is_refused() -> None:
    """A mixed batch may lack an optional parent: the tails cannot go through one."""
    at_fault = lens(tails="spec_info.mix_running_indices")
    other = Field("t", lane=FWD, dtype=torch.int64, target="spec_info.t")
    schema = Schema(
        name="BadFutureMap",
        fields=[other, at_fault],
        optional_parents={"spec_info": IfNone.SKIP},
    )
    (issue,) = validate(schema, str)
    assert issue.line == at_fault.declared_at.line
    assert "goes through an optional parent" in issue.problem


def test_every_option_together_is_valid() -> None:
    """The options combine where they can: no issue for a schema using them all."""
    schema = Schema(
        name="GoodFutureMap",
        fields=[
            tokens(graph_written=True),
            Field("topk", lane=FWD, dtype=torch.float32, target="topk", kept=True),
            lens(
                graph_written=True,
                stream_ordered=True,
                host_mirror="seq_lens_cpu",
                host_sum="seq_lens_sum",
                tails="mix_running_indices",
                tails_kv="out_cache_loc",
                tails_kv_table="req_to_token",
                tails_prefix="prefix_lens",
            ),
        ],
    )
    assert validate(schema, str) == []
