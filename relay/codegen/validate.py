"""Validation: every problem of a schema, each with its place, expectation and fix.

All checks run and all issues are returned together, so one ``relay generate``
run shows a user everything to mend. Later stages may assume a schema that passed
is well-formed.
"""

from __future__ import annotations

import builtins
import functools
import unicodedata
import warnings
from collections.abc import Callable, Iterator

import torch

from relay.codegen import naming
from relay.codegen.layout import packed_groups
from relay.errors import SchemaIssue
from relay.schema import (
    Alloc,
    Field,
    FromPayload,
    Guard,
    IfNone,
    Lane,
    Layout,
    Resolve,
    Schema,
    SourceLocation,
    TargetShape,
    Unwritten,
    resolve_method,
)

_DTYPE_HINT = "torch.int64, torch.float32, torch.bfloat16"


def _got(value: object) -> str:
    """``'fp8' that is a str``: the value and its type, as attrs' messages say it."""
    return f"{value!r} that is a {type(value).__name__}"


def _is_int_dtype(dtype: object) -> bool:
    return isinstance(dtype, torch.dtype) and not (
        dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    )


@functools.cache
def _unusable(dtype: torch.dtype) -> str | None:
    """Why torch cannot hold ``dtype`` in a relay buffer (allocate, write rows, read rows)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            buf = torch.zeros((2,), dtype=dtype)
            rows = torch.ones((1,), dtype=torch.int64)
            buf[rows] = rows.to(dtype)
            buf[rows]
    # torch says why (NotImplementedError, RuntimeError, ...): its reason is the message.
    except Exception as error:  # noqa: BLE001
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {first}"
    return None


def _valid_path(path: object) -> bool:
    return isinstance(path, str) and all(
        naming.identifier_problem(part, reserved=False) is None
        for part in path.split(".")
    )


class _Collector:
    def __init__(self, schema: Schema, display: Callable[[str], str]) -> None:
        self.schema = schema
        self.display = display
        self.schema_name = (
            schema.name if isinstance(schema.name, str) else repr(schema.name)
        )
        self.issues: list[SchemaIssue] = []

    def where(self, loc: SourceLocation) -> str:
        """``schemas/eagle.py:42``, for messages that point at another declaration."""
        return f"{self.display(loc.file)}:{loc.line}"

    def add(self, field: Field | None, problem: str, fix: str) -> None:
        loc = field.declared_at if field is not None else self.schema.declared_at
        name = field.name if field is not None and isinstance(field.name, str) else None
        self.issues.append(
            SchemaIssue(
                self.display(loc.file), loc.line, self.schema_name, name, problem, fix
            )
        )


def validate(schema: Schema, display: Callable[[str], str]) -> list[SchemaIssue]:
    """Every issue of ``schema``; ``display`` spells a declaration's file as messages show it."""
    c = _Collector(schema, display)
    if not naming.is_identifier(schema.name):
        c.add(
            None,
            f"schema name must be a Python identifier (got {_got(schema.name)})",
            'name the schema like a class, e.g. name="DecodeFutureMap"',
        )
    if not _valid_path(schema.indices):
        c.add(
            None,
            f"indices must be a dotted attribute path such as 'req_pool_indices' "
            f"(got {_got(schema.indices)})",
            'write indices="req_pool_indices"',
        )
    for owner, problem, fix in _name_and_doc_problems(schema):
        c.add(owner, problem, fix)
    if not schema.fields:
        c.add(
            None,
            "a schema needs at least one field (got none)",
            "add a Field(...) to fields=[...], or delete the schema module",
        )
        return c.issues
    for field in schema.fields:
        if not isinstance(field, Field):
            c.add(
                None,
                f"fields must hold Field declarations (got {_got(field)})",
                'declare each field as Field("name", lane=..., dtype=...)',
            )
            continue
        _check_field(c, field)
    fields = [f for f in schema.fields if isinstance(f, Field)]
    _check_unique(c, fields)
    _check_layout(c)
    _check_docs(c, fields)
    _check_parents(c, fields)
    _check_seeds_and_owners(c, fields)
    _check_counted_scatters(c, fields)
    _check_partial_and_tails(c, fields)
    _check_lanes_apart(c, fields)
    return c.issues


def _check_handover(c: _Collector, f: Field) -> None:
    """``unwritten`` and ``target_shape``: what a row holds first, what a target gets."""
    if not isinstance(f.unwritten, Unwritten):
        c.add(
            f,
            f"unwritten must be Unwritten.REFUSED or Unwritten.ZEROS (got {_got(f.unwritten)})",
            "write unwritten=Unwritten.ZEROS where a row never written reads as zeros",
        )
    if not isinstance(f.target_shape, TargetShape):
        c.add(
            f,
            "target_shape must be TargetShape.ROWS or TargetShape.FLAT "
            f"(got {_got(f.target_shape)})",
            "write target_shape=TargetShape.FLAT to hand the target (n * row,)",
        )
    elif f.target_shape is TargetShape.FLAT:
        if f.resolve is not Resolve.GATHER or f.target is None:
            c.add(
                f,
                "target_shape=TargetShape.FLAT flattens gathered rows, so it needs "
                f"resolve=Resolve.GATHER and a target (got resolve={f.resolve}, "
                f"target={f.target!r})",
                "leave target_shape out, or gather the field into a target",
            )
        elif isinstance(f.shape, tuple) and not f.shape:
            c.add(
                f,
                "target_shape=TargetShape.FLAT flattens the row dims into the batch "
                "dim, but the field's rows have none (shape=())",
                "leave target_shape out: one value per slot is already flat",
            )


