"""Owners with member rows (``Schema(owners=Members(requests=, tail=))``, Note [Member
rows] in relay/debug/owners.py): refused where it cannot work, at the line of the
declaration, with the fix; generated, the tail and the requests are read in debug mode
only, and each row past the requests is named by its leader's request."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from relay import RelayDebugError
from relay.codegen.validate import validate
from relay.schema import (
    Field,
    IfNone,
    Lane,
    Members,
    Scatter,
    ScheduleSlots,
    Schema,
    Tails,
)
from relay.testing import load_map_class
from relay.testing.sglang_reference import Req, beam_rows


def tokens(**options: Any) -> Field:
    """The forward token field of plain decoding."""
    options.setdefault("target", "input_ids")
    return Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, **options)


def lens(**options: Any) -> Field:
    """A schedule lengths field."""
    return Field(
        "lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens", **options
    )


BEAM = {"owners": Members("reqs", tail="beam_tail")}

#: (id, schema options, fields, a phrase of the problem, a phrase of the fix, where
#: the issue is reported: "members" (the Members), "slots" (the ScheduleSlots) or a
#: field's name)
REFUSED: list[tuple[str, dict[str, Any], list[Field], str, str, str]] = [
    (
        "requests-not-a-path",
        {"owners": Members("req s", tail="beam_tail")},
        [tokens()],
        (
            "Members(requests=...) must be a dotted attribute path of the batch such as "
            "'reqs' (got 'req s'"
        ),
        'write requests="reqs"',
        "members",
    ),
    (
        "tail-not-a-path",
        {"owners": Members("reqs", tail=3)},
        [tokens()],
        (
            "Members(tail=...) must be a dotted attribute path of the batch such as "
            "'beam_tail' (got 3"
        ),
        'write tail="beam_tail"',
        "members",
    ),
    (
        "tail-is-the-requests",
        {"owners": Members("reqs", tail="reqs")},
        [tokens()],
        "Members(tail=...) 'reqs' is also the schema's Members(requests=...)",
        "give Members(tail=...) a batch attribute of its own",
        "members",
    ),
    (
        "requests-are-the-slots",
        {"owners": Members("req_pool_indices", tail="beam_tail")},
        [tokens()],
        "Members(requests=...) 'req_pool_indices' is also the schema's indices",
        "give Members(requests=...) a batch attribute of its own",
        "members",
    ),
    (
        "tail-is-a-target",
        {"owners": Members("reqs", tail="input_ids")},
        [tokens()],
        "target 'input_ids' is also the schema's Members(tail=...)",
        "give the target of field 'tokens' a batch attribute of its own",
        "tokens",
    ),
    (
        "tail-through-an-optional-parent",
        {
            "owners": Members("reqs", tail="spec_info.beam_tail"),
            "optional_parents": {"spec_info": IfNone.SKIP},
        },
        [tokens(target="spec_info.ids")],
        (
            "Members(tail=...) 'spec_info.beam_tail' goes through the optional parent "
            "'spec_info'"
        ),
        "outside optional_parents",
        "schema",
    ),
    (
        "beside-decode-tails",
        BEAM,
        [tokens(), lens(tails=Tails(rows="mix_running_indices"))],
        (
            "field 'lens' binds tails=Tails(...), whose decode rows are the batch's last "
            "requests: those would be member rows"
        ),
        'name the owners by a path (owners="reqs")',
        "members",
    ),
    (
        "beside-a-scatter",
        BEAM,
        [tokens(target="flat_ids", resolve=Scatter(offsets="starts"))],
        (
            "field 'tokens' resolves by a Scatter(...), whose refusals name each request "
            "with debug off too"
        ),
        'name the owners by a path (owners="req_ids")',
        "members",
    ),
    (
        "schedule-owners",
        {"schedule": ScheduleSlots(owners=Members("reqs", tail="beam_tail"))},
        [tokens(), lens()],
        "ScheduleSlots(owners=...) must be a dotted attribute path",
        'write owners="rids"',
        "slots",
    ),
]


def _site(schema: Schema, where: str) -> int:
    """The line ``where`` names (see ``REFUSED``)."""
    if where == "schema":
        return schema.declared_at.line
    if where == "members":
        assert isinstance(schema.owners, Members)
        return schema.owners.declared_at.line
    if where == "slots":
        assert schema.schedule is not None
        return schema.schedule.declared_at.line
    return next(f for f in schema.fields if f.name == where).declared_at.line


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
    schema = Schema(name="BeamFutureMap", fields=fields, **options)
    issues = validate(schema, str)
    assert len(issues) == 1, [str(i) for i in issues]
    (issue,) = issues
    assert issue.line == _site(schema, where), str(issue)
    assert problem in issue.problem, issue.problem
    assert fix in issue.fix, issue.fix


def test_members_beside_a_schedule_lane_are_accepted() -> None:
    """A map with member rows may relay schedule fields too: their resolves name the
    same batch's rows."""
    schema = Schema(name="BeamFutureMap", fields=[tokens(), lens()], **BEAM)
    assert validate(schema, str) == []


def _beam_map() -> type[Any]:
    schema = Schema(name="BeamFutureMap", fields=[tokens()], **BEAM)
    assert validate(schema, str) == []
    return load_map_class(schema)


def test_debug_off_reads_neither_the_requests_nor_the_tail() -> None:
    """Debug off, a batch without ``reqs`` or ``beam_tail`` resolves: the owners are
    read in debug mode only."""
    relay = _beam_map()("cpu", 6)
    relay.stash(torch.tensor([1, 4]), relay_payload(relay, [6, 8]))
    batch = SimpleNamespace(req_pool_indices=torch.tensor([1, 4]), input_ids=None)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [6, 8]


def relay_payload(relay: Any, tokens: list[int]) -> Any:
    """The map's payload class with ``tokens``."""
    module = __import__(type(relay).__module__, fromlist=["BeamPayload"])
    return module.BeamPayload(tokens=torch.tensor(tokens))


def test_debug_mode_names_a_member_row_by_its_leader() -> None:
    """A member row written for another request is named as a member row of the
    leader the tail gives it."""
    relay = _beam_map()("cpu", 6, debug=True)
    relay.stash(torch.tensor([1, 2]), relay_payload(relay, [6, 7]), owners=["a", "b"])
    relay.stash(torch.tensor([4]), relay_payload(relay, [8]), owners=["c"])
    rows, tail = beam_rows([1, 2], {1: [4]})
    batch = SimpleNamespace(
        req_pool_indices=torch.tensor(rows),
        reqs=[Req("a"), Req("b")],
        beam_tail=tail,
        input_ids=None,
    )
    with pytest.raises(
        RelayDebugError,
        match=r"BeamFutureMap.tokens: slot 4: resolve_future reads it for a member row "
        r"of request 'a' \(position 2\), but stash wrote it for request 'c'",
    ):
        relay.resolve_future(batch)
