"""Roles: every batch attribute path a schema names, with what the map does with it.

One table per schema, in declaration order: the schema's slots and owners (each
lane's; a ``Members``' requests and tail), its optional parents, then each field's
target, scatter offsets, counts and row bounds, host copy and sum, and tails paths.
Validation refuses, by one rule, a path in two roles that cannot share it, and a path
inside another role's path (Note [One role per path]); the generator's views read the
same table.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator

import attrs

from relay.schema import (
    BatchRows,
    Field,
    HostCopy,
    Lane,
    Members,
    Scatter,
    ScheduleSlots,
    Schema,
    SourceLocation,
    Tails,
    TailsKv,
)

__all__ = ["Kind", "Role", "clash", "role_table"]


class Kind(enum.Enum):
    """What the map does with a path: reads it as one kind of thing, or writes it."""

    SLOTS = "read as slots"
    OWNERS = "read as request ids"
    MEMBERS = "read as a tail of member rows"
    OFFSETS = "read as start offsets"
    ROW_STARTS = "read as every batch row's start"
    ROWS = "read as batch row numbers"
    COUNTS = "read as counts"
    FLAG = "read as a flag"
    TABLE = "read as a request-to-token table"
    PARENT = "an object that may be None"
    WRITTEN = "written"


@attrs.frozen
class Role:
    """One path of the table: where it was declared and what it is there."""

    path: str
    #: How the schema spells the declaration: ``"target"``, ``"TailsKv(table=...)"``.
    option: str
    kind: Kind
    #: The field that declares it; ``None`` for the schema's own options.
    field: Field | None
    at: SourceLocation
    #: Whether the path may go through an optional parent (a resolve that skips the
    #: field then leaves it alone); a path read or written whatever the batch holds
    #: may not.
    skippable: bool = False

    @property
    def whose(self) -> str:
        """``the target of field 'tokens'``, ``the schema's owners``."""
        if self.field is None:
            return f"the schema's {self.option}"
        return f"the {self.option} of field {self.field.name!r}"


def _path(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def role_table(schema: Schema) -> list[Role]:
    """Every path ``schema`` names, schema options first, then field by field, each
    in the order its declaration spells them; values that are not strings left out
    (validation reports them)."""
    return [r for r in _roles(schema) if _path(r.path) is not None]


def _roles(schema: Schema) -> Iterator[Role]:
    site = schema.declared_at
    yield Role(schema.indices, "indices", Kind.SLOTS, None, site, skippable=True)
    owners = schema.owners
    if isinstance(owners, Members):
        m = owners.declared_at
        yield Role(_str(owners.requests), "Members(requests=...)", Kind.OWNERS, None, m)
        yield Role(_str(owners.tail), "Members(tail=...)", Kind.MEMBERS, None, m)
    else:
        yield Role(_str(owners), "owners", Kind.OWNERS, None, site)
    lanes = schema.schedule
    if isinstance(lanes, ScheduleSlots):
        at = lanes.declared_at
        yield Role(
            lanes.indices or "",
            "ScheduleSlots(indices=...)",
            Kind.SLOTS,
            None,
            at,
            True,
        )
        yield Role(
            lanes.owners or "", "ScheduleSlots(owners=...)", Kind.OWNERS, None, at
        )
    if isinstance(schema.optional_parents, tuple):
        for pair in schema.optional_parents:
            if isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str):
                yield Role(pair[0], "optional_parents", Kind.PARENT, None, site, True)
    for f in schema.fields:
        if isinstance(f, Field):
            yield from _field_roles(f)