def _check_parents(c: _Collector, fields: list[Field]) -> None:
    """``optional_parents``: attributes of the batch that hold resolve targets."""
    parents = c.schema.optional_parents
    fix = 'write optional_parents={"spec_info": IfNone.SKIP}'
    if not isinstance(parents, tuple) or not all(
        isinstance(p, tuple) and len(p) == 2 for p in parents
    ):
        c.add(None, f"optional_parents must be a dict (got {_got(parents)})", fix)
        return
    firsts = {_first(f.target) for f in fields if _nested(f.target)}
    for name, how in parents:
        if not isinstance(how, IfNone):
            c.add(
                None,
                f"optional_parents[{name!r}] must be an IfNone (got {_got(how)})",
                fix,
            )
        slots = [
            p
            for p in (c.schema.indices, c.schema.schedule_indices)
            if isinstance(p, str)
        ]
        if not isinstance(name, str) or (
            name not in firsts and not any(name in (p.split(".")[0], p) for p in slots)
        ):
            c.add(
                None,
                f"optional_parents names {name!r}, which is the first part of no "
                "target path, nor of indices (or schedule_indices), nor the indices "
                "path itself",
                'name the batch attribute a target goes through, e.g. "spec_info", '
                'or the slots path, e.g. "spec_info.future_indices"',
            )
    named = {name for name, _ in parents}
    for f in fields:
        for role in ("host_mirror", "host_sum"):
            path = getattr(f, role)
            if _nested(path) and path.split(".")[0] in named:
                c.add(
                    f,
                    f"{role} {path!r} goes through an optional parent; a host copy "
                    "is handed over whatever the batch holds",
                    f"give {role} a path outside {path.split('.')[0]!r}",
                )
        if f.lane is Lane.SCHEDULE and _nested(f.target) and _first(f.target) in named:
            c.add(
                f,
                f"target {f.target!r} of a schedule field goes through an optional "
                "parent; a schedule resolve hands its value whatever the batch holds",
                "resolve schedule fields into a path outside the optional parent",
            )


def _nested(path: object) -> bool:
    return isinstance(path, str) and "." in path


def _first(path: str | None) -> str:
    return (path or "").split(".")[0]


def _check_seeds_and_owners(c: _Collector, fields: list[Field]) -> None:
    if not isinstance(c.schema.seeded, bool):
        c.add(
            None,
            f"seeded must be True or False (got {_got(c.schema.seeded)})",
            "write seeded=True",
        )
    elif c.schema.seeded and not any(
        f.lane is Lane.FORWARD and f.target is not None for f in fields
    ):
        c.add(
            None,
            "seeded=True makes seed(indices, payload) hand rows to the next "
            "resolve_future, but the schema resolves no forward-lane field",
            "leave seeded out, or give a forward-lane field a target",
        )
    owners = c.schema.owners
    if owners is not None and not _valid_path(owners):
        c.add(
            None,
            f"owners must be a dotted attribute path of the batch such as 'rids' "
            f"(got {_got(owners)})",
            'write owners="rids" (each row\'s request id), or leave it out',
        )
    _check_owners_parent(c, "owners", owners, "every write and resolve")
    # What a resolve reads (the owners, a scatter's offsets) must not be what a resolve
    # writes: the first resolve would overwrite it before it is read.
    written = {
        path: f
        for f in fields
        for path in (f.target, f.host_mirror, f.host_sum)
        if isinstance(path, str)
    }
    read: list[tuple[Field | None, str, object]] = [(None, "owners", owners)]
    read += [(f, "offsets", f.offsets) for f in fields]
    for field, what, path in read:
        if isinstance(path, str) and path in written:
            c.add(
                field,
                f"{what}={path!r} is also where {written[path].name!r} resolves to: "
                "the resolve would overwrite it before reading it",
                f"read {what} from a batch attribute no field writes",
            )


def _check_owners_parent(
    c: _Collector, option: str, owners: str | None, when: str
) -> None:
    """Owners are read whatever the batch holds, so no optional parent may hold them."""
    parents = (
        {p for p, _ in c.schema.optional_parents}
        if isinstance(c.schema.optional_parents, tuple)
        else set()
    )
    if _valid_path(owners) and (
        owners in parents or (_nested(owners) and _first(owners) in parents)
    ):
        c.add(
            None,
            f"{option}={owners!r} goes through an optional parent; debug mode reads the "
            f"owners of {when}, whatever the batch holds",
            f"name an attribute outside optional_parents for {option}",
        )


def _check_docs(c: _Collector, fields: list[Field]) -> None:
    """Doc strings reach the module as doc strings: refuse what Python cannot hold."""
    owners: list[tuple[Field | None, object]] = [(None, c.schema.doc)]
    owners += [(f, f.doc) for f in fields]
    for owner, doc in owners:
        if isinstance(doc, str) and (problem := naming.doc_problem(doc)) is not None:
            c.add(owner, f"doc {problem}", "keep doc strings to text UTF-8 can encode")


def _check_layout(c: _Collector) -> None:
    layout = c.schema.layout
    if not isinstance(layout, Layout):
        c.add(
            None,
            f"layout must be Layout.SEPARATE or Layout.PACKED (got {_got(layout)})",
            "write layout=Layout.PACKED (fields of one dtype share a buffer) or leave it out",
        )
    elif layout is Layout.PACKED and not c.issues and not packed_groups(c.schema):
        c.add(
            None,
            "layout=Layout.PACKED packs the eager, required, gathered forward-lane "
            "fields of one dtype into one buffer, but no two such fields share a dtype, so "
            "nothing would be packed",
            "leave layout out (Layout.SEPARATE), or give two such fields one dtype",
        )


def _check_field(c: _Collector, f: Field) -> None:
    _check_name(c, f)
    _check_options(c, f)
    _check_shape(c, f)
    _check_target(c, f)
    _check_handover(c, f)
    _check_left_and_late(c, f)


def _check_name(c: _Collector, f: Field) -> None:
    name = f.name
    if not isinstance(name, str) or not name.isidentifier():
        c.add(
            f,
            f"field name must be a Python identifier (got {_got(name)})",
            'use letters, digits and underscores, not starting with a digit, e.g. "topk_p"',
        )
    elif not naming.is_identifier(name):
        c.add(
            f, f"field name {name!r} is a Python keyword", f'rename it, e.g. "{name}_"'
        )
    elif name in naming.RESERVED or name.startswith(("resolve_", "_")):
        c.add(
            f,
            f"field name {name!r} clashes with a name the generated map defines or uses",
            f'rename the field, e.g. "{name.lstrip("_")}_value"',
        )
    elif (problem := naming.identifier_problem(name)) is not None:
        c.add(f, f"field name {name!r} {problem}", "rename the field")


