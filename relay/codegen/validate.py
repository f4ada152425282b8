"""Validation: every problem of a schema, each with its place, expectation and fix.

All checks run and all issues are returned together, so one ``relay generate``
run shows a user everything to mend. Later stages may assume a schema that passed
is well-formed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relay.codegen import bindings, groups, literals, naming
from relay.codegen.layout import packed_groups
from relay.codegen.report import (
    EXAMPLE,
    Collector,
    got,
    is_int_dtype,
    unusable_dtype,
    valid_path,
)
from relay.codegen.roles import Role, clash, role_table
from relay.errors import SchemaIssue
from relay.schema import (
    Alloc,
    Carried,
    Field,
    FromPayload,
    Guard,
    HostCopy,
    IfNone,
    Lane,
    Layout,
    Members,
    Resolve,
    Scatter,
    ScheduleSlots,
    Schema,
    SourceLocation,
    TargetShape,
    Unwritten,
    resolve_method,
)

_DTYPE_HINT = "torch.int64, torch.float32, torch.bfloat16"


def validate(schema: Schema, display: Callable[[str], str]) -> list[SchemaIssue]:
    """Every issue of ``schema``; ``display`` spells a declaration's file as messages show it."""
    c = Collector(schema, display)
    if not naming.is_identifier(schema.name):
        c.add(
            None,
            f"schema name must be a Python identifier (got {got(schema.name)})",
            'name the schema like a class, e.g. name="DecodeFutureMap"',
        )
    owners = None if isinstance(schema.owners, Members) else schema.owners
    for option, path in (("indices", schema.indices), ("owners", owners)):
        if (path is not None or option == "indices") and not valid_path(path):
            c.add(
                None,
                f"{option} must be a dotted attribute path of the batch such as "
                f"{EXAMPLE[option]!r} (got {got(path)})",
                f'write {option}="{EXAMPLE[option]}"'
                + (", or leave it out" if option == "owners" else ""),
            )
    for owner, problem, fix, at in bindings.name_and_doc_problems(schema):
        c.add(owner, problem, fix, at)
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
                f"fields must hold Field declarations (got {got(field)})",
                'declare each field as Field("name", lane=..., dtype=...)',
            )
            continue
        _check_field(c, field)
    fields = [f for f in schema.fields if isinstance(f, Field)]
    _check_unique(c, fields)
    _check_carried(c, fields)
    _check_layout(c)
    _check_docs(c, fields)
    _check_parents(c, fields)
    _check_seeded(c, fields)
    groups.check_counted_scatters(c, fields)
    _check_partial_and_tails(c, fields)
    groups.check_schedule_slots(c, fields)
    groups.check_members(c, fields)
    groups.check_switches(c, fields)
    groups.check_staged(c, fields)
    table = role_table(schema)
    _check_roles(c, table)
    for owner, problem, fix, at in bindings.protocol_clashes(schema, table, c.where):
        c.add(owner, problem, fix, at)
    return c.issues


