"""Bad schemas: each mistake is reported with file, line, schema, field, expectation and fix."""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable

import pytest
import torch
from codegen_support import Project, Run, line_of

from relay.codegen import explicit_job, plan
from relay.errors import SchemaError, SchemaImportError

SRC = "schemas/bad.py"


def schema_error(project: Project) -> SchemaError:
    """Plan ``schemas/bad.py`` of ``project`` through the API and return its SchemaError."""
    job = explicit_job([project.schemas / "bad.py"], project.maps)
    with pytest.raises(SchemaError) as excinfo:
        plan(job)
    return excinfo.value


def one_issue(project: Project) -> str:
    """The text of the only issue of ``schemas/bad.py``, checked against the error's summary."""
    error = schema_error(project)
    messages = [str(issue) for issue in error.issues]
    assert len(messages) == 1, messages
    assert str(error) == messages[0] + "\ninvalid schema: 1 problem in 1 schema module"
    return messages[0]


def import_error(project: Project, stem: str) -> str:
    """The only problem of ``schemas/<stem>.py``, a module that does not load."""
    job = explicit_job([project.schemas / f"{stem}.py"], project.maps)
    with pytest.raises(SchemaImportError) as excinfo:
        plan(job)
    (issue,) = excinfo.value.issues
    return str(issue)


GOOD = 'Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),'


def test_duplicate_field_name(project: Project) -> None:
    """A field declared twice is reported at the repeat, pointing at the first declaration."""
    path = project.schema_module(
        "bad",
        [
            GOOD,
            'Field("tokens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens"),',
        ],
    )
    first = line_of(path, "input_ids")
    second = line_of(path, "seq_lens")
    assert one_issue(project) == (
        f"{SRC}:{second}: error: BadFutureMap.tokens: duplicate field name 'tokens'; it is first "
        f"declared at {SRC}:{first}\n"
        "    fix: rename one of them, or delete the repeated declaration"
    )


def test_field_name_not_an_identifier(project: Project) -> None:
    """A field name that is not a Python identifier is refused with an example of a good one."""
    path = project.schema_module(
        "bad", ['Field("2x", lane=Lane.FORWARD, dtype=torch.int64),']
    )
    line = line_of(path, '"2x"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.2x: field name must be a Python identifier "
        "(got '2x' that is a str)\n"
        '    fix: use letters, digits and underscores, not starting with a digit, e.g. "topk_p"'
    )


def test_field_name_is_a_keyword(project: Project) -> None:
    """A field named after a Python keyword is refused with a rename suggestion."""
    path = project.schema_module(
        "bad", ['Field("class", lane=Lane.FORWARD, dtype=torch.int64),']
    )
    line = line_of(path, '"class"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.class: field name 'class' is a Python keyword\n"
        '    fix: rename it, e.g. "class_"'
    )


@pytest.mark.parametrize(
    "name",
    [
        "stash",
        "publish",
        "invalidate",
        "release",
        "resolve_future",
        "resolve_seq_lens_cpu",
        "device",
        "pool_size",
        "debug",
        "indices",
        "batch",
        "payload",
    ],
)
def test_field_name_clashes_with_generated_name(project: Project, name: str) -> None:
    """A field named like a generated method, attribute or local is refused, not miscompiled."""
    path = project.schema_module(
        "bad", [f'Field("{name}", lane=Lane.FORWARD, dtype=torch.int64),']
    )
    line = line_of(path, f'"{name}"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.{name}: field name {name!r} clashes with a name the "
        "generated map defines or uses\n"
        f'    fix: rename the field, e.g. "{name}_value"'
    )


def test_unknown_lane(project: Project) -> None:
    """A lane given as a string is refused, naming both lanes and what they mean."""
    path = project.schema_module(
        "bad", ['Field("tokens", lane="forward", dtype=torch.int64),']
    )
    line = line_of(path, '"tokens"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.tokens: lane must be Lane.FORWARD or Lane.SCHEDULE "
        "(got 'forward' that is a str)\n"
        "    fix: write lane=Lane.FORWARD (stashed for the next forward) or "
        "lane=Lane.SCHEDULE (published for the scheduler)"
    )