def _check_options(c: _Collector, f: Field) -> None:
    """Lane, alloc, dtype, optional, source, resolve, guard and doc."""
    if not isinstance(f.lane, Lane):
        c.add(
            f,
            f"lane must be Lane.FORWARD or Lane.SCHEDULE (got {_got(f.lane)})",
            "write lane=Lane.FORWARD (stashed for the next forward) or lane=Lane.SCHEDULE "
            "(published for the scheduler)",
        )
    if not isinstance(f.alloc, Alloc):
        c.add(
            f,
            f"alloc must be Alloc.EAGER or Alloc.LAZY (got {_got(f.alloc)})",
            "write alloc=Alloc.EAGER (at construction) or alloc=Alloc.LAZY (first payload)",
        )
    else:
        _add_all(c, f, _alloc_problems(f))
    if not isinstance(f.dtype, (torch.dtype, FromPayload)):
        c.add(
            f,
            f"dtype must be a torch.dtype such as {_DTYPE_HINT}, or FROM_PAYLOAD "
            f"(got {_got(f.dtype)})",
            "write dtype=torch.<name>, e.g. dtype=torch.int64",
        )
    elif isinstance(f.dtype, torch.dtype):
        unusable = _unusable(f.dtype)
        if unusable is not None:
            c.add(
                f,
                f"dtype {f.dtype} cannot hold a relay buffer: torch cannot allocate it or "
                f"index its rows ({unusable})",
                f"use a dtype torch indexes, such as {_DTYPE_HINT}",
            )

    if not isinstance(f.optional, bool):
        c.add(
            f,
            f"optional must be True or False (got {_got(f.optional)})",
            "write optional=True if payloads may omit the field",
        )
    if f.source is not None and (
        not naming.is_identifier(f.source)
        or naming.identifier_problem(f.source) is not None
    ):
        c.add(
            f,
            f"source must be an identifier naming the payload attribute, not a keyword "
            f"or a reserved name (got {_got(f.source)})",
            'write source="next_token_ids", or leave it out to use the field name',
        )
    if not isinstance(f.resolve, Resolve):
        c.add(
            f,
            "resolve must be Resolve.GATHER, Resolve.PLACEHOLDER or Resolve.SCATTER "
            f"(got {_got(f.resolve)})",
            "write resolve=Resolve.GATHER, Resolve.PLACEHOLDER or Resolve.SCATTER",
        )
    if not isinstance(f.guard, Guard):
        c.add(
            f,
            f"guard must be a Guard such as Guard.POSITIVE (got {_got(f.guard)})",
            "write guard=Guard.NONE, Guard.NON_NEGATIVE, Guard.POSITIVE or Guard.FINITE",
        )
    elif isinstance(f.dtype, (torch.dtype, FromPayload)):
        _add_all(c, f, _guard_problems(f))
    if not isinstance(f.doc, str):
        c.add(f, f"doc must be a str (got {_got(f.doc)})", 'write doc="..."')


def _add_all(c: _Collector, f: Field, problems: list[Problem]) -> None:
    """The problems one rule found with ``f``."""
    for problem, fix in problems:
        c.add(f, problem, fix)


def _check_shape(c: _Collector, f: Field) -> None:
    if not isinstance(f.shape, tuple):
        c.add(
            f,
            f'shape must be a tuple of dims such as ("topk",) or (8,) '
            f"(got {_got(f.shape)})",
            'write shape=("topk",), shape=(8,) or shape=()',
        )
        return
    for dim in f.shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, str)):
            c.add(
                f,
                f"shape dims must be positive ints or symbolic names (got {_got(dim)})",
                'write shape=("topk",) or shape=(8,)',
            )
        elif isinstance(dim, int) and dim <= 0:
            c.add(
                f,
                f"shape dims must be positive (got {dim})",
                'use a size >= 1, or a symbolic name such as "topk" given at construction',
            )
        elif isinstance(dim, str) and naming.identifier_problem(dim) is not None:
            c.add(
                f,
                f"symbolic dim must be an identifier that is not reserved (got {dim!r})",
                'name the dim like a keyword argument, e.g. "topk" or "hidden"',
            )


def _check_target(c: _Collector, f: Field) -> None:
    if f.target is not None and not _valid_path(f.target):
        c.add(
            f,
            f"target must be a dotted attribute path such as 'spec_info.topk_p' "
            f"(got {_got(f.target)})",
            'write target="seq_lens" or target="spec_info.topk_p": identifiers joined by dots',
        )
    if f.lane is Lane.SCHEDULE and f.target is None:
        c.add(
            f,
            "a schedule field needs a target on the batch to resolve into (got target=None)",
            'add target="<batch attribute>", e.g. target="seq_lens"',
        )
    if isinstance(f.resolve, Resolve):
        _add_all(c, f, _placeholder_problems(f))
        _add_all(c, f, _scatter_problems(f))
    for option in ("host_mirror", "host_sum"):
        value = getattr(f, option)
        if value is None:
            continue
        if f.lane is not Lane.SCHEDULE:
            c.add(
                f,
                f"{option} mirrors a value to the scheduler's host, so it needs "
                f"lane=Lane.SCHEDULE (got lane={f.lane})",
                f"remove {option}=..., or move the field to Lane.SCHEDULE",
            )
        if not _valid_path(value):
            c.add(
                f,
                f"{option} must be a dotted attribute path such as 'seq_lens_cpu' "
                f"(got {_got(value)})",
                f'write {option}="<batch attribute>"',
            )
        elif option == "host_sum" and isinstance(f.shape, tuple) and f.shape:
            c.add(
                f,
                f"host_sum sums one value per slot, so it needs shape=() (got {f.shape!r})",
                "remove host_sum=..., or use host_mirror=... for rows",
            )
        if option == "host_sum" and (
            isinstance(f.dtype, FromPayload)
            or (
                isinstance(f.dtype, torch.dtype)
                and (f.dtype.is_floating_point or f.dtype.is_complex)
            )
        ):
            got = "FROM_PAYLOAD" if isinstance(f.dtype, FromPayload) else str(f.dtype)
            c.add(
                f,
                "host_sum hands the batch an int, so it needs a fixed integer dtype; "
                f"a float sum would be truncated (got dtype={got})",
                "give dtype=torch.int64, or remove host_sum=... and sum the host_mirror "
                "yourself",
            )


