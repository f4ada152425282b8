"""Counted scatters (``lengths=``, ``after=``) that cannot work are refused by ``relay
generate`` at the line of the field, with the fix (Note [Counted scatters] in
relay/runtime.py); the declarations that can work generate."""

from __future__ import annotations

import pytest
from codegen_support import Project, line_of

from relay.codegen import explicit_job, plan
from relay.errors import SchemaError

PRELUDE = (
    "import torch\n\nfrom relay.schema import Field, Lane, Resolve, Schema\n\n"
    "S = dict(resolve=Resolve.SCATTER, lane=Lane.FORWARD, dtype=torch.int64)\n\n"
)
TOKEN = 'Field("tok", target="input_ids", offsets="starts", **S),'
DRAFTS = (
    'Field("x", shape=(3,), target="input_ids", offsets="starts", '
    'lengths="num_drafts", after="tok", **S),'
)


def _write(project: Project, fields: list[str]) -> None:
    body = "".join(f"        {line}\n" for line in fields)
    text = PRELUDE + 'SCHEMA = Schema(\n    name="BadFutureMap",\n    fields=[\n'
    project.write_schema("bad", text + body + "    ],\n)\n")


def _issues(project: Project, fields: list[str]) -> list[str]:
    _write(project, fields)
    with pytest.raises(SchemaError) as excinfo:
        plan(explicit_job([project.schemas / "bad.py"], project.maps))
    return [str(issue) for issue in excinfo.value.issues]


CASES = {
    "lengths on a gather": (
        [
            'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="t"),',
            (
                'Field("x", lane=Lane.FORWARD, dtype=torch.int64, shape=(3,), target="u", '
                'lengths="n"),'
            ),
        ],
        "lengths belongs to a scatter, but resolve is Resolve.GATHER",
        "add resolve=Resolve.SCATTER with offsets=..., or remove lengths=...",
    ),
    "after on a gather": (
        [
            TOKEN,
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="u", after="tok"),',
        ],
        "after belongs to a scatter, but resolve is Resolve.GATHER",
        "add resolve=Resolve.SCATTER with offsets=..., or remove after=...",
    ),
    "lengths that are no path": (
        [
            (
                'Field("x", shape=(3,), target="u", offsets="starts", lengths="n drafts", '
                "**S),"
            )
        ],
        "lengths must be a dotted attribute path of the batch",
        'write lengths="num_draft_tokens", or leave it out',
    ),
    "lengths that a field writes": (
        [
            'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="n"),',
            'Field("x", shape=(3,), target="u", offsets="starts", lengths="n", **S),',
        ],
        "lengths='n' is also where a field resolves to, or the offsets",
        "read lengths from a batch attribute no field writes",
    ),
    "lengths that are the offsets": (
        [
            (
                'Field("x", shape=(3,), target="u", offsets="starts", lengths="starts", '
                "**S),"
            )
        ],
        "lengths='starts' is also where a field resolves to, or the offsets",
        "read lengths from a batch attribute no field writes",
    ),
    "lengths of one value per row": (
        ['Field("x", target="u", offsets="starts", lengths="n", **S),'],
        "lengths counts the values of each row, but the row is one value",
        'give the row a width, e.g. shape=("drafts",), or remove lengths=...',
    ),
    "a count named like a payload attribute": (
        [
            (
                'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="t", '
                'source="n"),'
            ),
            (
                'Field("x", shape=(3,), target="u", offsets="starts", lengths="spec.n", '
                "**S),"
            ),
        ],
        "the stash payload carries the producer's count as 'n'",
        "name the count attribute otherwise, or give that field another source",
    ),
    "a count named like a reserved name": (
        [
            (
                'Field("x", shape=(3,), target="u", offsets="starts", '
                'lengths="spec.indices", **S),'
            )
        ],
        "a name the generated module keeps for itself",
        "name the count attribute otherwise",
    ),
    "after a field that is not there": (
        ['Field("x", shape=(3,), target="u", offsets="starts", after="sampled", **S),'],
        "after must name another scatter field of the schema (got 'sampled'",
        "name the field whose values come first in each request's span",
    ),
    "after itself": (
        ['Field("x", shape=(3,), target="u", offsets="starts", after="x", **S),'],
        "after must name another scatter field of the schema (got 'x'",
        "name the field whose values come first in each request's span",
    ),
    "after a field with other offsets": (
        [
            TOKEN,
            (
                'Field("x", shape=(3,), target="input_ids", offsets="draft_starts", '
                'after="tok", **S),'
            ),
        ],
        "so both scatter into one target from one offsets",
        "give both resolve=Resolve.SCATTER, target='input_ids' and offsets='starts'",
    ),
    "after a field into another target": (
        [
            TOKEN,
            (
                'Field("x", shape=(3,), target="draft_ids", offsets="starts", after="tok", '
                "**S),"
            ),
        ],
        "so both scatter into one target from one offsets",
        "give both resolve=Resolve.SCATTER, target='input_ids' and offsets='starts'",
    ),
    "two fields after one": (
        [
            TOKEN,
            (
                'Field("y", shape=(3,), target="input_ids", offsets="starts", after="tok", '
                "**S),"
            ),
            (
                'Field("x", shape=(3,), target="input_ids", offsets="starts", after="tok", '
                "**S),"
            ),
        ],
        "after='tok', like field 'y'",
        "lay it after 'y' instead",
    ),
    "a second scatter into a target, not after the first": (
        [TOKEN, 'Field("x", shape=(3,), target="input_ids", offsets="starts", **S),'],
        "target 'input_ids' is also the target of field 'tok'",
        "give field 'x' another target",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_counted_scatter_that_cannot_work_is_refused_at_its_line(
    case: str, project: Project
) -> None:
    """One issue, at the field's line, naming the problem and the fix."""
    fields, problem, fix = CASES[case]
    issues = _issues(project, fields)
    line = line_of(project.schemas / "bad.py", 'Field("x"')
    assert len(issues) == 1, issues
    assert issues[0].startswith(f"schemas/bad.py:{line}: error: BadFutureMap.x: ")
    assert problem in issues[0], issues[0]
    assert f"fix: {fix}" in issues[0], issues[0]


def test_a_cycle_of_after_is_refused_at_each_field(project: Project) -> None:
    """Two fields each after the other: neither has a place to start from."""
    issues = _issues(
        project,
        [
            'Field("x", target="i", offsets="s", after="y", **S),',
            'Field("y", target="i", offsets="s", after="x", **S),',
        ],
    )
    assert len(issues) == 2, issues
    assert all("leads back to" in issue for issue in issues), issues
    assert all("start the chain at a field without after=" in i for i in issues)


def test_a_token_and_its_counted_drafts_generate(project: Project) -> None:
    """The vLLM layout: a token, then its counted drafts, in one target."""
    _write(project, [TOKEN, DRAFTS.replace("(3,)", '("drafts",)')])
    assert plan(explicit_job([project.schemas / "bad.py"], project.maps))