@pytest.mark.parametrize(
    ("spelled", "got"),
    [
        ('"fp8"', "'fp8' that is a str"),
        ("float", "<class 'float'> that is a type"),
    ],
)
def test_dtype_not_a_torch_dtype(project: Project, spelled: str, got: str) -> None:
    """A dtype that is not a torch.dtype is refused, showing the value and its type."""
    path = project.schema_module(
        "bad", [f'Field("probs", lane=Lane.FORWARD, dtype={spelled}),']
    )
    line = line_of(path, '"probs"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.probs: dtype must be a torch.dtype such as torch.int64, "
        f"torch.float32, torch.bfloat16, or FROM_PAYLOAD (got {got})\n"
        "    fix: write dtype=torch.<name>, e.g. dtype=torch.int64"
    )


@pytest.mark.parametrize("dim", [0, -3])
def test_non_positive_dim(project: Project, dim: int) -> None:
    """A zero or negative row dim is refused with the size rule and the symbolic alternative."""
    path = project.schema_module(
        "bad",
        [f'Field("probs", lane=Lane.FORWARD, dtype=torch.float32, shape=({dim},)),'],
    )
    line = line_of(path, '"probs"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.probs: shape dims must be positive (got {dim})\n"
        '    fix: use a size >= 1, or a symbolic name such as "topk" given at construction'
    )


@pytest.mark.parametrize(
    ("spelled", "got"),
    [
        ("2.5", "2.5 that is a float"),
        ("True", "True that is a bool"),
        ("None", "None that is a NoneType"),
    ],
)
def test_non_integer_dim(project: Project, spelled: str, got: str) -> None:
    """A row dim that is neither an int nor a symbolic name is refused, bools included."""
    path = project.schema_module(
        "bad",
        [
            f'Field("probs", lane=Lane.FORWARD, dtype=torch.float32, shape=({spelled},)),'
        ],
    )
    line = line_of(path, '"probs"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.probs: shape dims must be positive ints or symbolic names "
        f"(got {got})\n"
        '    fix: write shape=("topk",) or shape=(8,)'
    )


def test_symbolic_dim_not_an_identifier(project: Project) -> None:
    """A symbolic dim must be usable as a constructor keyword."""
    path = project.schema_module(
        "bad",
        ['Field("probs", lane=Lane.FORWARD, dtype=torch.float32, shape=("top k",)),'],
    )
    line = line_of(path, '"probs"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.probs: symbolic dim must be an identifier that is not "
        "reserved (got 'top k')\n"
        '    fix: name the dim like a keyword argument, e.g. "topk" or "hidden"'
    )


def test_from_payload_dtype_on_eager_field(project: Project) -> None:
    """FROM_PAYLOAD on an eagerly allocated field is refused: there is no payload yet."""
    path = project.schema_module(
        "bad", ['Field("hidden", lane=Lane.FORWARD, dtype=FROM_PAYLOAD, shape=("h",)),']
    )
    line = line_of(path, '"hidden"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.hidden: dtype=FROM_PAYLOAD needs a lazily allocated "
        "field, but alloc is Alloc.EAGER\n"
        "    fix: add alloc=Alloc.LAZY, or give a fixed dtype such as torch.bfloat16"
    )