def _check_unique(c: _Collector, fields: list[Field]) -> None:
    first_name: dict[str, Field] = {}
    first_source: dict[tuple[Lane, str], Field] = {}
    first_path: dict[str, tuple[Field, str]] = {}
    first_method: dict[str, Field] = {}
    for f in fields:
        if not isinstance(f.name, str):
            continue
        if f.name in first_name:
            other = first_name[f.name]
            c.add(
                f,
                f"duplicate field name {f.name!r}; it is first declared at "
                f"{c.where(other.declared_at)}",
                "rename one of them, or delete the repeated declaration",
            )
            continue  # one mistake, one message: its source and targets repeat too
        first_name[f.name] = f
        if isinstance(f.lane, Lane) and naming.is_identifier(f.payload_name):
            key = (f.lane, f.payload_name)
            if key in first_source and first_source[key] is not f:
                other = first_source[key]
                c.add(
                    f,
                    f"payload attribute {f.payload_name!r} is also the source of "
                    f"field {other.name!r} ({c.where(other.declared_at)})",
                    'give each field its own source="..."',
                )
            else:
                first_source[key] = f
        if f.lane is Lane.SCHEDULE and _valid_path(f.host_mirror or f.target or ""):
            method = resolve_method(f)
            if method in naming.METHODS:
                c.add(
                    f,
                    f"its schedule resolve would be named {method}(), which every map "
                    "defines for another purpose",
                    "give it another target or host_mirror",
                )
            elif method in first_method:
                other = first_method[method]
                c.add(
                    f,
                    f"its schedule resolve would be named {method}(), like that of "
                    f"field {other.name!r} ({c.where(other.declared_at)})",
                    "give one of them a different target or host_mirror",
                )
            else:
                first_method[method] = f
        for role in ("target", "host_mirror", "host_sum"):
            path = getattr(f, role)
            if not _valid_path(path):
                continue
            if path in first_path and not _spans_one_target(fields, f, role):
                other, other_role = first_path[path]
                c.add(
                    f,
                    f"{role} {path!r} is also the {other_role} of field {other.name!r} "
                    f"({c.where(other.declared_at)}); two fields cannot resolve into one "
                    "attribute",
                    f"give field {f.name!r} another {role}",
                )
                continue
            first_path[path] = (f, role)
    _check_paths(c, first_path)


def _check_paths(c: _Collector, first_path: dict[str, tuple[Field, str]]) -> None:
    """Every path a field resolves into, against the others and the generated names."""
    # A path cannot be both an attribute and the owner of nested attributes, and the
    # indices attribute is read, never written.
    taken = {
        naming.payload_class(c.schema),
        naming.batch_protocol(c.schema),
        c.schema.name,
    }
    # Two owners on different paths (`a_b.x`, `a.b_x`) may camel-case to one Protocol name.
    protocols: dict[str, tuple[tuple[str, ...], Field]] = {}
    # Each owner prefix, with the first path that goes through it: one pass, not a
    # comparison of every path with every other (1,000-field schemas stay fast).
    through: dict[str, str] = {}
    for other_path in first_path:
        other_parts = other_path.split(".")
        for depth in range(1, len(other_parts)):
            through.setdefault(".".join(other_parts[:depth]), other_path)
    for path, (f, role) in first_path.items():
        parts = tuple(path.split("."))
        for depth in range(1, len(parts)):
            owner = parts[:depth]
            protocol = naming.nested_protocol(c.schema, owner)
            if protocol in taken:
                c.add(
                    f,
                    f"{role} {path!r} goes through {'.'.join(owner)!r}, whose "
                    f"generated Protocol would be named {protocol}, a name the module "
                    "already defines",
                    f"rename the attribute {parts[depth - 1]!r} on the batch",
                )
                break
            first = protocols.setdefault(protocol, (owner, f))
            if first[0] != owner:
                c.add(
                    f,
                    f"{role} {path!r} goes through {'.'.join(owner)!r}, whose generated "
                    f"Protocol would be named {protocol}, like that of {'.'.join(first[0])!r} "
                    f"(field {first[1].name!r}, {c.where(first[1].declared_at)})",
                    f"rename the attribute {parts[depth - 1]!r} on the batch, or the other one",
                )
                break
        if path in through:
            c.add(
                f,
                f"{role} {path!r} is written as a tensor but also holds "
                f"{through[path]!r}",
                f"resolve into {path}.<name> instead, or rename",
            )
        if path == c.schema.indices:
            c.add(
                f,
                f"{role} {path!r} is the attribute the map reads its slots from",
                f"choose another {role}, or set Schema(indices=...) to another attribute",
            )


#: A field's problem: (what is wrong, with the value given; the fix).
Problem = tuple[str, str]


def _alloc_problems(f: Field) -> list[Problem]:
    if f.alloc is Alloc.EAGER and isinstance(f.dtype, FromPayload):
        return [
            (
                (
                    "dtype=FROM_PAYLOAD needs a lazily allocated field, but alloc is "
                    "Alloc.EAGER"
                ),
                "add alloc=Alloc.LAZY, or give a fixed dtype such as torch.bfloat16",
            )
        ]
    return []


def _guard_problems(f: Field) -> list[Problem]:
    if not isinstance(f.dtype, torch.dtype):
        return []  # a payload dtype: checked when the first payload arrives
    if f.guard is Guard.FINITE and not f.dtype.is_floating_point:
        return [
            (
                (
                    "guard=Guard.FINITE refuses NaN and infinities, which only floating "
                    f"values hold (got dtype={f.dtype})"
                ),
                (
                    "remove the guard, or give the field a floating dtype such as "
                    "torch.bfloat16"
                ),
            )
        ]
    comparison = f.guard in (Guard.POSITIVE, Guard.NON_NEGATIVE)
    if comparison and (f.dtype == torch.bool or f.dtype.is_complex):
        return [
            (
                (
                    f"guard={f.guard} compares values with 0, which {f.dtype} values "
                    f"cannot be checked by (got guard={f.guard} with dtype={f.dtype})"
                ),
                "remove the guard, or give the field a real integer or float dtype",
            )
        ]
    return []


