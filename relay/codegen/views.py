"""Views: exactly what the template needs, computed once from a validated schema.

The template only fills holes and loops over plain values; every decision (which
methods exist, what a line says) is made here and in ``methods.py``, in Python, where
it can be read and tested. Statements are spelled on one line each, however long: the
formatter lays the module out afterwards.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import attrs
import torch

from relay.codegen import literals, methods, naming
from relay.codegen.layout import Member, PackedGroup, packed_groups
from relay.codegen.naming import Names
from relay.schema import (
    Alloc,
    Field,
    FromPayload,
    Lane,
    Members,
    Resolve,
    Schema,
    resolve_method,
)

if TYPE_CHECKING:
    from attrs import AttrsInstance

__all__ = ["MapView", "map_view"]


# Note [Optional fields]
# An optional field is handed over by a resolve only when the latest write (stash or
# publish) carried it; otherwise the resolve sets its targets to None. That decision
# is a Python flag per field, so it costs no op and no host sync. A write that omits
# the field clears the rows it covers (one index_fill_, only once the buffer exists),
# so a later resolve that mixes those rows with rows of a carrying write reads zeros
# there, never an earlier value; debug mode reports such a read.


@attrs.frozen
class PayloadField:
    name: str
    type: str
    optional: bool
    doc: str


@attrs.frozen
class Statement:
    """A constructor statement, and the doc string of the attribute it sets."""

    code: str
    doc: str | None = None


@attrs.frozen
class Method:
    head: str
    doc: tuple[str, ...]
    body: tuple[str, ...]


@attrs.frozen
class Attribute:
    """One member of a generated Protocol."""

    name: str
    type: str
    writable: bool

    @property
    def getter(self) -> str:
        return f"def {self.name}(self) -> {self.type}: ..."


@attrs.frozen
class ProtocolView:
    name: str
    doc: str
    attributes: tuple[Attribute, ...]


@attrs.frozen
class MapView:
    module_doc: str
    cls: str
    doc: str
    payload_cls: str
    payload: tuple[PayloadField, ...]
    protocols: tuple[ProtocolView, ...]  # nested first, the batch protocol last
    exports: tuple[str, ...]
    schema_args: str
    fields: tuple[str, ...]
    init_params: str
    init: tuple[Statement, ...]
    methods: tuple[Method, ...]
    #: Names the module binds under its imports (Note [Gate constants]).
    constants: tuple[tuple[str, str], ...] = ()


def _join(opener: str, args: Sequence[str], closer: str = ")") -> str:
    return opener + ", ".join(args) + closer


# --- the table ------------------------------------------------------------------------------
# Note [One model of a field] in relay/runtime.py: the module writes its schema out as
# the schema's own declarations, every attribute that differs from its default, by
# keyword; a new option of Field or Schema is written out with no change here.

#: Attributes the table leaves out: docs go into the code's doc strings, the field
#: list is written field by field, and a declaration's site is the schema file's.
_NOT_IN_TABLE = frozenset({"doc", "fields", "declared_at"})


def _literal(value: object) -> str:
    """``value`` as the generated module spells it (``_rt`` re-exports the vocabulary)."""
    if isinstance(value, torch.dtype):
        return literals.dtype(value)
    if isinstance(value, FromPayload):
        return "_rt.FROM_PAYLOAD"
    if isinstance(value, enum.Enum):
        return f"_rt.{type(value).__name__}.{value.name}"
    if isinstance(value, str):
        return literals.string_literal(value)
    if isinstance(value, tuple):
        items = [_literal(v) for v in value]
        return _join("(", items, ",)" if len(items) == 1 else ")")
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if attrs.has(type(value)):  # a grouped declaration: ``_rt.Scatter(offsets=...)``
        return _join(f"_rt.{type(value).__name__}(", _declared(value))
    raise TypeError(f"no literal for {value!r} in a generated table")


def _declared(obj: object) -> list[str]:
    """``name=value`` for each attribute of ``obj`` that differs from its default."""
    args = []
    for a in attrs.fields(cast("type[AttrsInstance]", type(obj))):
        if a.name in _NOT_IN_TABLE:
            continue
        value = getattr(obj, a.name)
        if a.default is not attrs.NOTHING and value == a.default:
            continue
        args.append(f"{a.name}={_literal(value)}")
    return args


def _field_declaration(f: Field) -> str:
    """``_rt.Field(...)``: ``f`` as its schema declares it, its doc left out."""
    return _join("_rt.Field(", _declared(f))


def _names_tuple(dims: tuple[str, ...], *, quote: bool) -> str:
    spelled = [
        literals.string_literal(d) if quote and not d.isdigit() else d for d in dims
    ]
    return _join("(", spelled, ",)" if len(spelled) == 1 else ")")


# --- the constructor -------------------------------------------------------------------------


def _init(
    names: Names, schema: Schema, packed: Sequence[PackedGroup]
) -> list[Statement]:
    dims = list(names.dims)
    stmts = [
        Statement("self.device = device = torch.device(device)"),
        Statement('self.pool_size = _rt.check_dim(_TABLE, "pool_size", pool_size)'),
        Statement("self.debug = debug"),
        *(
            Statement(f"{d} = _rt.check_dim(_TABLE, {literals.string_literal(d)}, {d})")
            for d in dims
        ),
    ]
    made = [f for f in schema.fields if f.alloc is Alloc.EAGER]  # through ``state``
    bound = "state = self._state" if made else "self._state"
    stmts.append(Statement(f"{bound} = _rt.MapState(_TABLE, device, pool_size, debug)"))
    for k in names.switches:
        spelled = literals.string_literal(k)
        stmts.append(Statement(f"self.{k} = _rt.switch(self._state, {spelled}, {k})"))
    for g in packed:
        stmts += _group(names, g)
    member_of = {m.field.name: (g, m) for g in packed for m in g.members}
    for i, f in enumerate(schema.fields):
        stmts += _field_init(names, i, f, member_of.get(f.name))
    return stmts


def _group(names: Names, g: PackedGroup) -> list[Statement]:
    packed = f"self.{names.packed[g.dtype][0]}"
    members = ", ".join(m.field.name for m in g.members)
    args = [f"(pool_size, {g.columns})", literals.dtype(g.dtype), "device", "debug"]
    widths = literals.shape_literal(tuple(m.width for m in g.members))
    return [
        Statement(
            _join(f"{packed} = _rt.buffer(", args),
            f"Rows of {members} side by side (Note [Packed layout]).",
        ),
        Statement(f"self.{names.packed[g.dtype][1]} = {widths}"),
    ]


def _field_init(
    names: Names, i: int, f: Field, member: tuple[PackedGroup, Member] | None
) -> list[Statement]:
    """Field ``i``'s buffer, made or adopted by the map's state (which fills it with
    zeros or debug mode's poison, as the field declares)."""
    buf = f"self.{names.buffer[f.name]}"
    doc = names.doc[f.name]
    if member is not None:
        view = _packed_column(names, f, *member)
        stmts = [Statement(f"{buf} = state.adopt({i}, {view})", doc)]
    elif f.alloc is Alloc.LAZY:
        stmts = []  # a property over the map's state (``_lazy_buffers``)
    elif f.graph_written:  # the engine's buffer, if it hands one over
        assert isinstance(f.dtype, torch.dtype)
        args = ["state", str(i), names.buffer[f.name], names.eager_shape[f.name]]
        args.append(names.dtype[f.name])
        stmts = [Statement(_join(f"{buf} = _rt.adopted(", args), doc)]
    else:
        assert isinstance(f.dtype, torch.dtype)
        args = [str(i), names.eager_shape[f.name], names.dtype[f.name]]
        stmts = [Statement(_join(f"{buf} = state.buffer(", args), doc)]
    if f.host is not None and (f.host.mirror or f.host.sum):
        host = f"self.{names.host[f.name]} = _rt.HostMirror(device, pool_size)"
        stmts.append(Statement(host))
    return stmts


def _packed_column(names: Names, f: Field, group: PackedGroup, member: Member) -> str:
    """The field's fixed view of its group's buffer (Note [Packed layout])."""
    packed = f"self.{names.packed[group.dtype][0]}"
    if not f.shape:
        return _join(f"{packed}.select(", ["1", member.start])
    narrow = ["1", member.start, member.width]
    if len(f.shape) == 1:
        return _join(f"{packed}.narrow(", narrow)
    dims = literals.shape_literal(tuple(str(d) for d in f.shape))
    columns = _join(f"{packed}.narrow(", narrow)
    # torch.unflatten, not the method: torch types the function, not Tensor.unflatten.
    return _join("torch.unflatten(", [columns, "1", dims])


# --- the methods ------------------------------------------------------------------------------


_STASH_DOC = (
    "Forward lane: write ``payload`` into rows ``indices`` at the end of a forward.",
)
_PUBLISH_DOC = (
    "Schedule lane: write rows ``indices``, then record the fence the scheduler waits on.",
)
_SEED_DOC = (
    "Rows for requests prebuilt elsewhere: the next ``resolve_future`` writes them first.",
)
_PARTIAL_DOC = (
    "Forward lane: write only the fields not kept into rows ``indices``; kept rows stay.",
)
_GRAPH_DOC = (
    "A captured graph wrote rows ``indices`` of the graph-written fields (debug mode's record).",
)
_RELEASE_DOC = (
    "The requests in slots ``indices`` ended (debug mode marks unread rows stale).",
)


def _read_doc(bodies: methods.Bodies, f: Field) -> list[str]:
    lines = [bodies.read_doc[f.name]] if f.target is not None else []
    if f.host is not None and f.host.mirror:
        lines.append(f"- ``batch.{f.host.mirror}``: a host copy of it.")
    if f.host is not None and f.host.sum:
        lines.append(f"- ``batch.{f.host.sum}``: the sum of it on the host.")
    return [literals.doc_text(line) for line in lines]


def _writes(names: Names, schema: Schema, bodies: methods.Bodies) -> list[Method]:
    """``stash``, ``publish``, ``invalidate`` and ``seed``, those the schema has."""
    forward = _lane(schema, Lane.FORWARD)
    declared = _lane(schema, Lane.SCHEDULE)
    # Required parameters first (Python's rule); the checked path takes the values in
    # declaration order, as the table has them.
    schedule = _required_first(declared)
    owners = ", owners: _rt.Owners | None = None" if schema.owners else ""
    passed = ", owners" if schema.owners else ""
    # publish takes the requests its lane's resolves check (Note [Slots per lane])
    published = schema.owners_of(Lane.SCHEDULE) is not None
    payload = f"payload: {names.payload_cls}"
    found = []
    if forward:
        head = f"def stash(self, indices: torch.Tensor, {payload}{owners}) -> None:"
        found.append(Method(head, _STASH_DOC, bodies.stash))
    if schedule:
        params = _value_params(schedule)
        if published:
            params.append("owners: _rt.Owners | None = None")
        head = _join("def publish(", ["self", "indices: torch.Tensor", *params], ")")
        found.append(Method(f"{head} -> None:", _PUBLISH_DOC, bodies.publish))
    partial = [f for f in forward if not f.kept]
    if len(partial) < len(forward):
        params = _value_params(_required_first(partial))
        if schema.owners:
            params.append("owners: _rt.Owners | None = None")
        head = _join("def stash_partial(", ["self", "indices: torch.Tensor", *params])
        found.append(Method(f"{head} -> None:", _PARTIAL_DOC, bodies.stash_partial))
    if any(f.graph_written for f in schema.fields):
        either = schema.owners is not None or published
        taken = ", owners: _rt.Owners | None = None" if either else ""
        head = f"def graph_wrote(self, indices: torch.Tensor{taken}) -> None:"
        found.append(Method(head, _GRAPH_DOC, bodies.graph_wrote))
    placeholders = [f for f in schema.fields if f.resolve is Resolve.PLACEHOLDER]
    if placeholders:
        doc = [
            "Write placeholders ``-indices`` where the next forward's values will go.",
            "",
            *(f"- ``batch.{f.target}``." for f in placeholders),
        ]
        batch = f"batch: {names.batch}"
        head = f"def invalidate(self, {batch}, indices: torch.Tensor) -> None:"
        found.append(Method(head, tuple(doc), bodies.invalidate))
    if schema.seeded:
        head = f"def seed(self, indices: torch.Tensor, {payload}{owners}) -> None:"
        call = (f"_rt.seed(self._state, indices, payload{passed})",)
        found.append(Method(head, _SEED_DOC, call))
    return found


def _required_first(fields: Sequence[Field]) -> list[Field]:
    return [f for f in fields if not f.optional] + [f for f in fields if f.optional]


def _value_params(fields: Sequence[Field]) -> list[str]:
    """A write's value parameters: an optional field's defaults to ``None``; a
    graph-written field's may be ``None`` (the graph wrote the rows) but is required."""
    return [
        f"{f.payload_name}: "
        + (
            "torch.Tensor | None = None"
            if f.optional
            else "torch.Tensor | None"
            if f.graph_written
            else "torch.Tensor"
        )
        for f in fields
    ]


def _lazy_buffers(names: Names, schema: Schema) -> list[Method]:
    """A lazy field's ``<name>_buf``: a read-only property over the map's state, where
    the runtime puts the buffer it allocates on the first write that carries one."""
    found = []
    for i, f in enumerate(schema.fields):
        if f.alloc is Alloc.LAZY:
            head = f"@property\n    def {names.buffer[f.name]}(self) -> torch.Tensor | None:"
            doc = (names.doc[f.name],)
            found.append(Method(head, doc, (f"return self._state.buffers[{i}]",)))
    return found


def _lane(schema: Schema, lane: Lane) -> list[Field]:
    return [f for f in schema.fields if f.lane is lane]


def _methods(names: Names, schema: Schema, bodies: methods.Bodies) -> list[Method]:
    batch = f"batch: {names.batch}"
    forward = _lane(schema, Lane.FORWARD)
    found = [*_lazy_buffers(names, schema), *_writes(names, schema, bodies)]
    head = "def release(self, indices: torch.Tensor) -> None:"
    found.append(Method(head, _RELEASE_DOC, bodies.release))
    if schema.staged is not None:
        found.append(_staged(names, schema))
    reads = [f for f in forward if f.target is not None]
    if reads:
        found.append(_resolve_future(schema, reads, bodies, batch))
    if schema.lanes_apart:  # Note [Slots per lane] in relay/schema.py
        scheduler = f"batch: {names.schedule_batch}"
    else:
        scheduler = batch
    for f in _lane(schema, Lane.SCHEDULE):
        name = resolve_method(f)
        doc = [
            f"Schedule lane: wait for the newest ``publish``, then resolve ``{f.name}``.",
            "",
            f"With ``indices = batch.{schema.slots_of(Lane.SCHEDULE)}``:",
            "",
            *_read_doc(bodies, f),
        ]
        ordered = f.host is not None and f.host.stream_ordered
        if ordered:
            doc += [
                "",
                "``stream_ordered=True`` orders the read on the calling stream",
                "(a device-side wait) instead of blocking the host.",
            ]
        body = bodies.schedule[f.name]
        params = f"{scheduler}, stream_ordered: bool = False" if ordered else scheduler
        if f.host is not None and f.host.optional:
            params += ", host: bool = True"
            doc += [
                "",
                "``host=False``: no host copy (the mirror and the sum are ``None``), and",
                "the host waits for none.",
            ]
        found.append(Method(f"def {name}(self, {params}) -> None:", tuple(doc), body))
        if f.tails is not None:
            found.append(_resolve_tails(names, f, bodies, batch))
    return found


def _staged_members(schema: Schema) -> list[tuple[str, str, Field | None]]:
    """What a ``Staged`` method sets on the draft input it fills: the slots' leaf, then
    each per-batch gate's leaf; name, type, the gated field."""
    slots = schema.indices.rsplit(".", 1)[1]
    optional = any(p == schema.indices for p, _how in schema.optional_parents)
    found: list[tuple[str, str, Field | None]] = [
        (slots, "torch.Tensor | None" if optional else "torch.Tensor", None)
    ]
    for f in schema.fields:
        if isinstance(f.gate, str):
            found.append((f.gate.rsplit(".", 1)[1], "bool", f))
    return found


def _staged_protocol(names: Names, schema: Schema) -> ProtocolView:
    parent = schema.indices.rsplit(".", 1)[0]
    doc = f"A fresh ``batch.{parent}`` the map fills for staged requests."
    attributes = (Attribute(n, t, True) for n, t, _f in _staged_members(schema))
    return ProtocolView(names.staged, literals.doc_text(doc), tuple(attributes))


def _staged(names: Names, schema: Schema) -> Method:
    """The ``Staged`` method: the slots, and each gate set to whether the map carries
    its field now (a kept field once carried stays carried)."""
    assert schema.staged is not None
    parent = schema.indices.rsplit(".", 1)[0]
    handle = f"handle: {names.staged}"
    head = f"def {schema.staged.method}(self, indices: torch.Tensor, {handle}) -> None:"
    doc = [
        f"Fill ``handle``, a fresh ``batch.{parent}`` for requests whose rows the map",
        "holds already; the next ``resolve_future`` reads them.",
        "",
    ]
    body = []
    for name, _type, f in _staged_members(schema):
        if f is None:
            doc.append(f"- ``handle.{name} = indices``.")
            body.append(f"handle.{name} = indices")
        else:
            i = schema.fields.index(f)
            doc.append(f"- ``handle.{name}``: whether the map carries ``{f.name}``.")
            body.append(f"handle.{name} = self._state.carried[{i}]")
    return Method(head, tuple(literals.doc_text(d) for d in doc), tuple(body))


def _tails_attributes(f: Field) -> list[tuple[str, str, bool]]:
    """What ``resolve_tails`` reads (the slots, the table) and rebinds (the KV write
    locations, the prefix list) besides the target and host mirror: path, type,
    writable."""
    tails = f.tails
    if tails is None:
        return []
    found = [(tails.rows, "torch.Tensor", False)]
    if tails.kv is not None:
        found += [(tails.kv.locations, "torch.Tensor", True)]
        found += [(tails.kv.table, "torch.Tensor", False)]
    if tails.prefix is not None:
        found.append((tails.prefix, "list[int]", True))
    return found


def _resolve_tails(
    names: Names, f: Field, bodies: methods.Bodies, batch: str
) -> Method:
    tails = f.tails
    assert tails is not None
    mirror, total = (f.host.mirror, f.host.sum) if f.host else (None, None)
    doc = [
        "Late-bind a mixed batch's decode tails from the published ``"
        + f.name
        + "``, on the stream.",
        "",
        f"With ``indices = batch.{tails.rows}`` (the batch's last rows):",
        "",
        (
            f"- the last rows of ``batch.{f.target}``: "
            f"``{literals.plus(f'{names.buffer[f.name]}[indices]', tails.add)}``."
        ),
    ]
    if tails.kv is not None:
        at = literals.plus(f"{names.buffer[f.name]}[indices]", tails.add - 1)
        doc.append(
            f"- the last rows of ``batch.{tails.kv.locations}``: "
            f"``batch.{tails.kv.table}[indices, {at}]``."
        )
    if mirror is not None:
        doc.append(f"- the last rows of ``batch.{mirror}``: a host copy.")
    if total is not None:
        doc.append(f"- ``batch.{total}``: the sum of the host copy.")
    if tails.prefix is not None:
        prefix = literals.plus(f"{names.buffer[f.name]}[indices]", tails.add - 1)
        doc.append(
            f"- the last entries of the list ``batch.{tails.prefix}``: "
            f"``{prefix}``, from the host copy."
        )
    head = f"def resolve_tails(self, {batch}) -> None:"
    doc_lines = tuple(literals.doc_text(line) for line in doc)
    return Method(head, doc_lines, bodies.resolve_tails)


def _resolve_future(
    schema: Schema, reads: list[Field], bodies: methods.Bodies, batch: str
) -> Method:
    doc = [
        "Forward lane: hand the previous forward's stash to ``batch``, on the forward stream.",
        "",
        f"With ``indices = batch.{schema.indices}``:",
        "",
        *(line for f in reads for line in _read_doc(bodies, f)),
    ]
    head = f"def resolve_future(self, {batch}) -> None:"
    if bodies.partial_read:  # Note [Partial reads] in relay/codegen/methods.py
        kept = ", ".join(f"``{f.name}``" for f in reads if f.kept)
        head = f"def resolve_future(self, {batch}, *, partial: bool = False) -> None:"
        partial = (
            f"``partial=True`` reads only what ``stash_partial`` writes: {kept} are "
            "handed ``None`` and their rows stay for the next full read."
        )
        doc += ["", partial]
    return Method(head, tuple(doc), bodies.resolve_future)


# --- protocols and the whole view -------------------------------------------------------------


def _protocols(names: Names, schema: Schema) -> tuple[ProtocolView, ...]:
    """Batch protocols: one per object on a dotted path, members in first-use order;
    where the schema names the schedule lane's slots or owners, the schedule lane's
    batch apart (Note [Slots per lane] in relay/schema.py)."""
    if not schema.lanes_apart:
        return _protocol_set(names, schema, None)
    return _protocol_set(names, schema, Lane.FORWARD) + _protocol_set(
        names, schema, Lane.SCHEDULE
    )


def _read_only(f: Field) -> list[tuple[str, str]]:
    """What a resolve of ``f`` only reads on the batch besides its slots: a scatter's
    offsets, counts, flags and row bounds, a gate; path and type."""
    found = [(f.gate, "bool")] if isinstance(f.gate, str) else []
    scatter = f.scatter
    if scatter is not None:
        rows = scatter.rows
        paths = [scatter.offsets, scatter.lengths, scatter.when]
        paths += [rows.starts, rows.index] if rows is not None else []
        found += [(p, "torch.Tensor") for p in paths if p is not None]
    return found


def _protocol_set(
    names: Names, schema: Schema, lane: Lane | None
) -> tuple[ProtocolView, ...]:
    """The protocols of one batch: the whole map's (``lane`` None), the forward
    batch's (``resolve_future``, ``invalidate``, ``resolve_tails``) or the schedule
    batch's (the schedule resolves)."""
    schedule = lane is Lane.SCHEDULE
    members: dict[tuple[str, ...], dict[str, Attribute]] = {(): {}}

    def add(path: str, type_: str, writable: bool) -> None:
        parts = tuple(path.split("."))
        for depth in range(1, len(parts)):
            owner, name = parts[: depth - 1], parts[depth - 1]
            nested = parts[:depth]
            members.setdefault(nested, {})
            protocol = names.nested[(nested, schedule)]
            members.setdefault(owner, {}).setdefault(
                name, Attribute(name, protocol, False)
            )
        owner, name = parts[:-1], parts[-1]
        current = members.setdefault(owner, {}).get(name)
        if current is None or (writable and not current.writable):
            members[owner][name] = Attribute(name, type_, writable)

    reader = Lane.FORWARD if lane is None else lane
    add(schema.slots_of(reader), "torch.Tensor", False)
    owners = schema.owners_of(reader)
    if isinstance(owners, Members):
        add(owners.requests, "_rt.Owners", False)
        add(owners.tail, "_rt.MemberTail | None", False)
    elif owners:
        add(owners, "_rt.Owners", False)
    for f in schema.fields:
        # The schedule batch has what the schedule resolves read and write; the forward
        # batch the rest (resolve_tails late-binds a forward batch).
        resolved = lane is None or (f.lane is Lane.SCHEDULE) is schedule
        tails = f.tails is not None and not schedule
        tensor = "torch.Tensor | None" if f.optional else "torch.Tensor"
        if f.target is not None and (resolved or tails):
            # Placeholder targets are assigned by invalidate, scatter targets written
            # in place: always tensors; gather targets are assigned by the resolve.
            in_place = f.resolve is not Resolve.GATHER
            add(f.target, "torch.Tensor" if in_place else tensor, True)
        for read, type_ in _read_only(f) if resolved else ():
            add(read, type_, False)
        host = f.host
        maybe = f.optional or (host is not None and host.optional)
        if host is not None and host.mirror is not None and (resolved or tails):
            add(host.mirror, "torch.Tensor | None" if maybe else tensor, True)
        if host is not None and host.sum is not None and (resolved or tails):
            add(host.sum, "int | None" if maybe else "int", True)
        for tail, type_, writable in _tails_attributes(f) if tails else ():
            add(tail, type_, writable)
    for parent, _how in schema.optional_parents:  # a parent, or the slots path itself
        *head, leaf = parent.split(".")
        current = members.get(tuple(head), {}).get(leaf)
        if current is not None and not current.writable:
            members[tuple(head)][leaf] = Attribute(
                leaf, f"{current.type} | None", False
            )
    return _protocol_views(names, members, schedule)


def _protocol_views(
    names: Names, members: dict[tuple[str, ...], dict[str, Attribute]], schedule: bool
) -> tuple[ProtocolView, ...]:
    """One Protocol per object a path goes through, deepest first, then the batch's."""
    views = []
    for path in sorted((p for p in members if p), key=lambda p: (-len(p), p)):
        doc = f"The attributes of ``batch.{'.'.join(path)}`` the map reads and writes."
        views.append(
            ProtocolView(
                names.nested[(path, schedule)],
                literals.doc_text(doc),
                tuple(members[path].values()),
            )
        )
    if schedule:
        name = names.schedule_batch
        doc = (
            "What the schedule lane's resolves read and write on the scheduler's "
            "object; any class with these fits."
        )
    else:
        name = names.batch
        doc = "What the map reads and writes on a batch; any class with these fits."
    views.append(
        ProtocolView(name, literals.doc_text(doc), tuple(members[()].values()))
    )
    return tuple(views)


def _payload_counts(names: Names, forward: Sequence[Field]) -> tuple[PayloadField, ...]:
    """The producer's count of each counted scatter (``lengths``), once per name (Note
    [Counted scatters] in relay/runtime.py)."""
    counted: dict[str, list[str]] = {}
    for f in forward:
        lengths = f.scatter.lengths if f.scatter is not None else None
        if lengths is not None:
            counted.setdefault(lengths.rsplit(".", 1)[-1], []).append(f.name)
    return tuple(
        PayloadField(
            name,
            "torch.Tensor",
            False,
            literals.doc_text(
                f"How many values of each row of {', '.join(names)} are real (0 to the "
                "row's width); debug mode reports a resolve that reads more."
            ),
        )
        for name, names in counted.items()
    )


def map_view(schema: Schema, *, source: str) -> MapView:
    """The view of one validated schema: its names first, then what each method says."""
    names = naming.names_of(schema)
    packed = packed_groups(schema)
    packed_reads = None
    if packed:
        member_of = {m.field.name: g for g in packed for m in g.members}
        packed_reads = methods.PackedReads(tuple(packed), member_of)
    bodies = methods.bodies(names, schema, packed_reads)
    cleaned = literals.clean_doc(schema.doc)
    first_line = cleaned.split("\n")[0] if cleaned else schema.name
    protocols = _protocols(names, schema)
    if schema.staged is not None:
        protocols = (_staged_protocol(names, schema), *protocols)
    forward = _lane(schema, Lane.FORWARD)
    exports = [schema.name, *(p.name for p in protocols)]
    if forward:
        exports.append(names.payload_cls)
    doc = literals.escape_doc(cleaned) or schema.name
    dims = list(names.dims)
    return MapView(
        module_doc=literals.doc_text(
            f"{first_line}\n\nGenerated from {source} by relay; see docs/generated.md."
        ),
        cls=schema.name,
        doc=f"{doc}\n\nRows are request-pool slots; row 0 is padding's scratch row.",
        payload_cls=names.payload_cls,
        payload=tuple(
            PayloadField(
                f.payload_name,
                "torch.Tensor | None"
                if f.optional or f.graph_written
                else "torch.Tensor",
                f.optional,
                names.doc[f.name],
            )
            for f in forward
        )
        + _payload_counts(names, forward),
        protocols=protocols,
        exports=tuple(sorted(exports)),
        schema_args=", ".join(_declared(schema)),
        fields=tuple(map(_field_declaration, schema.fields)),
        init_params=", ".join(
            [
                "device: torch.device | str",
                "pool_size: int",
                "*",
                *(f"{d}: int" for d in dims),
                *(
                    f"{names.buffer[f.name]}: torch.Tensor | None = None"
                    for f in schema.fields
                    if f.graph_written
                ),
                *(f"{k}: bool = True" for k in names.switches),
                "debug: bool = False",
            ]
        ),
        init=tuple(_init(names, schema, packed)),
        methods=(made := tuple(_methods(names, schema, bodies))),
        constants=literals.gate_constants([line for m in made for line in m.body]),
    )
