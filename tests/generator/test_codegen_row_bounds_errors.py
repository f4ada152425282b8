"""A scatter's batch rows (``Scatter(rows=BatchRows(...))``) that cannot work are refused
by ``relay generate`` at their line, with the fix; the declarations that can work
generate, and hand the rows to the plan (Note [Row-bounded scatters] in
relay/runtime.py)."""

from __future__ import annotations

import pytest
from codegen_support import Project, line_of

from relay.codegen import explicit_job, plan
from relay.errors import SchemaError

PRELUDE = (
    "import torch\n\nfrom relay.schema import BatchRows, Field, Lane, Scatter, Schema\n\n"
    "S = dict(lane=Lane.FORWARD, dtype=torch.int64)\n\n"
)
TOKEN = 'Field("tok", target="input_ids", resolve=Scatter(offsets="starts"), **S),'


def _x(rows: str, after: str | None = None, lengths: str | None = "n") -> str:
    """Field ``x``, counted drafts into ``input_ids`` with ``rows=`` spelled as given."""
    options = 'offsets="starts"'
    options += f', lengths="{lengths}"' if lengths else ""
    options += f', after="{after}"' if after else ""
    return (
        f'Field("x", shape=(3,), target="input_ids", '
        f"resolve=Scatter({options}, rows={rows}), **S),"
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
    "rows that are no BatchRows": (
        [_x('"query_start_loc"')],
        (
            "Scatter(rows=...) must be a BatchRows(starts=..., index=...) or None (got "
            "'query_start_loc' that is a str)"
        ),
        'write rows=BatchRows(starts="query_start_loc"), or leave it out',
    ),
    "starts that are no path": (
        [_x('BatchRows(starts="row starts")')],
        "BatchRows(starts=...) must be a dotted attribute path of the batch",
        'write BatchRows(starts="query_start_loc")',
    ),
    "starts that are the offsets": (
        [_x('BatchRows(starts="starts")')],
        (
            "BatchRows(starts=...) 'starts' is also the Scatter(offsets=...) of field "
            "'x': one batch attribute cannot be both (read as start offsets there, "
            "read as every batch row's start here)"
        ),
        "give the BatchRows(starts=...) of field 'x' a batch attribute of its own",
    ),
    "an index that is the slots": (
        [_x('BatchRows(starts="qsl", index="req_pool_indices")')],
        "BatchRows(index=...) 'req_pool_indices' is also the schema's indices",
        "give the BatchRows(index=...) of field 'x' a batch attribute of its own",
    ),
    "an index that is the counts": (
        [_x('BatchRows(starts="qsl", index="n")')],
        "BatchRows(index=...) 'n' is also the Scatter(lengths=...) of field 'x'",
        "give the BatchRows(index=...) of field 'x' a batch attribute of its own",
    ),
    "rows on a field after another": (
        [TOKEN, _x('BatchRows(starts="qsl")', after="tok")],
        (
            "Scatter(rows=...) bounds each request's whole span, which starts at the "
            "field the chain starts with"
        ),
        "declare rows=BatchRows(...) once, on the scatter field without after=...",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_rows_that_cannot_work_are_refused_at_their_line(
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


@pytest.mark.parametrize("index", ["rows", None], ids=["index", "row-i"])
def test_bounded_scatters_generate_and_hand_their_rows_to_the_plan(
    index: str | None, project: Project
) -> None:
    """Alone (``scatter_at``) and as a span's first field (``span_at``): the plan takes
    ``rows=(batch.<starts>, batch.<index> or None)``, and the batch protocol reads
    both."""
    spelled = f'"{index}"' if index else "None"
    rows = f'BatchRows(starts="qsl", index={spelled})'
    alone = (
        f'Field("x", target="input_ids", resolve=Scatter(offsets="starts", rows={rows}'
        "), **S),"
    )
    drafts = (
        'Field("d", shape=(3,), target="input_ids", resolve=Scatter(offsets="starts", '
        'lengths="n", after="x"), **S),'
    )
    for fields, call in (([alone], "scatter_at"), ([alone, drafts], "span_at")):
        _write(project, fields)
        (module,) = plan(explicit_job([project.schemas / "bad.py"], project.maps))
        text = module.content
        wanted = f"rows=(batch.qsl, {'batch.rows' if index else 'None'})"
        assert f"_rt.{call}(" in text and wanted in text, text
        assert "def qsl(self) -> torch.Tensor: ..." in text
        assert ("def rows(self) -> torch.Tensor: ..." in text) is (index is not None)