def test_schedule_field_without_target(project: Project) -> None:
    """A schedule field must say which batch attribute it resolves into."""
    path = project.schema_module(
        "bad", ['Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64),']
    )
    line = line_of(path, '"lens"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.lens: a schedule field needs a target on the batch to "
        "resolve into (got target=None)\n"
        '    fix: add target="<batch attribute>", e.g. target="seq_lens"'
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bool"])
def test_placeholder_on_non_integer_dtype(project: Project, dtype: str) -> None:
    """Placeholder resolution needs an integer dtype, since placeholders are negative slots."""
    path = project.schema_module(
        "bad",
        [
            (
                f'Field("tok", lane=Lane.FORWARD, dtype=torch.{dtype}, target="input_ids", '
                "resolve=Resolve.PLACEHOLDER),"
            ),
        ],
    )
    line = line_of(path, '"tok"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.tok: resolve=Resolve.PLACEHOLDER needs an integer dtype, "
        f"since placeholders are negative slots (got torch.{dtype})\n"
        "    fix: use resolve=Resolve.GATHER for this field"
    )


@pytest.mark.parametrize(
    "target",
    ["spec_info..topk_p", "spec_info.0x", "seq lens", ".seq_lens", "spec_info.class"],
)
def test_malformed_target_path(project: Project, target: str) -> None:
    """A target that is not identifiers joined by dots is refused with an example path."""
    path = project.schema_module(
        "bad",
        [
            f'Field("topk_p", lane=Lane.FORWARD, dtype=torch.float32, target={target!r}),'
        ],
    )
    line = line_of(path, '"topk_p"')
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.topk_p: target must be a dotted attribute path such as "
        f"'spec_info.topk_p' (got {target!r} that is a str)\n"
        '    fix: write target="seq_lens" or target="spec_info.topk_p": identifiers joined by dots'
    )


def test_two_fields_resolve_into_one_target(project: Project) -> None:
    """Two fields writing the same batch attribute are refused at the second one."""
    path = project.schema_module(
        "bad",
        [
            GOOD,
            'Field("draft", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),',
        ],
    )
    first = line_of(path, '"tokens"')
    second = line_of(path, '"draft"')
    assert one_issue(project) == (
        f"{SRC}:{second}: error: BadFutureMap.draft: target 'input_ids' is also the target of field "
        f"'tokens' ({SRC}:{first}): one batch attribute cannot be both (written there, "
        "written here)\n"
        "    fix: give the target of field 'draft' a batch attribute of its own"
    )


def test_schema_with_no_fields(project: Project) -> None:
    """A schema without fields is reported at the Schema(...) declaration."""
    path = project.schema_module("bad", [])
    line = line_of(path, "SCHEMA = Schema(")
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap: a schema needs at least one field (got none)\n"
        "    fix: add a Field(...) to fields=[...], or delete the schema module"
    )


SCHEMA_TEXT_MULTILINE = """\
    import torch

    from relay.schema import Field, Lane, Schema

    SCHEMA = Schema(
        name="BadFutureMap",
        fields=[
            Field(
                "probs",
                lane=Lane.FORWARD,
                dtype="fp8",
            ),
        ],
    )
"""


def test_multi_line_declaration_reported_at_its_first_line(project: Project) -> None:
    """An error in a multi-line Field(...) points at the line that opens the declaration."""
    path = project.write_schema("bad", SCHEMA_TEXT_MULTILINE)
    line = line_of(path, "Field(")
    assert one_issue(project).startswith(
        f"{SRC}:{line}: error: BadFutureMap.probs: dtype must be"
    )


def test_schema_module_that_fails_to_import(project: Project) -> None:
    """A module raising on import shows its own error briefly, at the failing line, and the fix."""
    path = project.write_schema(
        "boom",
        """\
        import torch

        TABLE = {"topk": 8}
        TOPK = TABLE["top_k"]
    """,
    )
    line = line_of(path, "TOPK =")
    assert import_error(project, "boom") == (
        f"schemas/boom.py:{line}: error: the schema module failed to import: KeyError: 'top_k'\n"
        "    fix: run `python schemas/boom.py` to see the full traceback, and mend the module"
    )


def test_schema_module_with_syntax_error(project: Project) -> None:
    """A syntax error is reported at its line, with Python's own description."""
    project.write_schema(
        "syntax",
        """\
        import torch

        SCHEMA = (
    """,
    )
    assert import_error(project, "syntax") == (
        "schemas/syntax.py:3: error: the schema module failed to import: SyntaxError: '(' was "
        "never closed\n"
        "    fix: run `python schemas/syntax.py` to see the full traceback, and mend the module"
    )