def _scatter_problems(f: Field) -> list[Problem]:
    """``Resolve.SCATTER``: rows into a flat forward target at per-request offsets."""
    if f.resolve is not Resolve.SCATTER:
        if f.offsets is not None:
            return [
                (
                    (
                        f"offsets names where scattered rows start, but resolve is "
                        f"{f.resolve} (got offsets={f.offsets!r})"
                    ),
                    "add resolve=Resolve.SCATTER, or remove offsets=...",
                )
            ]
        return []
    found: list[Problem] = []
    if not _valid_path(f.offsets):
        found.append(
            (
                (
                    "resolve=Resolve.SCATTER needs offsets, the batch tensor of each row's "
                    f"start offset in the target (got offsets={f.offsets!r})"
                ),
                'add offsets="query_start_loc" (one start per row)',
            )
        )
    if f.lane is not Lane.FORWARD or f.target is None or f.optional is True:
        found.append(
            (
                (
                    "resolve=Resolve.SCATTER writes a required forward-lane field into its "
                    f"target (got lane={f.lane}, target={f.target!r}, optional={f.optional})"
                ),
                "make the field a required forward-lane field with a target",
            )
        )
    if isinstance(f.shape, tuple) and len(f.shape) > 1:
        found.append(
            (
                (
                    "resolve=Resolve.SCATTER lays one value or one row of values per "
                    f"request into a flat target (got shape={f.shape!r})"
                ),
                "give the field shape=() or one row dim such as (1 + drafts,)",
            )
        )
    if isinstance(f.dtype, FromPayload):
        found.append(
            (
                (
                    "resolve=Resolve.SCATTER writes into the target's own tensor, so the "
                    "field needs a fixed dtype (got dtype=FROM_PAYLOAD)"
                ),
                "give the target's dtype, e.g. dtype=torch.int64",
            )
        )
    return found


def _placeholder_problems(f: Field) -> list[Problem]:
    """``Resolve.PLACEHOLDER``: placeholders are negative slots, one per row."""
    if f.resolve is not Resolve.PLACEHOLDER:
        return []
    found: list[Problem] = []
    if isinstance(f.dtype, FromPayload):
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs a fixed integer dtype, since "
                    "placeholders are negative slots (got dtype=FROM_PAYLOAD)"
                ),
                "give dtype=torch.int64, or use resolve=Resolve.GATHER",
            )
        )
    elif isinstance(f.dtype, torch.dtype) and not _is_int_dtype(f.dtype):
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs an integer dtype, since "
                    f"placeholders are negative slots (got {f.dtype})"
                ),
                "use resolve=Resolve.GATHER for this field",
            )
        )
    elif isinstance(f.dtype, torch.dtype) and not f.dtype.is_signed:
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs a signed integer dtype, since "
                    f"placeholders are negative slots (got {f.dtype})"
                ),
                "give a signed dtype such as torch.int64, or use resolve=Resolve.GATHER",
            )
        )
    if f.optional is True:
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs the value on every step: a step "
                    "whose payload omits an optional field would leave the placeholders "
                    "(-slot) that invalidate wrote, or a previous step's value, for the "
                    "forward (got optional=True)"
                ),
                "make the field required (optional=False), or use resolve=Resolve.GATHER",
            )
        )
    if isinstance(f.shape, tuple) and f.shape:
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs one value per slot, shape=() "
                    f"(got shape={f.shape!r})"
                ),
                "use resolve=Resolve.GATHER for rows",
            )
        )
    if f.target is None:
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs a target holding the placeholders "
                    "(got target=None)"
                ),
                'add target="input_ids" (or another batch tensor)',
            )
        )
    return found


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
    "_TABLE": "_TABLE = _rt.Table(...)",
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

#: A schema-level problem: (the declaration, or None: the schema), what, fix.
Located = tuple[Field | None, str, str]


def _name_and_doc_problems(schema: Schema) -> list[Located]:
    """Every class-name clash and every control character of ``schema``."""
    return [*_class_names(schema), *_doc_controls(schema)]


def _taken(name: str) -> str | None:
    """How the generated module already binds ``name``, if it does."""
    if name in TEMPLATE_BINDS:
        return f"a name the generated module binds itself ({TEMPLATE_BINDS[name]})"
    if name in _BUILTINS:
        return "a Python builtin the generated module would shadow"
    return None


def _class_names(schema: Schema) -> Iterator[Located]:
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


def _nested_protocols(schema: Schema) -> Iterator[Located]:
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


# --- counted scatters (Note [Counted scatters] in relay/runtime.py) ---------------------


def _spans_one_target(fields: list[Field], f: Field, role: str) -> bool:
    """Whether ``f`` shares its target with the scatter field it comes ``after``: the
    one case where two fields resolve into one attribute (``_check_counted_scatters``
    checks the rest)."""
    return (
        role == "target"
        and f.resolve is Resolve.SCATTER
        and isinstance(f.after, str)
        and any(g.name == f.after and g.target == f.target for g in fields)
    )


def _check_counted_scatters(c: _Collector, fields: list[Field]) -> None:
    """``lengths`` and ``after``: per-request counts, and several scatter fields laid
    one after another into each request's span of one target."""
    by_name = {f.name: f for f in fields if isinstance(f.name, str)}
    written = {
        path
        for f in fields
        for path in (f.target, f.host_mirror, f.host_sum)
        if isinstance(path, str)
    }
    payload = {f.payload_name: f for f in fields if f.lane is Lane.FORWARD}
    leaves: dict[str, tuple[str, Field]] = {}
    followed: dict[str, Field] = {}
    for f in fields:
        for option in ("lengths", "after"):
            value = getattr(f, option)
            if value is not None and f.resolve is not Resolve.SCATTER:
                c.add(
                    f,
                    f"{option} belongs to a scatter, but resolve is {f.resolve} (got "
                    f"{option}={value!r})",
                    f"add resolve=Resolve.SCATTER with offsets=..., or remove {option}=...",
                )
        if f.resolve is not Resolve.SCATTER:
            continue
        if f.lengths is not None:
            _check_lengths(c, f, written, payload, leaves)
        if f.after is not None:
            _check_after(c, f, by_name, followed)
    # A target's scatter fields form one chain: two that are not laid one after the
    # other would overlap (the unique-path check refuses a second field with no after).
    for f in fields:
        seen = {f.name}
        after = f.after if f.resolve is Resolve.SCATTER else None
        if after == f.name:
            continue  # refused above: after must name another field
        while isinstance(after, str) and after in by_name:
            if after in seen:
                c.add(
                    f,
                    f"after={f.after!r} leads back to {f.name!r}: the fields' places "
                    "in the span depend on each other",
                    "start the chain at a field without after=...",
                )
                break
            seen.add(after)
            after = by_name[after].after


