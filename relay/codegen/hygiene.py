"""Schema-level refusals: class names the generated module cannot bind, and control
characters in doc strings.

``validate`` calls ``problems`` once per schema; each problem is located at the
declaration that holds the name or the text (the schema's, or a field's for a name
minted from its target).
"""

from __future__ import annotations

import builtins
import unicodedata
from collections.abc import Iterator

from relay.codegen import naming
from relay.schema import Field, Schema

# Note [Module-level names]
# A generated module binds these names at module level besides the classes it mints
# from the schema (the map, its payload and its Protocols), each as the top of
# relay/codegen/templates/map.py.jinja spells it. A schema whose class names take one
# of them would shadow an import the module's own code reads (``class torch``), or be
# shadowed by it. Keep this table equal to the template: tests/generator/
# test_codegen_unsafe.py parses rendered modules and checks that it covers every
# module-level binding that is not a class minted from the schema.
TEMPLATE_BINDS: dict[str, str] = {
    "annotations": "from __future__ import annotations",
    "Protocol": "from typing import Protocol",
    "attrs": "import attrs",
    "torch": "import torch",
    "_rt": "from relay import runtime as _rt",
    "__all__": "__all__ = [...]",
}

#: Builtins the generated code calls (``int``, ``isinstance``, ``ValueError``...): a
#: module-level class of the same name would shadow them for the whole module. All of
#: them are refused, so a template change that calls one more needs no change here.
_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))

#: Control characters a doc string may hold: they lay out text.
_LAYOUT = frozenset("\t\n")

_CONTROL_NAMES = {
    0x00: "NUL",
    0x07: "BEL",
    0x08: "BS",
    0x0B: "VT",
    0x0C: "FF",
    0x0D: "CR",
    0x1B: "ESC",
    0x7F: "DEL",
}

Problem = tuple[
    Field | None, str, str
]  # (the declaration, or None: the schema), what, fix


def problems(schema: Schema) -> list[Problem]:
    """Every class-name clash and every control character of ``schema``."""
    return [*_class_names(schema), *_doc_controls(schema)]


def _taken(name: str) -> str | None:
    """How the generated module already binds ``name``, if it does."""
    if name in TEMPLATE_BINDS:
        return f"a name the generated module binds itself ({TEMPLATE_BINDS[name]})"
    if name in _BUILTINS:
        return "a Python builtin the generated module would shadow"
    return None


def _class_names(schema: Schema) -> Iterator[Problem]:
    name = schema.name
    if not naming.is_identifier(name):
        return  # validate reports it
    problem = naming.identifier_problem(name, reserved=False)
    if problem is not None:
        yield (None, f"schema name {name!r} {problem}", _rename_schema(name))
        return
    for minted, what in (
        (name, "the map class"),
        (naming.payload_class(schema), "its payload class"),
        (naming.batch_protocol(schema), "its batch Protocol"),
    ):
        taken = _taken(minted)
        if taken is not None:
            problem = (
                f"schema name {name!r} is {taken}"
                if minted == name
                else f"schema name {name!r} makes {what} {minted}, {taken}"
            )
            yield (None, problem, _rename_schema(name))
            return
    yield from _nested_protocols(schema)


def _rename_schema(name: str) -> str:
    stem = naming.python_name(name).strip("_") or "Relay"
    return f'name the schema like a class of its own, e.g. name="{stem[:1].upper()}{stem[1:]}FutureMap"'


def _paths(schema: Schema) -> Iterator[tuple[Field | None, str, str]]:
    if isinstance(schema.indices, str):
        yield None, "indices", schema.indices
    for f in schema.fields:
        if not isinstance(f, Field):
            continue
        for role in ("target", "host_mirror", "host_sum"):
            path = getattr(f, role)
            if isinstance(path, str):
                yield f, role, path


def _nested_protocols(schema: Schema) -> Iterator[Problem]:
    for owner, role, path in _paths(schema):
        parts = tuple(path.split("."))
        if not all(naming.is_identifier(p) for p in parts):
            continue  # validate reports a malformed path
        for depth in range(1, len(parts)):
            protocol = naming.nested_protocol(schema, parts[:depth])
            taken = _taken(protocol)
            if taken is not None:
                yield (
                    owner,
                    (
                        f"{role} {path!r} goes through {'.'.join(parts[:depth])!r}, "
                        f"whose generated Protocol would be named {protocol}, {taken}"
                    ),
                    f"rename the attribute {parts[depth - 1]!r} on the batch, or the schema",
                )
                break


def _doc_controls(schema: Schema) -> Iterator[Problem]:
    owners: list[tuple[Field | None, object]] = [(None, schema.doc)]
    owners += [(f, f.doc) for f in schema.fields if isinstance(f, Field)]
    for owner, doc in owners:
        if not isinstance(doc, str):
            continue
        found = control_character(doc)
        if found is not None:
            yield (
                owner,
                f"doc holds the control character {found}",
                (
                    "delete it (or write what it stands for in words); doc strings may "
                    "hold tabs and line breaks, but no other control character"
                ),
            )


def control_character(text: str) -> str | None:
    """The first control character of ``text`` other than tab and newline, and where it
    is (``U+0000 (NUL) at line 2, column 5``); ``None`` if there is none."""
    for index, ch in enumerate(text):
        if ch in _LAYOUT or unicodedata.category(ch) != "Cc":
            continue
        line = text.count("\n", 0, index) + 1
        column = index - (text.rfind("\n", 0, index) + 1) + 1
        code = ord(ch)
        named = f" ({_CONTROL_NAMES[code]})" if code in _CONTROL_NAMES else ""
        return f"U+{code:04X}{named} at line {line}, column {column}"
    return None
