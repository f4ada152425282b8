"""Unsafe schema inputs are located errors: class names the generated module binds itself
(or builtins it would shadow), and control characters in docs or names."""

from __future__ import annotations

import ast
import builtins
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from codegen_support import GOLDEN, REPO, SCHEMA_PRELUDE, Project, Run, line_of

from relay.codegen import bindings, explicit_job, naming, plan
from relay.codegen.loader import load_schema
from relay.codegen.render import render
from relay.errors import SchemaError
from relay.schema import Schema

SOURCES = sorted((REPO / "relay" / "schemas").glob("*.py")) + sorted(
    (GOLDEN / "schemas").glob("*.py")
)


def _rendered() -> list[tuple[Schema, ast.Module]]:
    """Every bundled and golden-corpus schema with its rendered module, parsed."""
    found = []
    for path in SOURCES:
        schema = load_schema(path, path.name)
        text = render(schema, source=f"schemas/{path.name}", command="relay generate")
        found.append((schema, ast.parse(text)))
    return found


def _module_bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(classes, every other name) the module binds at its top level."""
    classes: set[str] = set()
    others: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            others.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            others.add(node.name)
        else:
            others.update(
                n.id
                for n in ast.walk(node)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            )
    return classes, others


def _minted(schema: Schema) -> set[str]:
    """The classes naming mints from ``schema``: the map, the payload and the
    Protocols."""
    names = {
        schema.name,
        naming.payload_class(schema),
        naming.batch_protocol(schema),
    }
    paths = [schema.indices]
    for f in schema.fields:
        host = (f.host.mirror, f.host.sum) if f.host else ()
        paths += [p for p in (f.target, *host) if p is not None]
    if schema.staged is not None:  # the draft input a Staged method fills
        names.add(naming.staged_protocol(schema))
    if schema.lanes_apart:  # the schedule lane's batch, Note [Slots per lane]
        names.add(naming.schedule_protocol(schema))
        lanes = schema.schedule
        paths += [p for p in ((lanes.indices, lanes.owners) if lanes else ()) if p]
    for path in paths:
        parts = tuple(path.split("."))
        for schedule in (False, True):
            names.update(
                naming.nested_protocol(schema, parts[:d], schedule=schedule)
                for d in range(1, len(parts))
            )
    return names


def test_template_binds_lists_every_module_level_name() -> None:
    """Note [Module-level names]: besides the classes minted from the schema and the
    dtypes its gates test (Note [Gate constants]), a rendered module binds exactly the
    names of bindings.TEMPLATE_BINDS (none missing, none stale)."""
    seen: set[str] = set()
    for schema, tree in _rendered():
        classes, others = _module_bindings(tree)
        assert classes <= _minted(schema), schema.name
        others -= naming.GATE_NAMES - set(bindings.TEMPLATE_BINDS)
        assert others <= set(bindings.TEMPLATE_BINDS), (
            f"{schema.name}: the template binds {sorted(others - set(bindings.TEMPLATE_BINDS))} "
            "at module level; add them to TEMPLATE_BINDS in relay/codegen/bindings.py"
        )
        seen |= others
    assert seen == set(bindings.TEMPLATE_BINDS)
    # Fields, sources and dims may not take these names either.
    assert set(bindings.TEMPLATE_BINDS) <= naming.RESERVED


def test_free_names_of_the_generated_code_are_builtins_the_check_refuses() -> None:
    """Every name the generated code reads without binding it is a builtin, and schema
    names equal to builtins are refused, so no minted class can shadow one."""
    for schema, tree in _rendered():
        bound = {
            n.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        bound |= {
            (a.asname or a.name).split(".")[0]
            for a in ast.walk(tree)
            if isinstance(a, ast.alias)
        }
        bound |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
        bound |= {
            n.name
            for n in ast.walk(tree)
            if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        }
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        free = read - bound
        assert free <= set(dir(builtins)), (schema.name, free - set(dir(builtins)))


def _schema(project: Project, name: str, field: str | None = None) -> Path:
    field = (
        field
        or 'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),'
    )
    return project.schema_module("bad", [field], name=name)


def _only_issue(project: Project) -> str:
    with pytest.raises(SchemaError) as excinfo:
        plan(explicit_job([project.schemas / "bad.py"], project.maps))
    (issue,) = excinfo.value.issues
    return str(issue)


@pytest.mark.parametrize("name", sorted(bindings.TEMPLATE_BINDS))
def test_schema_named_like_a_template_binding_is_refused(
    project: Project, relay_cli: Callable[..., Run], name: str
) -> None:
    """`torch`, `attrs`, `Protocol`, `_rt`...: exit 3 at the schema's line, saying how the
    module binds it, with a rename; nothing is written."""
    path = _schema(project, name)
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 3
    first, fix = run.err.splitlines()[:2]
    line = line_of(path, "SCHEMA = Schema(")
    assert first.startswith(
        f"schemas/bad.py:{line}: error: {name}: schema name {name!r} "
    )
    if name.startswith("__"):
        assert "dunder" in first
    else:
        assert first.endswith(
            f"is a name the generated module binds itself ({bindings.TEMPLATE_BINDS[name]})"
        )
    assert fix.startswith(
        '    fix: name the schema like a class of its own, e.g. name="'
    )
    assert not project.maps.exists()


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("int", "is a Python builtin the generated module would shadow"),
        ("ValueError", "is a Python builtin the generated module would shadow"),
        ("isinstance", "is a Python builtin the generated module would shadow"),
        ("__doc__", "is a dunder name, reserved for Python"),
        ("__Hidden", "starts with '__', which Python mangles"),
        ("match", "is a Python keyword"),
        ("ﬁeldFutureMap", "NFKC"),
    ],
)
def test_schema_named_like_a_builtin_or_hidden_name_is_refused(
    project: Project, name: str, says: str
) -> None:
    """Builtins the module would shadow, dunders, mangled and soft-keyword names: located."""
    _schema(project, name)
    assert f"schema name {name!r} " in _only_issue(project)
    assert says in _only_issue(project)


def test_payload_class_that_would_be_a_binding_is_refused(project: Project) -> None:
    """The names derived from the schema name count too (a nested Protocol named
    `Protocol` would shadow typing's), located at the field whose target makes it."""
    path = _schema(
        project,
        "PFutureMap",
        'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="protocol.tok"),',
    )
    line = line_of(path, 'Field("tok"')
    assert _only_issue(project) == (
        f"schemas/bad.py:{line}: error: PFutureMap.tok: target 'protocol.tok' goes through "
        "'protocol', whose generated Protocol would be named Protocol, a name the generated "
        "module binds itself (from typing import Protocol)\n"
        "    fix: rename the attribute 'protocol' on the batch, or the schema"
    )


def test_lowercase_schema_name_that_only_starts_like_a_binding_is_fine(
    project: Project,
) -> None:
    """`torchFutureMap` binds nothing of the module's: it generates and compiles."""
    _schema(project, "torchFutureMap")
    (planned,) = plan(explicit_job([project.schemas / "bad.py"], project.maps))
    compile(planned.content, "bad.py", "exec")


# --- control characters -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("nul \\x00 byte", "U+0000 (NUL) at line 1, column 5"),
        ("line one\\nan \\x1b[2J escape", "U+001B (ESC) at line 2, column 4"),
        ("carriage\\rreturn", "U+000D (CR) at line 1, column 9"),
        ("form\\x0cfeed", "U+000C (FF) at line 1, column 5"),
        ("del \\x7f", "U+007F (DEL) at line 1, column 5"),
        ("c1 \\x85 next line", "U+0085 at line 1, column 4"),
    ],
)
@pytest.mark.parametrize("owner", ["schema", "field"])
def test_control_character_in_a_doc_is_located(
    project: Project, text: str, where: str, owner: str
) -> None:
    """A control character in the schema's or a field's doc: the declaration's line, the
    character and where in the doc it is, and the fix."""
    field = 'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"'
    if owner == "field":
        path = _schema(project, "DocFutureMap", f'{field}, doc="{text}"),')
        line, subject = line_of(path, 'Field("tok"'), "DocFutureMap.tok"
    else:
        path = project.write_schema(
            "bad",
            SCHEMA_PRELUDE
            + f'SCHEMA = Schema(\n    name="DocFutureMap",\n    doc="{text}",\n'
            + f"    fields=[{field})],\n)\n",
        )
        line, subject = line_of(path, "SCHEMA = Schema("), "DocFutureMap"
    assert _only_issue(project) == (
        f"schemas/bad.py:{line}: error: {subject}: doc holds the control character "
        f"{where}\n    fix: delete it (or write what it stands for in words); doc strings "
        "may hold tabs and line breaks, but no other control character"
    )