def _check_lengths(
    c: _Collector,
    f: Field,
    written: set[str],
    payload: dict[str, Field],
    leaves: dict[str, tuple[str, Field]],
) -> None:
    if not _valid_path(f.lengths):
        c.add(
            f,
            "lengths must be a dotted attribute path of the batch holding each "
            f"request's count of values (got {_got(f.lengths)})",
            'write lengths="num_draft_tokens", or leave it out',
        )
        return
    assert isinstance(f.lengths, str)
    if f.lengths in written or f.lengths == f.offsets:
        c.add(
            f,
            f"lengths={f.lengths!r} is also where a field resolves to, or the offsets: "
            "a count must be read from a batch attribute of its own",
            "read lengths from a batch attribute no field writes",
        )
    if isinstance(f.shape, tuple) and not f.shape:
        c.add(
            f,
            "lengths counts the values of each row, but the row is one value (got "
            "shape=())",
            'give the row a width, e.g. shape=("drafts",), or remove lengths=...',
        )
    leaf = f.lengths.rsplit(".", 1)[-1]
    if f.lane is Lane.FORWARD and naming.identifier_problem(leaf) is not None:
        c.add(
            f,
            f"the stash payload carries the producer's count as {leaf!r} (the last name "
            "of lengths), a name the generated module keeps for itself",
            "name the count attribute otherwise",
        )
    clash = payload.get(leaf)
    if clash is not None:
        c.add(
            f,
            f"the stash payload carries the producer's count as {leaf!r} (the last "
            f"name of lengths), which is also the payload attribute of field "
            f"{clash.name!r} ({c.where(clash.declared_at)})",
            "name the count attribute otherwise, or give that field another source",
        )
    first = leaves.setdefault(leaf, (f.lengths, f))
    if first[0] != f.lengths:
        c.add(
            f,
            f"lengths={f.lengths!r} and {first[0]!r} (field {first[1].name!r}) both "
            f"end in {leaf!r}, the payload attribute of the producer's count",
            "give the counts different last names",
        )


def _check_after(
    c: _Collector, f: Field, by_name: dict[str, Field], followed: dict[str, Field]
) -> None:
    first = by_name.get(f.after) if isinstance(f.after, str) else None
    if first is None or first is f:
        c.add(
            f,
            f"after must name another scatter field of the schema (got {_got(f.after)})",
            "name the field whose values come first in each request's span",
        )
        return
    if (
        first.resolve is not Resolve.SCATTER
        or first.target != f.target
        or first.offsets != f.offsets
    ):
        c.add(
            f,
            f"after={first.name!r} lays this field's values after that field's in each "
            f"request's span, so both scatter into one target from one offsets (got "
            f"{first.name!r}: resolve={first.resolve}, target={first.target!r}, "
            f"offsets={first.offsets!r}; this field: target={f.target!r}, "
            f"offsets={f.offsets!r})",
            f"give both resolve=Resolve.SCATTER, target={first.target!r} and "
            f"offsets={first.offsets!r}",
        )
    other = followed.setdefault(first.name, f)
    if other is not f:
        c.add(
            f,
            f"after={first.name!r}, like field {other.name!r} "
            f"({c.where(other.declared_at)}): both would start at the same place",
            f"lay it after {other.name!r} instead",
        )


# --- graph-written buffers, kept fields, stream-ordered reads, late-bound tails -----------


def _check_left_and_late(c: _Collector, f: Field) -> None:
    """``graph_written``, ``kept``, ``stream_ordered`` and the ``tails`` options."""
    for option in ("graph_written", "kept", "stream_ordered"):
        if not isinstance(getattr(f, option), bool):
            c.add(
                f,
                f"{option} must be True or False (got {_got(getattr(f, option))})",
                f"write {option}=True, or leave it out",
            )
    for option in ("tails", "tails_kv", "tails_kv_table", "tails_prefix"):
        value = getattr(f, option)
        if value is not None and not _valid_path(value):
            c.add(
                f,
                f"{option} must be a dotted attribute path of the batch (got "
                f"{_got(value)})",
                f'write {option}="{_TAILS_EXAMPLE[option]}", or leave it out',
            )
    _add_all(c, f, _graph_problems(c.schema, f))
    if f.kept is True and f.lane is Lane.SCHEDULE:
        c.add(
            f,
            "kept=True keeps a forward field's rows through a partial stash, but this "
            "field is on the schedule lane, which no stash writes",
            "remove kept=True, or move the field to lane=Lane.FORWARD",
        )
    if f.stream_ordered is True and f.lane is Lane.FORWARD:
        c.add(
            f,
            "stream_ordered=True orders a schedule resolve's fence wait on the stream, "
            "but a forward-lane field has no fence (stream order is its only order)",
            "remove stream_ordered=True, or move the field to lane=Lane.SCHEDULE",
        )
    _add_all(c, f, _tails_problems(c.schema, f))


_TAILS_EXAMPLE = {
    "tails": "mix_running_indices",
    "tails_kv": "out_cache_loc",
    "tails_kv_table": "req_to_token",
    "tails_prefix": "prefix_lens",
}


def _graph_problems(schema: Schema, f: Field) -> list[Problem]:
    if f.graph_written is not True:
        return []
    problems = []
    if f.alloc is Alloc.LAZY or isinstance(f.dtype, FromPayload):
        problems.append(
            (
                (
                    "graph_written=True adopts a buffer the engine allocated before the map "
                    "(a captured graph writes it at a fixed address), so it needs "
                    f"alloc=Alloc.EAGER and a fixed dtype (got alloc={f.alloc}, "
                    f"dtype={f.dtype!r})"
                ),
                "remove alloc=Alloc.LAZY and give a torch dtype, or remove graph_written",
            )
        )
    if f.optional is True:
        problems.append(
            (
                (
                    "graph_written=True already lets a write pass None (the graph wrote the "
                    "rows), so the field cannot also be optional (None: left out)"
                ),
                "remove optional=True, or remove graph_written",
            )
        )
    packed = (
        schema.layout is Layout.PACKED
        and f.lane is Lane.FORWARD
        and f.target is not None
        and f.resolve is Resolve.GATHER
    )
    if packed:
        problems.append(
            (
                (
                    "graph_written=True adopts the engine's buffer, but layout=Layout.PACKED "
                    "makes this field's buffer a view of the map's own packed buffer"
                ),
                "declare the schema with Layout.SEPARATE, or remove graph_written",
            )
        )
    return problems