def _check_handover(c: Collector, f: Field) -> None:
    """``unwritten`` and ``target_shape``: what a row holds first, what a target gets."""
    if not isinstance(f.unwritten, Unwritten):
        c.add(
            f,
            f"unwritten must be Unwritten.REFUSED or Unwritten.ZEROS (got {got(f.unwritten)})",
            "write unwritten=Unwritten.ZEROS where a row never written reads as zeros",
        )
    if not isinstance(f.target_shape, TargetShape):
        c.add(
            f,
            "target_shape must be TargetShape.ROWS or TargetShape.FLAT "
            f"(got {got(f.target_shape)})",
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


def _check_parents(c: Collector, fields: list[Field]) -> None:
    """``optional_parents``: attributes of the batch that hold resolve targets (what
    may go through one is the role table's rule, ``_check_roles``)."""
    parents = c.schema.optional_parents
    fix = 'write optional_parents={"spec_info": IfNone.SKIP}'
    if not isinstance(parents, tuple) or not all(
        isinstance(p, tuple) and len(p) == 2 for p in parents
    ):
        c.add(None, f"optional_parents must be a dict (got {got(parents)})", fix)
        return
    firsts = {_first(f.target) for f in fields if _nested(f.target)}
    slots: list[object] = [c.schema.indices]
    if isinstance(c.schema.schedule, ScheduleSlots):
        slots.append(c.schema.schedule.indices)
    for name, how in parents:
        if not isinstance(how, IfNone):
            c.add(
                None,
                f"optional_parents[{name!r}] must be an IfNone (got {got(how)})",
                fix,
            )
        if not isinstance(name, str) or (
            name not in firsts
            and not any(name in (_first(p), p) for p in slots if isinstance(p, str))
        ):
            c.add(
                None,
                f"optional_parents names {name!r}, which is the first part of no "
                "target path, nor of the slots (indices, ScheduleSlots(indices=...)), "
                "nor the slots path itself",
                'name the batch attribute a target goes through, e.g. "spec_info", '
                'or the slots path, e.g. "spec_info.future_indices"',
            )


def _nested(path: object) -> bool:
    return isinstance(path, str) and "." in path


def _first(path: str | None) -> str:
    return (path or "").split(".")[0]


def _check_seeded(c: Collector, fields: list[Field]) -> None:
    if not isinstance(c.schema.seeded, bool):
        c.add(
            None,
            f"seeded must be True or False (got {got(c.schema.seeded)})",
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


def _check_docs(c: Collector, fields: list[Field]) -> None:
    """Doc strings reach the module as doc strings: refuse what Python cannot hold."""
    owners: list[tuple[Field | None, object]] = [(None, c.schema.doc)]
    owners += [(f, f.doc) for f in fields]
    for owner, doc in owners:
        if isinstance(doc, str) and (problem := literals.doc_problem(doc)) is not None:
            c.add(owner, f"doc {problem}", "keep doc strings to text UTF-8 can encode")


def _check_layout(c: Collector) -> None:
    layout = c.schema.layout
    if not isinstance(layout, Layout):
        c.add(
            None,
            f"layout must be Layout.SEPARATE or Layout.PACKED (got {got(layout)})",
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


def _check_field(c: Collector, f: Field) -> None:
    _check_name(c, f)
    _check_options(c, f)
    _check_shape(c, f)
    _check_target(c, f)
    _check_handover(c, f)
    groups.check_groups(c, f)
    _check_left(c, f)


def _check_name(c: Collector, f: Field) -> None:
    name = f.name
    if not isinstance(name, str) or not name.isidentifier():
        c.add(
            f,
            f"field name must be a Python identifier (got {got(name)})",
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


def _check_options(c: Collector, f: Field) -> None:
    """Lane, alloc, dtype, optional, source, resolve, guard and doc."""
    if not isinstance(f.lane, Lane):
        c.add(
            f,
            f"lane must be Lane.FORWARD or Lane.SCHEDULE (got {got(f.lane)})",
            "write lane=Lane.FORWARD (stashed for the next forward) or lane=Lane.SCHEDULE "
            "(published for the scheduler)",
        )
    if not isinstance(f.alloc, Alloc):
        c.add(
            f,
            f"alloc must be Alloc.EAGER or Alloc.LAZY (got {got(f.alloc)})",
            "write alloc=Alloc.EAGER (at construction) or alloc=Alloc.LAZY (first payload)",
        )
    else:
        _check_alloc(c, f)
    if not isinstance(f.dtype, (torch.dtype, FromPayload)):
        c.add(
            f,
            f"dtype must be a torch.dtype such as {_DTYPE_HINT}, or FROM_PAYLOAD "
            f"(got {got(f.dtype)})",
            "write dtype=torch.<name>, e.g. dtype=torch.int64",
        )
    elif isinstance(f.dtype, torch.dtype):
        unusable = unusable_dtype(f.dtype)
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
            f"optional must be True or False (got {got(f.optional)})",
            "write optional=True if payloads may omit the field",
        )
    if f.source is not None and (
        not naming.is_identifier(f.source)
        or naming.identifier_problem(f.source) is not None
    ):
        c.add(
            f,
            f"source must be an identifier naming the payload attribute, not a keyword "
            f"or a reserved name (got {got(f.source)})",
            'write source="next_token_ids", or leave it out to use the field name',
        )
    if not isinstance(f.resolve, (Resolve, Scatter)):
        c.add(
            f,
            "resolve must be Resolve.GATHER, Resolve.PLACEHOLDER or a Scatter(...) "
            f"(got {got(f.resolve)})",
            'write resolve=Resolve.GATHER, or resolve=Scatter(offsets="query_starts")',
        )
    if not isinstance(f.guard, Guard):
        c.add(
            f,
            f"guard must be a Guard such as Guard.POSITIVE (got {got(f.guard)})",
            "write guard=Guard.NONE, Guard.NON_NEGATIVE, Guard.POSITIVE or Guard.FINITE",
        )
    elif isinstance(f.dtype, (torch.dtype, FromPayload)):
        _check_guard(c, f)
    if not isinstance(f.doc, str):
        c.add(f, f"doc must be a str (got {got(f.doc)})", 'write doc="..."')


def _check_shape(c: Collector, f: Field) -> None:
    if not isinstance(f.shape, tuple):
        c.add(
            f,
            f'shape must be a tuple of dims such as ("topk",) or (8,) '
            f"(got {got(f.shape)})",
            'write shape=("topk",), shape=(8,) or shape=()',
        )
        return
    for dim in f.shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, str)):
            c.add(
                f,
                f"shape dims must be positive ints or symbolic names (got {got(dim)})",
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


def _check_target(c: Collector, f: Field) -> None:
    if f.target is not None and not valid_path(f.target):
        c.add(
            f,
            f"target must be a dotted attribute path such as 'spec_info.topk_p' "
            f"(got {got(f.target)})",
            'write target="seq_lens" or target="spec_info.topk_p": identifiers joined by dots',
        )
    if f.lane is Lane.SCHEDULE and f.target is None:
        c.add(
            f,
            "a schedule field needs a target on the batch to resolve into (got target=None)",
            'add target="<batch attribute>", e.g. target="seq_lens"',
        )
    if isinstance(f.resolve, (Resolve, Scatter)):
        _check_placeholder(c, f)
        groups.check_scatter(c, f)
    gathered = f.resolve is Resolve.GATHER and f.target is not None
    if f.gate is not None and not (f.lane is Lane.FORWARD and f.optional and gathered):
        c.add(
            f,
            "gate=... says whether a batch's rows hold an optional gathered "
            f"forward-lane field (got gate={f.gate!r}, lane={f.lane}, "
            f"optional={f.optional}, resolve={f.resolve}, target={f.target!r})",
            "declare it on an optional forward field with a target (extra(..., "
            'gate="spec_info.future_dsa_topk_indices_available")), or remove gate=...',
        )


def _check_carried(c: Collector, fields: list[Field]) -> None:
    """A ``gate=Carried(name)`` names another optional field of the schema."""
    for f in fields:
        if not isinstance(f.gate, Carried):
            continue
        other = next((g for g in fields if g.name == f.gate.field), None)
        if other is None or other is f or not other.optional:
            c.add(
                f,
                "gate=Carried(...) names another optional field of this schema, whose "
                f"carrying this field's read follows (got field={f.gate.field!r})",
                'name an optional field declared beside it, e.g. gate=Carried("topk_p")',
            )


def _check_unique(c: Collector, fields: list[Field]) -> None:
    """Names, payload attributes and schedule resolves, each once (paths: the role
    table)."""
    first_name: dict[str, Field] = {}
    first_source: dict[tuple[Lane, str], Field] = {}
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
        mirror = f.host.mirror if isinstance(f.host, HostCopy) else None
        if f.lane is not Lane.SCHEDULE or not valid_path(mirror or f.target or ""):
            continue
        method = resolve_method(f)
        if method in naming.METHODS:
            c.add(
                f,
                f"its schedule resolve would be named {method}(), which every map "
                "defines for another purpose",
                "give it another target or HostCopy(mirror=...)",
            )
        elif method in first_method:
            other = first_method[method]
            c.add(
                f,
                f"its schedule resolve would be named {method}(), like that of "
                f"field {other.name!r} ({c.where(other.declared_at)})",
                "give one of them a different target or HostCopy(mirror=...)",
            )
        else:
            first_method[method] = f


def _check_alloc(c: Collector, f: Field, at: SourceLocation | None = None) -> None:
    if f.alloc is Alloc.EAGER and isinstance(f.dtype, FromPayload):
        c.add(
            f,
            "dtype=FROM_PAYLOAD needs a lazily allocated field, but alloc is "
            "Alloc.EAGER",
            "add alloc=Alloc.LAZY, or give a fixed dtype such as torch.bfloat16",
            at,
        )
        return
    return


def _check_guard(c: Collector, f: Field, at: SourceLocation | None = None) -> None:
    if not isinstance(f.dtype, torch.dtype):
        return  # a payload dtype: checked when the first payload arrives
    if f.guard is Guard.FINITE and not f.dtype.is_floating_point:
        c.add(
            f,
            "guard=Guard.FINITE refuses NaN and infinities, which only floating "
            f"values hold (got dtype={f.dtype})",
            "remove the guard, or give the field a floating dtype such as "
            "torch.bfloat16",
            at,
        )
        return
    comparison = f.guard in (Guard.POSITIVE, Guard.NON_NEGATIVE)
    if comparison and (f.dtype == torch.bool or f.dtype.is_complex):
        c.add(
            f,
            f"guard={f.guard} compares values with 0, which {f.dtype} values "
            f"cannot be checked by (got guard={f.guard} with dtype={f.dtype})",
            "remove the guard, or give the field a real integer or float dtype",
            at,
        )
        return
    return


def _check_placeholder(
    c: Collector, f: Field, at: SourceLocation | None = None
) -> None:
    """``Resolve.PLACEHOLDER``: placeholders are negative slots, one per row."""
    if f.resolve is not Resolve.PLACEHOLDER:
        return
    if isinstance(f.dtype, FromPayload):
        c.add(
            f,
            "resolve=Resolve.PLACEHOLDER needs a fixed integer dtype, since "
            "placeholders are negative slots (got dtype=FROM_PAYLOAD)",
            "give dtype=torch.int64, or use resolve=Resolve.GATHER",
            at,
        )
    elif isinstance(f.dtype, torch.dtype) and not is_int_dtype(f.dtype):
        c.add(
            f,
            "resolve=Resolve.PLACEHOLDER needs an integer dtype, since "
            f"placeholders are negative slots (got {f.dtype})",
            "use resolve=Resolve.GATHER for this field",
            at,
        )
    elif isinstance(f.dtype, torch.dtype) and not f.dtype.is_signed:
        c.add(
            f,
            "resolve=Resolve.PLACEHOLDER needs a signed integer dtype, since "
            f"placeholders are negative slots (got {f.dtype})",
            "give a signed dtype such as torch.int64, or use resolve=Resolve.GATHER",
            at,
        )
    if f.optional is True:
        c.add(
            f,
            "resolve=Resolve.PLACEHOLDER needs the value on every step: a step "
            "whose payload omits an optional field would leave the placeholders "
            "(-slot) that invalidate wrote, or a previous step's value, for the "
            "forward (got optional=True)",
            "make the field required (optional=False), or use resolve=Resolve.GATHER",
            at,
        )
    if isinstance(f.shape, tuple) and f.shape:
        c.add(
            f,
            "resolve=Resolve.PLACEHOLDER needs one value per slot, shape=() "
            f"(got shape={f.shape!r})",
            "use resolve=Resolve.GATHER for rows",
            at,
        )
    if f.target is None:
        c.add(
            f,
            "resolve=Resolve.PLACEHOLDER needs a target holding the placeholders "
            "(got target=None)",
            'add target="input_ids" (or another batch tensor)',
            at,
        )


# --- graph-written buffers, kept fields, late-bound tails ---------------------------------


def _check_left(c: Collector, f: Field) -> None:
    """``graph_written`` and ``kept``."""
    for option in ("graph_written", "kept"):
        if not isinstance(getattr(f, option), bool):
            c.add(
                f,
                f"{option} must be True or False (got {got(getattr(f, option))})",
                f"write {option}=True, or leave it out",
            )
    _check_graph(c, c.schema, f)
    if f.kept is True and f.lane is Lane.SCHEDULE:
        c.add(
            f,
            "kept=True keeps a forward field's rows through a partial stash, but this "
            "field is on the schedule lane, which no stash writes",
            "remove kept=True, or move the field to lane=Lane.FORWARD",
        )


def _check_graph(
    c: Collector, schema: Schema, f: Field, at: SourceLocation | None = None
) -> None:
    if f.graph_written is not True:
        return
    if f.alloc is Alloc.LAZY or isinstance(f.dtype, FromPayload):
        c.add(
            f,
            "graph_written=True adopts a buffer the engine allocated before the map "
            "(a captured graph writes it at a fixed address), so it needs "
            f"alloc=Alloc.EAGER and a fixed dtype (got alloc={f.alloc}, "
            f"dtype={f.dtype!r})",
            "remove alloc=Alloc.LAZY and give a torch dtype, or remove graph_written",
            at,
        )
    if f.optional is True:
        c.add(
            f,
            "graph_written=True already lets a write pass None (the graph wrote the "
            "rows), so the field cannot also be optional (None: left out)",
            "remove optional=True, or remove graph_written",
            at,
        )
    packed = (
        schema.layout is Layout.PACKED
        and f.lane is Lane.FORWARD
        and f.target is not None
        and f.resolve is Resolve.GATHER
    )
    if packed:
        c.add(
            f,
            "graph_written=True adopts the engine's buffer, but layout=Layout.PACKED "
            "makes this field's buffer a view of the map's own packed buffer",
            "declare the schema with Layout.SEPARATE, or remove graph_written",
            at,
        )


def _check_partial_and_tails(c: Collector, fields: list[Field]) -> None:
    """A partial stash writes something, and one field binds the tails."""
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


# --- one role per attribute path (Note [One role per path] in roles.py) -----------------


def _check_roles(c: Collector, table: list[Role]) -> None:
    """Each path of the role table against every path declared before it: the same
    path, one inside it, or one it is inside. One pass over the table with two maps
    (the roles of each path, and of each object a path goes through), so 1,000-field
    schemas stay fast. A declaration is reported once, at its line."""
    named: dict[str, list[Role]] = {}
    holding: dict[str, list[Role]] = {}  # an object -> the roles of paths inside it
    for role in table:
        if not valid_path(role.path):
            continue
        parts = role.path.split(".")
        outers = [".".join(parts[:depth]) for depth in range(1, len(parts))]
        earlier = [
            *named.get(role.path, ()),
            *(r for o in outers for r in named.get(o, ())),
            *holding.get(role.path, ()),
        ]
        for first in earlier:
            found = clash(first, role, _one_span(first, role), c.where)
            if found is not None:
                c.add(role.field, *found, role.at)
                break
        named.setdefault(role.path, []).append(role)
        for outer in outers:
            holding.setdefault(outer, []).append(role)


def _one_span(first: Role, second: Role) -> bool:
    """Both roles are the targets of scatter fields (one target's span)."""
    return (
        first.field is not None
        and second.field is not None
        and first.field.scatter is not None
        and second.field.scatter is not None
    )