def _field_roles(f: Field) -> Iterator[Role]:
    at = f.declared_at
    forward = f.lane is Lane.FORWARD
    if isinstance(f.target, str):
        yield Role(f.target, "target", Kind.WRITTEN, f, at, skippable=forward)
    scatter = f.resolve
    if isinstance(scatter, Scatter):
        s = scatter.declared_at
        yield Role(
            _str(scatter.offsets), "Scatter(offsets=...)", Kind.OFFSETS, f, s, True
        )
        yield Role(
            _str(scatter.lengths), "Scatter(lengths=...)", Kind.COUNTS, f, s, True
        )
        yield Role(_str(scatter.when), "Scatter(when=...)", Kind.COUNTS, f, s, True)
        rows = scatter.rows
        if isinstance(rows, BatchRows):
            r = rows.declared_at
            yield Role(
                _str(rows.starts), "BatchRows(starts=...)", Kind.ROW_STARTS, f, r, True
            )
            yield Role(_str(rows.index), "BatchRows(index=...)", Kind.ROWS, f, r, True)
    if isinstance(f.gate, str):
        yield Role(f.gate, "gate", Kind.FLAG, f, at, skippable=True)
    host = f.host
    if isinstance(host, HostCopy):
        h = host.declared_at
        yield Role(_str(host.mirror), "HostCopy(mirror=...)", Kind.WRITTEN, f, h)
        yield Role(_str(host.sum), "HostCopy(sum=...)", Kind.WRITTEN, f, h)
    tails = f.tails
    if isinstance(tails, Tails):
        t = tails.declared_at
        yield Role(_str(tails.rows), "Tails(rows=...)", Kind.SLOTS, f, t)
        kv = tails.kv
        if isinstance(kv, TailsKv):
            k = kv.declared_at
            yield Role(_str(kv.locations), "TailsKv(locations=...)", Kind.WRITTEN, f, k)
            yield Role(_str(kv.table), "TailsKv(table=...)", Kind.TABLE, f, k)
        yield Role(_str(tails.prefix), "Tails(prefix=...)", Kind.WRITTEN, f, t)


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


# Note [One role per path]
# A batch attribute holds one thing. Two declarations may name one path only when
# both read it as the same kind of thing (the forward and the schedule lane's slots,
# two scatters' offsets), or when scatter fields chained by ``after`` share their
# target (one request's span). Any other pair would have the map read what it wrote
# or write what it reads: KV locations over the slots, counts read from the slots, a
# prefix list in the host copy's place. A path inside another (``a`` and ``a.b``)
# makes ``a`` an object, so only an optional parent may hold other paths; and a path
# read or written whatever the batch holds may not go through an optional parent.


def clash(
    first: Role, second: Role, span: bool, where: Callable[[SourceLocation], str]
) -> tuple[str, str] | None:
    """Why ``second`` cannot name the path ``first`` names (or one inside it, or one
    it is inside), and the fix; ``None`` where the two may share it. ``span``: both
    are scatter fields of one span (chained by ``after``); ``where`` spells a
    declaration's site for the message."""
    a, b = first.path, second.path
    whose = first.whose
    if first.field is not second.field or first.at != second.at:
        whose += f" ({where(first.at)})"
    if a == b:
        if first.kind is second.kind and first.kind is not Kind.WRITTEN:
            return None  # read as the same thing twice
        if span and first.option == second.option == "target":
            return None
        if Kind.PARENT in (first.kind, second.kind):
            other = second if first.kind is Kind.PARENT else first
            if other.kind is Kind.SLOTS and other.skippable:
                return None  # the slots path itself may be None: nothing to resolve
        return (
            (
                f"{second.option} {b!r} is also {whose}: one batch attribute cannot be "
                f"both ({first.kind.value} there, {second.kind.value} here)"
            ),
            _fix(second),
        )
    outer, inner = (first, second) if b.startswith(a + ".") else (second, first)
    if not inner.path.startswith(outer.path + "."):
        return None
    if outer.kind is Kind.PARENT:
        if inner.skippable:
            return None
        return (
            (
                f"{inner.option} {inner.path!r} goes through the optional parent "
                f"{outer.path!r}; it is {inner.kind.value} whatever the batch holds"
            ),
            f"name an attribute outside optional_parents for {inner.option}",
        )
    verb = "goes through" if outer is first else "also holds"
    return (
        (
            f"{second.option} {b!r} {verb} {a!r}, {whose}: that attribute cannot be "
            f"both a tensor and an object holding {inner.path.split('.')[-1]!r}"
        ),
        _fix(second),
    )


def _fix(role: Role) -> str:
    if role.field is None:
        return f"give {role.option} a batch attribute of its own"
    field = role.field.name
    return f"give the {role.option} of field {field!r} a batch attribute of its own"
