"""Schema options of the packed layout and malformed shapes: located errors, never crashes."""

from __future__ import annotations

import attrs
import pytest
import torch
from codegen_support import Project, line_of
from test_codegen_errors import SRC, one_issue

from relay.codegen.layout import packed_groups
from relay.schema import Alloc, Field, Lane, Layout, Resolve, Schema


def _module(project: Project, layout: str, fields: list[str]) -> None:
    body = "".join(f"        {line}\n" for line in fields)
    project.write_schema(
        "bad",
        "import torch\n\nfrom relay.schema import Field, Lane, Layout, Schema\n\n"
        f"SCHEMA = Schema(\n    name='BadFutureMap',\n    layout={layout},\n    fields=[\n"
        + body
        + "    ],\n)\n",
    )


def test_a_layout_that_is_not_a_layout(project: Project) -> None:
    """layout='packed' (a str) is reported at the schema with both spellings of the fix."""
    _module(project, "'packed'", ['Field("a", lane=Lane.FORWARD, dtype=torch.int64),'])
    line = line_of(project.schemas / "bad.py", "SCHEMA = Schema(")
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap: layout must be Layout.SEPARATE or Layout.PACKED "
        "(got 'packed' that is a str)\n"
        "    fix: write layout=Layout.PACKED (fields of one dtype share a buffer) or leave it out"
    )


def test_a_packed_layout_that_packs_nothing(project: Project) -> None:
    """Two gathered fields of different dtypes, and an optional one: nothing shares a buffer."""
    _module(
        project,
        "Layout.PACKED",
        [
            'Field("a", lane=Lane.FORWARD, dtype=torch.int64, target="a"),',
            'Field("b", lane=Lane.FORWARD, dtype=torch.float32, target="b"),',
            'Field("c", lane=Lane.FORWARD, dtype=torch.int64, target="c", optional=True),',
        ],
    )
    line = line_of(project.schemas / "bad.py", "SCHEMA = Schema(")
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap: layout=Layout.PACKED packs the eager, required, "
        "gathered forward-lane fields of one dtype into one buffer, but no two such fields "
        "share a dtype, so nothing would be packed\n"
        "    fix: leave layout out (Layout.SEPARATE), or give two such fields one dtype"
    )


@pytest.mark.parametrize("spelled", ["None", "{'topk'}"])
def test_a_shape_that_is_no_sequence_is_reported_with_its_field(
    project: Project, spelled: str
) -> None:
    """shape=None or a set reaches validation (the converter keeps it) and names the field."""
    project.schema_module(
        "bad",
        [f'Field("probs", lane=Lane.FORWARD, dtype=torch.float32, shape={spelled}),'],
    )
    line = line_of(project.schemas / "bad.py", '"probs"')
    got = "None that is a NoneType" if spelled == "None" else "{'topk'} that is a set"
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.probs: shape must be a tuple of dims such as "
        f'("topk",) or (8,) (got {got})\n'
        '    fix: write shape=("topk",), shape=(8,) or shape=()'
    )


def test_shape_converter_spellings() -> None:
    """A str or int is one dim, a list becomes a tuple, anything else is kept for validation."""

    def shape(value: object) -> object:
        return Field("f", lane=Lane.FORWARD, dtype=torch.int64, shape=value).shape  # type: ignore[arg-type]

    assert shape("topk") == ("topk",)
    assert shape(4) == (4,)
    assert shape(["topk", 2]) == ("topk", 2)
    assert shape(None) is None


def test_packed_groups_follow_declaration_order_and_skip_what_stays_separate() -> None:
    """Columns start where the previous field's end; lazy, optional, placeholder, targetless
    and single-dtype fields are not packed."""
    schema = Schema(
        "P",
        layout=Layout.PACKED,
        fields=[
            Field("a", lane=Lane.FORWARD, dtype=torch.int64, target="a"),
            Field(
                "b", lane=Lane.FORWARD, dtype=torch.int64, shape=("k", 3), target="b"
            ),
            Field("c", lane=Lane.FORWARD, dtype=torch.int64, shape=(2,), target="c"),
            Field(
                "lazy",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                alloc=Alloc.LAZY,
                target="l",
            ),
            Field(
                "opt", lane=Lane.FORWARD, dtype=torch.int64, optional=True, target="o"
            ),
            Field(
                "ph",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                target="p",
                resolve=Resolve.PLACEHOLDER,
            ),
            Field("none", lane=Lane.FORWARD, dtype=torch.int64),
            Field("alone", lane=Lane.FORWARD, dtype=torch.float32, target="f"),
            Field("sched", lane=Lane.SCHEDULE, dtype=torch.int64, target="s"),
        ],
    )
    (group,) = packed_groups(schema)
    assert group.dtype == torch.int64
    assert [(m.field.name, m.start, m.width) for m in group.members] == [
        ("a", "0", "1"),
        ("b", "1", "k * 3"),
        ("c", "1 + k * 3", "2"),
    ]
    assert group.columns == "1 + k * 3 + 2"
    assert packed_groups(attrs.evolve(schema, layout=Layout.SEPARATE)) == ()