def _tails_add_problems(f: Field) -> list[Problem]:
    add = f.tails_add
    if isinstance(add, bool) or not isinstance(add, int) or add < 0:
        return [
            (
                f"tails_add must be 0 or a positive int (got {_got(add)})",
                (
                    "write tails_add=1 where the published lengths are committed ones "
                    "(a row decodes one token more), tails_add=0 where they count it"
                ),
            )
        ]
    if f.tails is None and add != 1:
        return [
            (
                (
                    f"tails_add={add!r} is what resolve_tails adds to a decode "
                    "row's published length, which needs tails=..."
                ),
                'add tails="mix_running_indices", or remove tails_add',
            )
        ]
    return []


def _untailed_problems(f: Field) -> list[Problem]:
    """Options that add to ``resolve_tails`` on a field without ``tails``."""
    if f.tails_prefix is not None:
        return [
            (
                (
                    "tails_prefix rebuilds a mixed batch's host prefix lengths in "
                    "resolve_tails, which needs tails=..."
                ),
                'add tails="mix_running_indices", or remove tails_prefix',
            )
        ]
    if f.tails_kv is not None or f.tails_kv_table is not None:
        return [
            (
                (
                    "tails_kv and tails_kv_table rebuild a mixed batch's KV write "
                    "locations in resolve_tails, which needs tails=..."
                ),
                'add tails="mix_running_indices", or remove tails_kv and tails_kv_table',
            )
        ]
    return []


def _tails_problems(schema: Schema, f: Field) -> list[Problem]:
    added = _tails_add_problems(f)
    if added:
        return added
    if f.tails is None:
        return _untailed_problems(f)
    problems = []
    if f.lane is not Lane.SCHEDULE:
        problems.append(
            (
                (
                    "tails=... rebuilds decode rows' lengths from published values, so it "
                    "needs lane=Lane.SCHEDULE"
                ),
                "move the field to lane=Lane.SCHEDULE, or remove tails",
            )
        )
    if f.optional is True:
        problems.append(
            (
                (
                    "tails=... reads the published rows of every mixed batch, so the field "
                    "cannot be optional (a publish may leave it out)"
                ),
                "remove optional=True, or remove tails",
            )
        )
    if f.shape != () or not _is_int_dtype(f.dtype):
        problems.append(
            (
                (
                    "tails=... rebuilds one length per decode row, so it needs shape=() and "
                    f"an integer dtype (got shape={f.shape!r}, dtype={f.dtype!r})"
                ),
                (
                    "declare the lengths field with shape=() and dtype=torch.int64, or "
                    "remove tails"
                ),
            )
        )
    if f.resolve is not Resolve.GATHER or f.target is None:
        problems.append(
            (
                (
                    "tails=... rebuilds the last rows of the field's gathered target, so it "
                    f"needs resolve=Resolve.GATHER and a target (got resolve={f.resolve}, "
                    f"target={f.target!r})"
                ),
                "gather the field into a target, or remove tails",
            )
        )
    return problems + _tails_host_problems(f) + _tails_path_problems(schema, f)


def _tails_host_problems(f: Field) -> list[Problem]:
    """What ``resolve_tails`` builds from the host copy needs the host mirror."""
    if f.host_mirror is not None:
        return []
    problems = []
    if f.host_sum is not None:
        problems.append(
            (
                (
                    "tails=... recomputes host_sum from the whole host copy of the lengths, "
                    "so it needs host_mirror as well"
                ),
                'add host_mirror="seq_lens_cpu", or remove host_sum',
            )
        )
    if f.tails_prefix is not None:
        problems.append(
            (
                (
                    "tails_prefix rebuilds a host list from the host copy of the "
                    "published lengths, so it needs host_mirror as well"
                ),
                'add host_mirror="seq_lens_cpu", or remove tails_prefix',
            )
        )
    return problems


def _tails_path_problems(schema: Schema, f: Field) -> list[Problem]:
    """The batch attributes ``resolve_tails`` reads and writes."""
    problems = []
    if (f.tails_kv is None) != (f.tails_kv_table is None):
        problems.append(
            (
                (
                    "tails_kv (the KV write locations) and tails_kv_table (the "
                    "request-to-token table they are read from) go together"
                ),
                (
                    'write both, e.g. tails_kv="out_cache_loc", '
                    'tails_kv_table="req_to_token", or neither'
                ),
            )
        )
    parents = (
        {p for p, _ in schema.optional_parents}
        if isinstance(schema.optional_parents, tuple)
        else set()
    )
    for option in ("tails", "tails_kv", "tails_kv_table", "tails_prefix"):
        path = getattr(f, option)
        if isinstance(path, str) and path.split(".")[0] in parents:
            problems.append(
                (
                    (
                        f"{option} {path!r} goes through an optional parent, which a "
                        "mixed batch may lack"
                    ),
                    f"name an attribute outside optional_parents for {option}",
                )
            )
    return problems


def _check_partial_and_tails(c: _Collector, fields: list[Field]) -> None:
    """Across fields: a partial stash writes something, one field binds the tails, and
    the tails' paths are no other field's targets."""
    forward = [f for f in fields if f.lane is Lane.FORWARD]
    kept = [f for f in forward if f.kept is True]
    if kept and len(kept) == len(forward):
        c.add(
            kept[0],
            "every forward field is kept=True, so stash_partial would write nothing",
            "leave kept=True off the fields a partial stash refreshes (the bonus token)",
        )
    tails = [f for f in fields if f.tails is not None]
    for f in tails[1:]:
        c.add(
            f,
            f"tails=... is also declared on field {tails[0].name!r} "
            f"({c.where(tails[0].declared_at)}); a map has one resolve_tails",
            "declare tails on the lengths field alone",
        )
    written = {
        getattr(f, role): f
        for f in fields
        for role in ("target", "host_mirror", "host_sum")
        if isinstance(getattr(f, role), str)
    }
    for f in tails[:1]:
        for option in ("tails", "tails_kv", "tails_kv_table"):
            path = getattr(f, option)
            other = written.get(path) if isinstance(path, str) else None
            if other is not None:
                c.add(
                    f,
                    f"{option} {path!r} is also where field {other.name!r} resolves "
                    f"({c.where(other.declared_at)})",
                    f"give {option} an attribute of its own",
                )


