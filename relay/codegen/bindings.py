"""Bindings: the names a generated module binds, and the clashes a schema would cause.

The module binds names of its own at module level (its imports, ``_TABLE``), calls
builtins, and mints classes from the schema: the map, its payload and a Protocol per
batch and per object a path goes through. A schema whose names would take one of
these, or make two objects' Protocols one name, is refused here, before rendering;
so is a doc string with a control character the module could not carry.
"""

from __future__ import annotations

import builtins
import unicodedata
from collections.abc import Callable, Iterator

from relay.codegen import naming
from relay.codegen.roles import Role
from relay.schema import Field, Lane, Schema, SourceLocation

__all__ = [
    "TEMPLATE_BINDS",
    "Located",
    "control_character",
    "name_and_doc_problems",
    "protocol_clashes",
]


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
    "Final": "from typing import Final",
    "Protocol": "from typing import Protocol",
    "attrs": "import attrs",
    "torch": "import torch",
    "_rt": "from relay import runtime as _rt",
    "_TABLE": "_TABLE = _rt.Table(...)",
    "_TENSOR": "_TENSOR = torch.Tensor",  # Note [Gate constants], and a dtype's
    "_INT64": "_INT64 = torch.int64",
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

#: A problem of a name: the field (``None``: the schema), what, the fix, and the line
#: of the declaration at fault where it is not the field's (the schema's).
Located = tuple[Field | None, str, str, SourceLocation | None]


def name_and_doc_problems(schema: Schema) -> list[Located]:
    """Every class-name clash and every control character of ``schema``."""
    return [*_class_names(schema), *_doc_controls(schema)]


def _taken(name: str) -> str | None:
    """How the generated module already binds ``name``, if it does."""
    if name in TEMPLATE_BINDS:
        return f"a name the generated module binds itself ({TEMPLATE_BINDS[name]})"
    if name in naming.GATE_NAMES:
        return "a name the generated module binds itself (a dtype a gate tests)"
    if name in _BUILTINS:
        return "a Python builtin the generated module would shadow"
    return None


def _class_names(schema: Schema) -> Iterator[Located]:
    name = schema.name
    if not naming.is_identifier(name):
        return  # validate reports it
    problem = naming.identifier_problem(name, reserved=False)
    if problem is not None:
        yield (None, f"schema name {name!r} {problem}", _rename_schema(name), None)
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
            yield (None, problem, _rename_schema(name), None)
            return


def _rename_schema(name: str) -> str:
    stem = naming.python_name(name).strip("_") or "Relay"
    return f'name the schema like a class of its own, e.g. name="{stem[:1].upper()}{stem[1:]}FutureMap"'


def _doc_controls(schema: Schema) -> Iterator[Located]:
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
                None,
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


def protocol_clashes(
    schema: Schema, table: list[Role], where: Callable[[SourceLocation], str]
) -> Iterator[Located]:
    """The Protocol of each object a path goes through (``EagleSpecInfo``, and
    ``EagleScheduleSpecInfo`` on the schedule lane's batch where that is apart) takes
    no name the module already binds, nor another object's."""
    taken = "a name the module already defines"
    bound = {
        schema.name: f"{taken} (the map class)",
        naming.payload_class(schema): f"{taken} (its payload class)",
        naming.batch_protocol(schema): f"{taken} (its batch Protocol)",
    }
    if schema.lanes_apart:
        bound[naming.schedule_protocol(schema)] = (
            f"{taken} (the schedule lane's batch Protocol)"
        )
    owners: dict[str, tuple[str, Role]] = {}
    for role in table:
        parts = tuple(role.path.split("."))
        if not all(naming.is_identifier(p) for p in parts):
            continue  # validate reports a malformed path
        for schedule in _batches(schema, role):
            for depth in range(1, len(parts)):
                through = ".".join(parts[:depth])
                name = naming.nested_protocol(schema, parts[:depth], schedule=schedule)
                key = ("schedule " if schedule else "") + through
                first = owners.setdefault(name, (key, role))
                if name in bound or _taken(name) is not None:
                    clash = bound.get(name) or _taken(name)
                elif first[0] != key:
                    other = first[1]
                    by = f"field {other.field.name!r}" if other.field else "the schema"
                    clash = f"like that of {first[0]!r} ({by}, {where(other.at)})"
                else:
                    continue
                yield (
                    role.field,
                    (
                        f"{role.option} {role.path!r} goes through {through!r}, whose "
                        f"generated Protocol would be named {name}, {clash}"
                    ),
                    (
                        f"rename the attribute {parts[depth - 1]!r} on the batch, or the "
                        "schema"
                    ),
                    role.at,
                )
                return


def _batches(schema: Schema, role: Role) -> tuple[bool, ...]:
    """Which batch Protocols hold ``role``'s path: the forward batch's (False), the
    schedule lane's (True) where that lane's batch is apart (Note [Slots per lane])."""
    if not schema.lanes_apart:
        return (False,)
    f, lanes = role.field, schema.schedule
    if f is None and role.option.startswith("ScheduleSlots"):
        return (True,)
    if f is None:  # the forward batch's, and the schedule's where it falls back
        own = (
            getattr(lanes, role.option, None)
            if role.option != "optional_parents"
            else 0
        )
        return (False, True) if own is None else (False,)
    if f.lane is Lane.FORWARD or role.option.startswith(("Tails", "TailsKv")):
        return (False,)
    return (True, False) if f.tails is not None else (True,)
