"""Counted scatters (``Scatter(lengths=..., after=...)``) that cannot work are refused by ``relay
generate`` at the line of the field, with the fix (Note [Counted scatters] in
relay/runtime.py); the declarations that can work generate."""

from __future__ import annotations

import pytest
from codegen_support import Project, line_of

from relay.codegen import explicit_job, plan
from relay.errors import SchemaError

PRELUDE = (
    "import torch\n\nfrom relay.schema import Field, Lane, Scatter, Schema\n\n"
    "S = dict(lane=Lane.FORWARD, dtype=torch.int64)\n\n"
)
TOKEN = 'Field("tok", target="input_ids", resolve=Scatter(offsets="starts"), **S),'
DRAFTS = (
    'Field("x", shape=(3,), target="input_ids", resolve=Scatter(offsets="starts", '
    'lengths="num_drafts", after="tok"), **S),'
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


def _x(target: str = "u", shape: str = "(3,)", **scatter: str) -> str:
    """Field ``x``, a scatter with the ``Scatter`` options given, on one line."""
    options = ", ".join(
        f"{k}={v!r}" for k, v in {"offsets": "starts", **scatter}.items()
    )
    return (
        f'Field("x", shape={shape}, target="{target}", '
        f"resolve=Scatter({options}), **S),"
    ).replace("'", '"')


CASES = {
    "lengths that are no path": (
        [_x(lengths="n drafts")],
        "Scatter(lengths=...) must be a dotted attribute path of the batch",
        'write Scatter(lengths="num_draft_tokens")',
    ),
    "lengths that a field writes": (
        [
            'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="n"),',
            _x(lengths="n"),
        ],
        "Scatter(lengths=...) 'n' is also the target of field 'tok' (schemas/bad.py:",
        "give the Scatter(lengths=...) of field 'x' a batch attribute of its own",
    ),
    "lengths that are the offsets": (
        [_x(lengths="starts")],
        (
            "Scatter(lengths=...) 'starts' is also the Scatter(offsets=...) of field 'x': "
            "one batch attribute cannot be both (read as start offsets there, read as "
            "counts here)"
        ),
        "give the Scatter(lengths=...) of field 'x' a batch attribute of its own",
    ),
    "lengths that are the slots": (
        [_x(lengths="req_pool_indices")],
        "Scatter(lengths=...) 'req_pool_indices' is also the schema's indices",
        "give the Scatter(lengths=...) of field 'x' a batch attribute of its own",
    ),
    "lengths of one value per row": (
        [_x(shape="()", lengths="n")],
        "Scatter(lengths=...) counts the values of each row, but the row is one value",
        'give the row a width, e.g. shape=("drafts",), or remove lengths=...',
    ),
    "a count named like a payload attribute": (
        [
            (
                'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="t", '
                'source="n"),'
            ),
            _x(lengths="spec.n"),
        ],
        "the stash payload carries the producer's count as 'n'",
        "name the count attribute otherwise, or give that field another source",
    ),
    "a count named like a reserved name": (
        [_x(lengths="spec.indices")],
        "a name the generated module keeps for itself",
        "name the count attribute otherwise",
    ),
    "after a field that is not there": (
        [_x(after="sampled")],
        (
            "Scatter(after=...) must name another scatter field of the schema (got "
            "'sampled'"
        ),
        "name the field whose values come first in each request's span",
    ),
    "after itself": (
        [_x(after="x")],
        "Scatter(after=...) must name another scatter field of the schema (got 'x'",
        "name the field whose values come first in each request's span",
    ),
    "after a field with other offsets": (
        [TOKEN, _x(target="input_ids", offsets="draft_starts", after="tok")],
        "so both scatter into one target from one offsets",
        "give both resolve=Scatter(offsets='starts') and target='input_ids'",
    ),
    "after a field into another target": (
        [TOKEN, _x(target="draft_ids", after="tok")],
        "so both scatter into one target from one offsets",
        "give both resolve=Scatter(offsets='starts') and target='input_ids'",
    ),
    "two fields after one": (
        [
            TOKEN,
            _x(target="input_ids", after="tok").replace('"x"', '"y"'),
            _x(target="input_ids", after="tok"),
        ],
        "after='tok', like field 'y'",
        "lay it after 'y' instead",
    ),
    "a second scatter into a target, not after the first": (
        [TOKEN, _x(target="input_ids")],
        "target 'input_ids' is also where scatter field 'tok' (schemas/bad.py:",
        "lay it after the other with Scatter(after='tok'), or give it another target",
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
            'Field("x", target="i", resolve=Scatter(offsets="s", after="y"), **S),',
            'Field("y", target="i", resolve=Scatter(offsets="s", after="x"), **S),',
        ],
    )
    assert len(issues) == 2, issues
    assert all("leads back to" in issue for issue in issues), issues
    assert all("start the chain at a field without after=" in i for i in issues)


def test_a_token_and_its_counted_drafts_generate(project: Project) -> None:
    """The vLLM layout: a token, then its counted drafts, in one target."""
    _write(project, [TOKEN, DRAFTS.replace("(3,)", '("drafts",)')])
    assert plan(explicit_job([project.schemas / "bad.py"], project.maps))