# --- the schedule lane's own slots and owners (Note [Slots per lane] in relay/schema.py) ---

#: The roles whose attribute holds slots, as ``schedule_indices`` does.
_SLOTS = frozenset({"indices", "tails"})

_LANE_EXAMPLE = {"schedule_indices": "req_pool_indices", "schedule_owners": "rids"}


def _check_lanes_apart(c: _Collector, fields: list[Field]) -> None:
    """``schedule_indices`` and ``schedule_owners``: where the schedule lane's resolves
    read their slots and requests, apart from the forward batch's."""
    schema = c.schema
    declared = [
        (option, getattr(schema, option))
        for option in ("schedule_indices", "schedule_owners")
        if getattr(schema, option) is not None
    ]
    for option, path in declared:
        if not _valid_path(path):
            c.add(
                None,
                f"{option} must be a dotted attribute path of the batch such as "
                f"{_LANE_EXAMPLE[option]!r} (got {_got(path)})",
                f'write {option}="{_LANE_EXAMPLE[option]}", or leave it out',
            )
        elif not any(f.lane is Lane.SCHEDULE for f in fields):
            c.add(
                None,
                f"{option}={path!r} names what the schedule lane's resolves read, "
                "but the schema has no schedule-lane field",
                f"leave {option} out, or add a Field(..., lane=Lane.SCHEDULE)",
            )
    valid = [(o, p) for o, p in declared if _valid_path(p)]
    if not valid or not any(f.lane is Lane.SCHEDULE for f in fields):
        return
    for f in fields:
        if f.lane is Lane.SCHEDULE and f.resolve is Resolve.PLACEHOLDER:
            c.add(
                f,
                f"a schedule-lane placeholder is written by invalidate on the forward "
                f"batch, but with {valid[0][0]} the schedule resolve hands its value "
                "to the scheduler's own object, so the placeholders would stay where "
                "they were written",
                f"resolve the field with Resolve.GATHER, or leave {valid[0][0]} out",
            )
    _check_lane_roles(c, fields, valid)
    owners = schema.schedule_owners
    _check_owners_parent(c, "schedule_owners", owners, "every schedule resolve")
    if not c.issues:
        _check_lane_protocols(c, fields)


def _check_lane_roles(
    c: _Collector, fields: list[Field], declared: list[tuple[str, str]]
) -> None:
    """A lane's slots or owners attribute is read as such, so it is no other role's
    attribute, nor an object another path goes through (or goes through one)."""
    schema = c.schema
    roles: list[tuple[Field | None, str, object]] = [
        (None, "indices", schema.indices),
        (None, "owners", schema.owners),
        *((None, o, p) for o, p in declared),
    ]
    for f in fields:
        for role in (
            "target",
            "host_mirror",
            "host_sum",
            "offsets",
            "lengths",
            "tails",
            "tails_kv",
            "tails_kv_table",
        ):
            roles.append((f, role, getattr(f, role)))
    reported: set[frozenset[str]] = set()
    for option, path in declared:
        for owner, role, other in roles:
            if role == option or not isinstance(other, str):
                continue
            if owner is None and frozenset((role, option)) in reported:
                continue  # schedule_indices against schedule_owners, once
            if other == path and {role, option} <= {"owners", "schedule_owners"}:
                continue  # both lanes may read one owners attribute
            if other == path and option == "schedule_indices" and role in _SLOTS:
                continue  # slots read as slots: one attribute may serve both
            whose = f"the {role} of field {owner.name!r}" if owner else f"the {role}"
            if other == path:
                problem = f"{option}={path!r} is also {whose}"
            elif other.startswith(path + "."):
                problem = f"{option}={path!r} also holds {other!r}, {whose}"
            elif path.startswith(other + "."):
                problem = f"{option}={path!r} goes through {other!r}, {whose}"
            else:
                continue
            reported.add(frozenset((role, option)))
            c.add(
                None,
                f"{problem}; the schedule lane reads it as its "
                + ("slots" if option == "schedule_indices" else "request ids"),
                f"give {option} a batch attribute of its own",
            )


def _check_lane_protocols(c: _Collector, fields: list[Field]) -> None:
    """The schedule lane's Protocols (``<Stem>ScheduleBatch`` and a ``<Stem>Schedule...``
    per nested object) take no name the module already binds or the forward batch's
    Protocols take."""
    schema = c.schema
    forward_paths = [schema.indices, schema.owners]
    schedule_paths = [schema.slots_of(Lane.SCHEDULE), schema.owners_of(Lane.SCHEDULE)]
    for f in fields:
        mine = [f.target, f.host_mirror, f.host_sum]
        if f.lane is Lane.SCHEDULE:
            schedule_paths += mine
        else:
            forward_paths += [*mine, f.offsets, f.lengths]
        if f.tails is not None:
            forward_paths += [*mine, f.tails, f.tails_kv, f.tails_kv_table]
    bound: dict[str, str] = {
        schema.name: "the map class",
        naming.payload_class(schema): "its payload class",
        naming.batch_protocol(schema): "its batch Protocol",
    }
    for path in forward_paths:
        if isinstance(path, str):
            steps = tuple(path.split("."))
            for depth in range(1, len(steps)):
                protocol = naming.nested_protocol(schema, steps[:depth])
                through = ".".join(steps[:depth])
                bound.setdefault(protocol, f"the Protocol of the batch's {through!r}")
    minted: list[tuple[str, str, tuple[str, ...]]] = [
        (naming.schedule_protocol(schema), "the schedule lane's batch", ())
    ]
    for path in schedule_paths:
        if isinstance(path, str):
            parts = tuple(path.split("."))
            for depth in range(1, len(parts)):
                name = naming.nested_protocol(schema, parts[:depth], schedule=True)
                minted.append(
                    (
                        name,
                        f"the schedule lane's {'.'.join(parts[:depth])!r}",
                        parts[:depth],
                    )
                )
    seen: dict[str, tuple[str, ...]] = {}
    for name, what, owner in minted:
        clash = _taken(name) or bound.get(name)
        if clash is None and seen.setdefault(name, owner) != owner:
            clash = "the Protocol of another schedule-side object"
        if clash is not None:
            c.add(
                None,
                f"the generated Protocol of {what} would be named {name}, which is "
                f"also {clash}",
                "rename the schema, or the batch attribute on the scheduler's side",
            )
            return