def test_schema_module_without_schema(project: Project) -> None:
    """A module that defines no SCHEMA says so and how to declare it."""
    project.write_schema(
        "noschema",
        """\
        import torch

        DECODE = None
    """,
    )
    assert import_error(project, "noschema") == (
        "schemas/noschema.py:1: error: a schema module must define SCHEMA = Schema(...) (got nothing)\n"
        "    fix: assign the schema declaration to a module-level name SCHEMA"
    )


def test_schema_module_with_non_schema_value(project: Project) -> None:
    """A SCHEMA that is not a Schema is refused, naming what it is."""
    project.write_schema("notschema", 'SCHEMA = {"name": "DecodeFutureMap"}\n')
    assert import_error(project, "notschema") == (
        "schemas/notschema.py:1: error: a schema module must define SCHEMA = Schema(...) (got a dict)\n"
        "    fix: assign the schema declaration to a module-level name SCHEMA"
    )


def test_missing_schema_module(project: Project) -> None:
    """A schema path that does not exist is named, with where to look."""
    assert import_error(project, "absent") == (
        "schemas/absent.py: error: no such schema module\n"
        "    fix: check the path, or the 'schemas' list under [tool.relay] in pyproject.toml"
    )


THREE_MISTAKES = [
    'Field("tokens", lane="forward", dtype=torch.int64),',
    'Field("probs", lane=Lane.FORWARD, dtype="fp8"),',
    'Field("rows", lane=Lane.FORWARD, dtype=torch.int64, shape=(0,)),',
]


