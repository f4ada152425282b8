"""A scatter laid into a target of another dtype (``Scatter(cast=...)``, Note [Casting
scatters] in relay/runtime.py): a cast that cannot keep every value's kind, and a
target whose fields would lay two dtypes into it, are refused by ``relay generate`` at
the line of the field, with the fix; the casts that keep values generate."""

from __future__ import annotations

import pytest
import torch
from codegen_support import Project, line_of

from relay.codegen import explicit_job, files, plan
from relay.errors import SchemaError
from relay.schema import Field, Lane, Scatter, Schema

PRELUDE = (
    "import torch\n\nfrom relay.schema import Field, Lane, Scatter, Schema\n\n"
    "S = dict(lane=Lane.FORWARD, target='input_ids')\n\n"
)
TOKEN = 'Field("tok", dtype=torch.int64, resolve=Scatter(offsets="starts"), **S),'


def _x(dtype: str, cast: str, after: str = "") -> str:
    """Field ``x``: a scatter of ``dtype`` values declared ``cast=cast``, on one line."""
    extra = f', lengths="n", after="{after}"' if after else ""
    shape = ', shape=("k",)' if after else ""
    return (
        f'Field("x", dtype=torch.{dtype}{shape}, '
        f'resolve=Scatter(offsets="starts", cast={cast}{extra}), **S),'
    )


def _write(project: Project, fields: list[str]) -> None:
    body = "".join(f"        {line}\n" for line in fields)
    text = PRELUDE + 'SCHEMA = Schema(\n    name="CastFutureMap",\n    fields=[\n'
    project.write_schema("bad", text + body + "    ],\n)\n")


def _issues(project: Project, fields: list[str]) -> list[str]:
    _write(project, fields)
    with pytest.raises(SchemaError) as excinfo:
        plan(explicit_job([project.schemas / "bad.py"], project.maps))
    return [str(issue) for issue in excinfo.value.issues]


LOSES = "which loses values (fractions, signs or range) whatever they are"
LOSES_FIX = "or cast the values yourself before the stash"

CASES = {
    "a cast that is no dtype": (
        [_x("int64", '"int32"')],
        "Scatter(cast=...) must be a torch.dtype, the target's (got 'int32' that is a str)",
        "write cast=torch.int32, or leave it out where the target has the field's dtype",
    ),
    "a cast to the field's own dtype": (
        [_x("int64", "torch.int64")],
        "Scatter(cast=torch.int64) names the field's own dtype: nothing would be cast",
        "leave cast out",
    ),
    "a cast torch cannot write": (
        [_x("int64", "torch.uint16")],
        (
            "Scatter(cast=torch.uint16): torch cannot write torch.uint16 values into a "
            "target (NotImplementedError:"
        ),
        "cast to a dtype torch indexes, such as torch.int32",
    ),
    "float into int": (
        [_x("float32", "torch.int32")],
        (
            f"Scatter(cast=torch.int32) would turn the field's torch.float32 values into "
            f"torch.int32, {LOSES}"
        ),
        f"give the field the target's dtype (torch.int32), {LOSES_FIX}",
    ),
    "int into float": (
        [_x("int64", "torch.float32")],
        "would turn the field's torch.int64 values into torch.float32",
        f"give the field the target's dtype (torch.float32), {LOSES_FIX}",
    ),
    "float into a narrower float": (
        [_x("float32", "torch.bfloat16")],
        "would turn the field's torch.float32 values into torch.bfloat16",
        f"give the field the target's dtype (torch.bfloat16), {LOSES_FIX}",
    ),
    "int into bool": (
        [_x("int64", "torch.bool")],
        "would turn the field's torch.int64 values into torch.bool",
        f"give the field the target's dtype (torch.bool), {LOSES_FIX}",
    ),
    "a span of two dtypes, the second cast": (
        [TOKEN, _x("int64", "torch.int32", after="tok")],
        (
            "this field lays torch.int32 values into 'input_ids' after 'tok''s "
            "torch.int64 ones: one target holds one dtype"
        ),
        (
            "give both fields the target's dtype, or Scatter(cast=<the target's dtype>) "
            "to the one whose values are another"
        ),
    ),
    "a span of two dtypes, none cast": (
        [
            TOKEN.replace("int64", "int32"),
            (
                'Field("x", dtype=torch.int64, shape=("k",), resolve=Scatter('
                'offsets="starts", lengths="n", after="tok"), **S),'
            ),
        ],
        (
            "this field lays torch.int64 values into 'input_ids' after 'tok''s "
            "torch.int32 ones: one target holds one dtype"
        ),
        "give both fields the target's dtype, or Scatter(cast=<the target's dtype>)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cast_that_cannot_keep_values_is_refused_at_its_line(
    case: str, project: Project
) -> None:
    """One issue, at the field's line, naming the problem and the fix."""
    fields, problem, fix = CASES[case]
    issues = _issues(project, fields)
    line = line_of(project.schemas / "bad.py", 'Field("x"')
    assert len(issues) == 1, issues
    assert issues[0].startswith(f"schemas/bad.py:{line}: error: CastFutureMap.x: ")
    assert problem in issues[0], issues[0]
    assert f"fix: {fix}" in issues[0], issues[0]


@pytest.mark.parametrize(
    ("fields", "cast"),
    [
        (
            [
                TOKEN.replace("offsets", "cast=torch.int32, offsets"),
                _x("int64", "torch.int32", after="tok"),
            ],
            ".int()",
        ),
        ([_x("int64", "torch.int16")], ".short()"),
        ([_x("int32", "torch.int64")], ".long()"),
        ([_x("bool", "torch.int32")], ".int()"),
        ([_x("float16", "torch.float32")], ".float()"),
    ],
    ids=["vLLM's span", "narrower", "wider", "bool", "wider float"],
)
def test_a_cast_that_keeps_each_values_kind_generates(
    fields: list[str], cast: str, project: Project
) -> None:
    """Integer into integer (wider or narrower: debug mode checks the values) and a
    floating field into a wider floating target generate, each cast spelled as the
    dtype's own tensor method."""
    _write(project, fields)
    (planned,) = plan(explicit_job([project.schemas / "bad.py"], project.maps))
    assert f".index_select(0, indices){cast}" in planned.content


def test_a_scatter_without_a_cast_hashes_as_before_the_option() -> None:
    """``cast`` at its default is not hashed: a schema that declares none keeps the
    hash relay recorded before the option existed, so ``relay generate --check`` after
    an upgrade does not call it changed; declaring one changes it."""

    def schema(scatter: Scatter) -> Schema:
        token = Field(
            "tok", lane=Lane.FORWARD, dtype=torch.int64, target="ids", resolve=scatter
        )
        return Schema("TokFutureMap", [token])

    plain = files.schema_hash(schema(Scatter(offsets="starts")))
    assert files.schema_hash(schema(Scatter(offsets="starts", cast=None))) == plain
    cast = schema(Scatter(offsets="starts", cast=torch.int32))
    assert files.schema_hash(cast) != plain
