"""The hand-over declarations that cannot work are refused by ``relay generate`` at
their line, with the fix: rows read as zeros, flat targets, scatters, optional
parents, seeding and owners."""

from __future__ import annotations

import pytest
from codegen_support import Project, line_of

from relay.codegen import explicit_job, plan
from relay.errors import SchemaError

PRELUDE = (
    "import torch\n\n"
    "from relay.schema import (\n"
    "    Field, IfNone, Lane, Resolve, Scatter, Schema, TargetShape, Unwritten,\n"
    ")\n\n"
)
TOKENS = 'Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),'
LENS = 'Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens"),'


def _issues(project: Project, fields: list[str], options: str = "") -> list[str]:
    body = "".join(f"        {line}\n" for line in fields)
    text = (
        PRELUDE
        + f'SCHEMA = Schema(\n    name="BadFutureMap",\n{options}    fields=[\n'
        + body
        + "    ],\n)\n"
    )
    project.write_schema("bad", text)
    with pytest.raises(SchemaError) as excinfo:
        plan(explicit_job([project.schemas / "bad.py"], project.maps))
    return [str(issue) for issue in excinfo.value.issues]


FIELD_CASES = {
    "unwritten of another type": (
        'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="x", unwritten="zeros"),',
        "unwritten must be Unwritten.REFUSED or Unwritten.ZEROS",
        "write unwritten=Unwritten.ZEROS",
    ),
    "flat target of a placeholder": (
        (
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="x", '
            "resolve=Resolve.PLACEHOLDER, target_shape=TargetShape.FLAT),"
        ),
        "target_shape=TargetShape.FLAT flattens gathered rows",
        "leave target_shape out",
    ),
    "flat target of one value per slot": (
        (
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="x", '
            "target_shape=TargetShape.FLAT),"
        ),
        "but the field's rows have none (shape=())",
        "leave target_shape out: one value per slot is already flat",
    ),
    "scatter from offsets that are no path": (
        (
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="x", '
            'resolve=Scatter(offsets="start at")),'
        ),
        "Scatter(offsets=...) must be a dotted attribute path of the batch",
        'write Scatter(offsets="query_start_loc")',
    ),
    "scatter on the schedule lane": (
        (
            'Field("x", lane=Lane.SCHEDULE, dtype=torch.int64, target="x", '
            'resolve=Scatter(offsets="starts")),'
        ),
        (
            "resolve=Scatter(...) writes a forward-lane field into its target, "
            "required or kept when left out"
        ),
        (
            "make the field a forward-lane field with a target, required or "
            "optional=True with kept=True"
        ),
    ),
    "scatter of an optional field": (
        (
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="flat", '
            'resolve=Scatter(offsets="starts"), optional=True),'
        ),
        (
            "resolve=Scatter(...) writes a forward-lane field into its target, "
            "required or kept when left out"
        ),
        (
            "make the field a forward-lane field with a target, required or "
            "optional=True with kept=True"
        ),
    ),
    "offsets that a field writes": (
        (
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="flat", '
            'resolve=Scatter(offsets="input_ids")),'
        ),
        "Scatter(offsets=...) 'input_ids' is also the target of field 'tokens'",
        "give the Scatter(offsets=...) of field 'x' a batch attribute of its own",
    ),
}


@pytest.mark.parametrize("case", sorted(FIELD_CASES))
def test_a_field_declaration_that_cannot_work_is_refused_at_its_line(
    case: str, project: Project
) -> None:
    declaration, problem, fix = FIELD_CASES[case]
    issues = _issues(project, [TOKENS, declaration])
    line = line_of(project.schemas / "bad.py", 'Field("x"')
    assert len(issues) == 1, issues
    assert issues[0].startswith(f"schemas/bad.py:{line}: error: BadFutureMap.x: ")
    assert problem in issues[0] and f"fix: {fix}" in issues[0]


SCHEMA_CASES = {
    "an optional parent no path goes through": (
        '    optional_parents={"draft": IfNone.SKIP},\n',
        [TOKENS],
        "optional_parents names 'draft', which is the first part of no target path",
        "SCHEMA = Schema(",
    ),
    "a schedule target under an optional parent": (
        '    optional_parents={"spec_info": IfNone.SKIP},\n',
        [
            TOKENS,
            (
                'Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64, '
                'target="spec_info.lens"),'
            ),
        ],
        (
            "target 'spec_info.lens' goes through the optional parent 'spec_info'; it is "
            "written whatever the batch holds"
        ),
        'Field("lens"',
    ),
    "seeding a schedule-lane-only map": (
        "    seeded=True,\n",
        [LENS],
        "seeded=True makes seed(indices, payload) hand rows to the next resolve_future",
        "SCHEMA = Schema(",
    ),
    "owners that a field writes": (
        '    owners="input_ids",\n',
        [TOKENS],
        "target 'input_ids' is also the schema's owners (schemas/bad.py:",
        'Field("tokens"',
    ),
    "owners through an optional parent": (
        '    owners="spec_info.rids",\n    optional_parents={"spec_info": IfNone.SKIP},\n',
        [
            TOKENS,
            (
                'Field("draft", lane=Lane.FORWARD, dtype=torch.int64, '
                'target="spec_info.draft"),'
            ),
        ],
        (
            "owners 'spec_info.rids' goes through the optional parent 'spec_info'; it is "
            "read as request ids whatever the batch holds"
        ),
        "SCHEMA = Schema(",
    ),
    "owners that are no path": (
        '    owners="request ids",\n',
        [TOKENS],
        "owners must be a dotted attribute path of the batch",
        "SCHEMA = Schema(",
    ),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_a_schema_option_that_cannot_work_is_refused_at_the_schema(
    case: str, project: Project
) -> None:
    """One issue, at the line of the declaration that comes second: the schema's
    where its option meets what was declared before, else the field's."""
    options, fields, problem, at = SCHEMA_CASES[case]
    issues = _issues(project, fields, options)
    assert len(issues) == 1, issues
    line = line_of(project.schemas / "bad.py", at)
    assert issues[0].startswith(f"schemas/bad.py:{line}: error: BadFutureMap")
    assert problem in issues[0] and "fix: " in issues[0]