def test_cli_lists_every_error_and_exits_3(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """`relay generate` on a schema with three mistakes lists all three, writes nothing, exits 3."""
    path = project.schema_module("bad", THREE_MISTAKES)
    lines = [line_of(path, needle) for needle in ('"tokens"', '"probs"', '"rows"')]
    run = relay_cli("generate", "schemas/bad.py", "--out", "maps", cwd=project.root)
    assert run.code == 3
    assert run.err == (
        f"{SRC}:{lines[0]}: error: BadFutureMap.tokens: lane must be Lane.FORWARD or Lane.SCHEDULE "
        "(got 'forward' that is a str)\n"
        "    fix: write lane=Lane.FORWARD (stashed for the next forward) or "
        "lane=Lane.SCHEDULE (published for the scheduler)\n"
        f"{SRC}:{lines[1]}: error: BadFutureMap.probs: dtype must be a torch.dtype such as "
        "torch.int64, torch.float32, torch.bfloat16, or FROM_PAYLOAD (got 'fp8' that is a str)\n"
        "    fix: write dtype=torch.<name>, e.g. dtype=torch.int64\n"
        f"{SRC}:{lines[2]}: error: BadFutureMap.rows: shape dims must be positive (got 0)\n"
        '    fix: use a size >= 1, or a symbolic name such as "topk" given at construction\n'
        "relay: invalid schema: 3 problems in 1 schema module (nothing was written)\n"
    )
    assert not project.maps.exists()


def test_cli_lists_errors_of_every_schema(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """Mistakes in several schema modules are all listed in one configured run."""
    project.schema_module("bad", THREE_MISTAKES[:2])
    project.schema_module("worse", [THREE_MISTAKES[2]], name="WorseFutureMap")
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 3
    assert run.err.endswith(
        "relay: invalid schema: 3 problems in 2 schema modules (nothing was written)\n"
    )
    assert [line.split(": ")[2] for line in run.err.splitlines()[:-1:2]] == [
        "BadFutureMap.tokens",
        "BadFutureMap.probs",
        "WorseFutureMap.rows",
    ]
    assert not project.maps.exists()


def test_cli_lists_import_and_validation_errors_together(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """One run shows both a module that fails to import and another module's invalid field."""
    project.write_schema("boom", 'raise RuntimeError("schema table missing")\n')
    project.schema_module("bad", [THREE_MISTAKES[1]])
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 3
    assert "schemas/boom.py:1: error: the schema module failed to import" in run.err
    assert "BadFutureMap.probs: dtype must be a torch.dtype" in run.err


# --- accepted schemas that must not produce broken modules -------------------------------


def _refused(project: Project, field_name: str, problem: str) -> None:
    """Validation refuses ``schemas/bad.py`` with one issue: ``field_name``, ``problem``."""
    (issue,) = schema_error(project).issues
    assert (issue.field, issue.problem) == (field_name, problem)


def test_schedule_resolve_named_like_resolve_future(project: Project) -> None:
    """A schedule target named `future` would make the map define resolve_future twice:
    refused at the field."""
    project.schema_module(
        "bad",
        [
            GOOD,
            'Field("ready", lane=Lane.SCHEDULE, dtype=torch.int64, target="future"),',
        ],
    )
    _refused(
        project,
        "ready",
        "its schedule resolve would be named resolve_future(), which every map defines "
        "for another purpose",
    )


@pytest.mark.parametrize("owner", ["batch", "payload", "future_map"])
def test_nested_target_protocol_name_clash(project: Project, owner: str) -> None:
    """A nested target whose Protocol would take another generated class's name is refused."""
    project.schema_module(
        "bad",
        [
            GOOD,
            f'Field("extra", lane=Lane.FORWARD, dtype=torch.int64, target="{owner}.extra"),',
        ],
    )
    clash = {
        "batch": "BadBatch, a name the module already defines (its batch Protocol)",
        "payload": "BadPayload, a name the module already defines (its payload class)",
        "future_map": "BadFutureMap, a name the module already defines (the map class)",
    }
    _refused(
        project,
        "extra",
        f"target '{owner}.extra' goes through '{owner}', whose generated Protocol would "
        f"be named {clash[owner]}",
    )


def test_field_named_like_a_builtin_the_map_calls(project: Project) -> None:
    """A schedule field named `int` with a host sum is refused, or its resolve works."""
    project.schema_module(
        "bad",
        [
            (
                'Field("int", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens", '
                'host=HostCopy(sum="seq_lens_sum")),'
            ),
        ],
    )
    job = explicit_job([project.schemas / "bad.py"], project.maps)
    try:
        planned = plan(job)
    except SchemaError as error:
        assert [issue.field for issue in error.issues] == ["int"]
        return
    module = types.ModuleType("_relay_test_int_map")
    exec(compile(planned[0].content, "bad_map.py", "exec"), module.__dict__)
    relay_map = module.BadFutureMap("cpu", 4)
    indices = torch.tensor([1, 2])
    relay_map.publish(indices, torch.tensor([5, 7]))
    batch = types.SimpleNamespace(req_pool_indices=indices)
    relay_map.resolve_seq_lens(batch)
    assert batch.seq_lens_sum == 12


def test_loading_schemas_leaves_no_module_behind(project: Project) -> None:
    """Loading a schema module (good or bad) does not leave it registered in sys.modules."""
    project.schema_module("bad", [THREE_MISTAKES[0]])
    schema_error(project)
    assert [name for name in sys.modules if name.startswith("_relay_schema_")] == []


# --- options that make no sense together (refused before anything is written) -----------------

QFLAG, QCONF, QODD, QTOK = '"flag"', '"conf"', '"odd"', '"tok"'


@pytest.mark.parametrize(
    ("dtype", "guard"),
    [
        ("bool", "POSITIVE"),
        ("bool", "NON_NEGATIVE"),
        ("complex64", "POSITIVE"),
    ],
)
def test_guard_on_a_dtype_it_cannot_check(
    project: Project, dtype: str, guard: str
) -> None:
    """A value guard on bool or complex values is refused: comparing them with 0 means nothing."""
    path = project.schema_module(
        "bad",
        [
            f'Field("flag", lane=Lane.FORWARD, dtype=torch.{dtype}, guard=Guard.{guard}),'
        ],
    )
    assert one_issue(project) == (
        f"{SRC}:{line_of(path, QFLAG)}: error: BadFutureMap.flag: guard=Guard.{guard} "
        f"compares values with 0, which torch.{dtype} values cannot be checked by (got "
        f"guard=Guard.{guard} with dtype=torch.{dtype})\n"
        "    fix: remove the guard, or give the field a real integer or float dtype"
    )


@pytest.mark.parametrize(
    ("spelled", "got"),
    [
        ("torch.float32", "torch.float32"),
        ("FROM_PAYLOAD, alloc=Alloc.LAZY", "FROM_PAYLOAD"),
    ],
)
def test_host_sum_on_a_float_field(project: Project, spelled: str, got: str) -> None:
    """A host sum on a float (or not yet known) dtype is refused: the int sum would truncate it."""
    path = project.schema_module(
        "bad",
        [
            (
                f'Field("conf", lane=Lane.SCHEDULE, dtype={spelled}, target="conf", '
                'host=HostCopy(sum="conf_sum")),'
            )
        ],
    )
    assert one_issue(project) == (
        f"{SRC}:{line_of(path, QCONF)}: error: BadFutureMap.conf: HostCopy(sum=...) hands "
        "the batch an int, so it needs a fixed integer dtype; a float sum would be truncated "
        f"(got dtype={got})\n"
        "    fix: give dtype=torch.int64, or remove sum=... and sum the mirror yourself"
    )


def _dtypes_torch_cannot_index() -> list[str]:
    """Candidate dtypes that this torch build cannot allocate or index by rows."""
    found = []
    for name in ("qint8", "bits8", "uint16"):
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter(
                    "ignore"
                )  # quantized dtypes warn that they are deprecated
                buf = torch.zeros((2,), dtype=dtype)
                buf[torch.tensor([1])] = torch.tensor([1]).to(dtype)
        except Exception:
            found.append(name)
    return found or ["<none>"]


@pytest.mark.parametrize("dtype", _dtypes_torch_cannot_index())
def test_dtype_torch_cannot_hold(project: Project, dtype: str) -> None:
    """A dtype torch cannot allocate or index is refused at generation, not at construction."""
    if dtype == "<none>":
        pytest.skip("this torch build indexes every candidate dtype")
    path = project.schema_module(
        "bad", [f'Field("odd", lane=Lane.FORWARD, dtype=torch.{dtype}, target="odd"),']
    )
    issue = one_issue(project)
    assert issue.startswith(
        f"{SRC}:{line_of(path, QODD)}: error: BadFutureMap.odd: dtype torch.{dtype} cannot "
        "hold a relay buffer: torch cannot allocate it or index its rows ("
    )
    assert issue.endswith(
        "    fix: use a dtype torch indexes, such as torch.int64, torch.float32, torch.bfloat16"
    )


def test_placeholder_on_an_unsigned_dtype(project: Project) -> None:
    """Placeholders are negative slots: an unsigned dtype cannot hold them."""
    path = project.schema_module(
        "bad",
        [
            (
                'Field("tok", lane=Lane.FORWARD, dtype=torch.uint8, target="input_ids", '
                "resolve=Resolve.PLACEHOLDER),"
            )
        ],
    )
    assert one_issue(project) == (
        f"{SRC}:{line_of(path, QTOK)}: error: BadFutureMap.tok: resolve=Resolve.PLACEHOLDER "
        "needs a signed integer dtype, since placeholders are negative slots (got torch.uint8)\n"
        "    fix: give a signed dtype such as torch.int64, or use resolve=Resolve.GATHER"
    )


@pytest.mark.parametrize("alloc", ["LAZY", "EAGER"])
def test_optional_placeholder(project: Project, alloc: str) -> None:
    """An optional placeholder field would hand `-slot` (lazy) or a stale value (eager) to the
    forward on a step without it: refused."""
    path = project.schema_module(
        "bad",
        [
            (
                'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids", '
                f"resolve=Resolve.PLACEHOLDER, alloc=Alloc.{alloc}, optional=True),"
            )
        ],
    )
    assert one_issue(project) == (
        f"{SRC}:{line_of(path, QTOK)}: error: BadFutureMap.tok: resolve=Resolve.PLACEHOLDER "
        "needs the value on every step: a step whose payload omits an optional field would "
        "leave the placeholders (-slot) that invalidate wrote, or a previous step's value, for "
        "the forward (got optional=True)\n"
        "    fix: make the field required (optional=False), or use resolve=Resolve.GATHER"
    )


def test_malformed_shape_names_its_field() -> None:
    """A shape that is not a tuple of dims is reported with its field, not as a crash."""
    from relay.codegen.validate import validate
    from relay.schema import Field, Lane, Schema

    field = Field("probs", lane=Lane.FORWARD, dtype=torch.float32)
    object.__setattr__(
        field, "shape", {"topk"}
    )  # what a converter that keeps bad values gives
    (issue,) = validate(Schema("BadFutureMap", [field]), lambda file: "schemas/bad.py")
    assert (issue.field, issue.problem) == (
        "probs",
        (
            "shape must be a tuple of dims such as (\"topk\",) or (8,) (got {'topk'} that "
            "is a set)"
        ),
    )


def test_two_nested_targets_cannot_make_one_protocol_name(project: Project) -> None:
    """`spec_info.a` and `spec__info.b` would both need a Protocol SpecInfo: refused."""
    project.schema_module(
        "bad",
        [
            'Field("a", lane=Lane.FORWARD, dtype=torch.int64, target="spec_info.a"),',
            'Field("b", lane=Lane.FORWARD, dtype=torch.int64, target="spec__info.b"),',
        ],
    )
    _refused(
        project,
        "b",
        "target 'spec__info.b' goes through 'spec__info', whose generated Protocol would "
        "be named BadSpecInfo, like that of 'spec_info' (field 'a', schemas/bad.py:8)",
    )


@pytest.mark.parametrize(
    ("option", "spelled"),
    [
        ('host_mirror="seq_lens_cpu"', "host_mirror=... is declared as host=HostCopy("),
        (
            'tails_kv="out_cache_loc"',
            "tails_kv=... is declared as tails=Tails(rows=..., kv=",
        ),
        ("resolve=Resolve.SCATTER", "Resolve.SCATTER is declared as resolve=Scatter("),
    ],
)
def test_an_option_now_grouped_is_told_its_spelling(
    project: Project, option: str, spelled: str
) -> None:
    """A schema module that passes an option relay now declares inside a group fails
    to import, at its line, with the group's spelling as the fix."""
    path = project.schema_module(
        "bad",
        [
            (
                'Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens", '
                f"{option}),"
            )
        ],
    )
    message = one_issue(project)
    line = line_of(path, '"lens"')
    assert message.startswith(
        f"{SRC}:{line}: error: the schema module failed to import"
    )
    assert f"fix: {spelled}" in message


def test_carried_gate_names_no_optional_field(project: Project) -> None:
    """``gate=Carried(name)`` must name another optional field of the schema."""
    path = project.schema_module(
        "bad",
        [
            GOOD,
            (
                'Field("probs", lane=Lane.FORWARD, dtype=FROM_PAYLOAD, alloc=Alloc.LAZY, '
                'optional=True, target="spec_info.probs", gate=Carried("tokens")),'
            ),
        ],
    )
    line = line_of(path, "spec_info.probs")
    assert one_issue(project) == (
        f"{SRC}:{line}: error: BadFutureMap.probs: gate=Carried(...) names another "
        "optional field of this schema, whose carrying this field's read follows "
        "(got field='tokens')\n"
        '    fix: name an optional field declared beside it, e.g. gate=Carried("topk_p")'
    )