def test_tabs_and_newlines_in_docs_are_accepted(project: Project) -> None:
    """Tab and newline are text, not refused: the module generates and its class doc
    string reads back as inspect.cleandoc reads the schema's."""
    doc = "Columns:\ta\tb\n\nSecond paragraph."
    path = project.write_schema(
        "tabs",
        SCHEMA_PRELUDE
        + f"SCHEMA = Schema(\n    name='TabsFutureMap',\n    doc={doc!r},\n"
        + "    fields=[Field('tok', lane=Lane.FORWARD, dtype=torch.int64, target='x')],\n)\n",
    )
    (planned,) = plan(explicit_job([path], project.maps))
    namespace: dict[str, object] = {}
    exec(compile(planned.content, "tabs.py", "exec"), namespace)
    cls = namespace["TabsFutureMap"]
    assert isinstance(cls, type)
    assert (inspect.getdoc(cls) or "").startswith(inspect.cleandoc(doc))


@pytest.mark.parametrize(
    ("name", "field", "problem"),
    [
        (
            "A\x00",
            None,
            "A\\x00: schema name must be a Python identifier (got 'A\\x00' that is a str)",
        ),
        (
            "CtlFutureMap",
            'Field("tok\\x1b", lane=Lane.FORWARD, dtype=torch.int64, target="x"),',
            (
                "CtlFutureMap.tok\\x1b: field name must be a Python identifier (got "
                "'tok\\x1b' that is a str)"
            ),
        ),
        (
            "CtlFutureMap",
            'Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="x\\ry"),',
            "CtlFutureMap.tok: target must be a dotted attribute path",
        ),
    ],
    ids=["schema-NUL", "field-ESC", "target-CR"],
)
def test_control_character_in_a_name_is_located_on_one_line(
    project: Project,
    relay_cli: Callable[..., Run],
    name: str,
    field: str | None,
    problem: str,
) -> None:
    """Names cannot hold control characters: a located error whose message escapes them,
    so it stays one line (exit 3)."""
    _schema(project, name, field)
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 3
    lines = run.err.splitlines()
    assert len(lines) == 3 and lines[0].startswith("schemas/bad.py:"), run.err
    assert problem in lines[0]
    assert all(ch.isprintable() for ch in lines[0])
    assert all(ch.isprintable() for ch in run.err.replace("\n", ""))
