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
    "    Field, IfNone, Lane, Resolve, Schema, TargetShape, Unwritten,\n"
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
    "scatter without offsets": (
        (
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="x", '
            "resolve=Resolve.SCATTER),"
        ),
        "resolve=Resolve.SCATTER needs offsets",
        'add offsets="query_start_loc"',
    ),
    "scatter on the schedule lane": (
        (
            'Field("x", lane=Lane.SCHEDULE, dtype=torch.int64, target="x", '
            'resolve=Resolve.SCATTER, offsets="starts"),'
        ),
        "resolve=Resolve.SCATTER writes a required forward-lane field",
        "make the field a required forward-lane field with a target",
    ),
    "scatter of an optional field": (
        (
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="flat", '
            'resolve=Resolve.SCATTER, offsets="starts", optional=True),'
        ),
        "resolve=Resolve.SCATTER writes a required forward-lane field",
        "make the field a required forward-lane field with a target",
    ),
    "offsets that a field writes": (
        (
            'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="flat", '
            'resolve=Resolve.SCATTER, offsets="input_ids"),'
        ),
        "offsets='input_ids' is also where 'tokens' resolves to",
        "read offsets from a batch attribute no field writes",
    ),
    "offsets without a scatter": (
        'Field("x", lane=Lane.FORWARD, dtype=torch.int64, target="x", offsets="at"),',
        "offsets names where scattered rows start, but resolve is Resolve.GATHER",
        "add resolve=Resolve.SCATTER, or remove offsets=...",
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
        "a schedule resolve hands its value whatever the batch holds",
    ),
    "seeding a schedule-lane-only map": (
        "    seeded=True,\n",
        [LENS],
        "seeded=True makes seed(indices, payload) hand rows to the next resolve_future",
    ),
    "owners that a field writes": (
        '    owners="input_ids",\n',
        [TOKENS],
        "owners='input_ids' is also where 'tokens' resolves to",
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
        "owners='spec_info.rids' goes through an optional parent",
    ),
    "owners that are no path": (
        '    owners="request ids",\n',
        [TOKENS],
        "owners must be a dotted attribute path of the batch",
    ),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_a_schema_option_that_cannot_work_is_refused_at_the_schema(
    case: str, project: Project
) -> None:
    options, fields, problem = SCHEMA_CASES[case]
    issues = _issues(project, fields, options)
    assert len(issues) == 1, issues
    line = line_of(project.schemas / "bad.py", "SCHEMA = Schema(")
    if "lens" in fields[-1] and "spec_info.lens" in fields[-1]:
        line = line_of(project.schemas / "bad.py", 'Field("lens"')
    assert issues[0].startswith(f"schemas/bad.py:{line}: error: BadFutureMap")
    assert problem in issues[0] and "fix: " in issues[0]
