"""Views: exactly what the template needs, computed once from a validated schema.

The template only fills holes, loops and branches on plain values; every decision
(which methods exist, what a line says) is made here and in ``methods.py``, in Python,
where it can be read and tested. What a field contributes comes from its kinds
(Note [Kinds] in ``kinds/__init__.py``).

Statements are spelled on one line each, however long: the pinned formatter lays the
module out afterwards (Note [Formatter pin] in ``formatting.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from relay.codegen import kinds, methods, naming
from relay.codegen.kinds.base import Names
from relay.codegen.layout import Member, PackedGroup, packed_groups
from relay.codegen.methods import Shape
from relay.schema import Field, FromPayload, Lane, Resolve, Schema


def _join(opener: str, args: Sequence[str], closer: str = ")") -> str:
    """``opener`` + the arguments + ``closer`` on one line: ruff lays it out."""
    return opener + ", ".join(args) + closer


def _def(name: str, params: Sequence[str], returns: str) -> str:
    """A method's ``def`` line."""
    return f"def {name}({', '.join(params)}) -> {returns}:"


# Note [Optional fields]
# An optional field is handed over by a resolve only when the latest write (stash or
# publish) carried it; otherwise the resolve sets its targets to None. That decision
# is a Python flag per field, so it costs no op and no host sync. A write that omits
# the field clears the rows it covers (one index_fill_, only once the buffer exists),
# so a later resolve that mixes those rows with rows of a carrying write reads zeros
# there, never an earlier value; debug mode reports such a read. A field always or
# never carried costs nothing extra.

# Note [Fused gather]
# A packed map (Note [Packed layout]) gathers every forward gather field of
# resolve_future in one block: one index_select per packed buffer and per field of its
# own, each into a local, or with the map's fused_gather set, one _rt.gather_rows call
# (a single launch on CUDA) that returns the same locals. The reads then hand the batch
# the locals, or views of a packed block's columns.


@attrs.frozen
class FieldView:
    """One field: what the template spells for it, and what its method bodies use."""

    field: Field
    names: Names
    name: str
    lane: Lane
    payload_name: str
    value_type: str
    #: ``self._<field>_carried`` of an optional field, else ``None``.
    carried: str | None
    target: str | None  # "batch.spec_info.topk_p"
    host_init: str | None  # the host mirror's construction
    resolve_method: str | None
    doc: str
    summary: str
    #: The constructor's statements for the buffer (a packed field's fixed view).
    init_stmts: tuple[str, ...]
    #: In a packed map's gather block (Note [Fused gather]): no ``if`` of its own.
    plain_read: bool
    #: What the block's field hands the batch (the local, or its packed columns).
    block_read: tuple[str, ...]
    #: The block's torch path for this field (``None`` when not in the block).
    local_gather_stmts: tuple[str, ...] | None
    #: The local the gather block sets for this field.
    src_local: str
    #: What the fused gather is given for this field (``None`` when not in the block).
    fused_arg: str | None
    read_doc: tuple[str, ...]

    @property
    def placeholder(self) -> bool:
        return self.field.resolve is Resolve.PLACEHOLDER

    @property
    def optional(self) -> bool:
        return self.field.optional

    @property
    def lazy(self) -> bool:
        return kinds.alloc(self.field).lazy

    @property
    def needs_stash(self) -> bool:
        """A required lazy field: resolving it before its first stash is an error."""
        return self.lazy and not self.optional


def _block(
    f: Field, n: Names, member: tuple[PackedGroup, Member] | None, fused: bool
) -> tuple[bool, tuple[str, ...], tuple[str, ...] | None, str | None]:
    """A packed map's gather block for ``f`` (Note [Fused gather]): whether ``f`` is in
    it, what its read hands the batch, its torch gather and its fused-gather argument."""
    in_block = (
        fused
        and f.lane is Lane.FORWARD
        and f.resolve is Resolve.GATHER
        and f.target is not None
    )
    if not in_block:
        return False, (), None, None
    if member is not None:
        return True, (_packed_read(f, n.target),), None, None
    gather = f"{n.value} = {n.buf}.index_select(0, indices)"
    if not f.optional:
        return True, (f"{n.target} = {n.value}",), (gather,), n.buf
    test = (
        f"{n.carried} and {n.buf} is not None" if f.alloc.value == "lazy" else n.carried
    )
    stmts = (f"{n.value} = None", f"if {test}:", f"    {gather}")
    return (
        True,
        (f"{n.target} = {n.value}",),
        stmts,
        f"{n.buf} if {n.carried} else None",
    )


def _field_view(
    schema: Schema, f: Field, member: tuple[PackedGroup, Member] | None, fused: bool
) -> FieldView:
    n = Names.of(schema, f)
    in_block, block_read, local_gather, fused_arg = _block(f, n, member, fused)
    method = naming.resolve_method(f) if f.lane is Lane.SCHEDULE else None
    init = (_column(f, n.buf, *member),) if member else kinds.alloc(f).init(n)
    return FieldView(
        field=f,
        names=n,
        name=f.name,
        lane=f.lane,
        payload_name=f.payload_name,
        value_type="torch.Tensor | None" if f.optional else "torch.Tensor",
        carried=n.carried,
        target=n.target,
        host_init=f"{n.host} = _rt.HostMirror(self.device, pool_size)"
        if n.host
        else None,
        resolve_method=method,
        doc=naming.doc_text(f.doc) or f.name,
        summary=naming.escape_doc(_summary(f)),
        init_stmts=tuple(init),
        plain_read=in_block,
        block_read=block_read,
        local_gather_stmts=local_gather,
        src_local=n.value,
        fused_arg=fused_arg,
        read_doc=_read_doc(f),
    )


def _read_doc(f: Field) -> tuple[str, ...]:
    later = " (when the latest write carried it, else ``None``)" if f.optional else ""
    lines = []
    if f.target is not None:
        line = kinds.resolve(f).read_doc(f, later)
        if line is not None:
            lines.append(line)
    if f.host_mirror:
        lines.append(f"- ``batch.{f.host_mirror}``: a host copy of it.")
    if f.host_sum:
        lines.append(f"- ``batch.{f.host_sum}``: the sum of it on the host.")
    return tuple(naming.doc_text(line) for line in lines)


def _column(f: Field, buf: str, group: PackedGroup, member: Member) -> str:
    """The field's fixed view of its group's buffer (Note [Packed layout])."""
    packed = f"self.{naming.packed_buffer(group.dtype)}"
    if not f.shape:
        return _join(f"{buf}: torch.Tensor = {packed}.select(", ["1", member.start])
    narrow = ["1", member.start, member.width]
    if len(f.shape) == 1:
        return _join(f"{buf}: torch.Tensor = {packed}.narrow(", narrow)
    dims = naming.shape_literal(tuple(str(d) for d in f.shape))
    columns = _join(f"{packed}.narrow(", tuple(narrow))
    # torch.unflatten, not the method: torch types the function, not Tensor.unflatten.
    return _join(f"{buf}: torch.Tensor = torch.unflatten(", [columns, "1", dims])


def _packed_read(f: Field, target: str | None) -> str:
    """The batch's view of the field's columns of its group's gathered block."""
    assert target is not None
    local = naming.value_local(f)
    if not f.shape:
        return f"{target} = {local}.squeeze(1)"
    if len(f.shape) == 1:
        return f"{target} = {local}"
    return _join(
        f"{target} = torch.unflatten(",
        [local, "1", f"self.{naming.buffer(f)}.shape[1:]"],
    )


@attrs.frozen
class GroupView:
    """One packed buffer: its allocation, and the split of its block in ``resolve_future``."""

    alloc_stmt: str
    doc: str
    widths_stmt: str
    split_stmt: str


def _group_view(group: PackedGroup) -> GroupView:
    dtype = naming.dtype(group.dtype)
    packed = f"self.{naming.packed_buffer(group.dtype)}"
    widths = f"self.{naming.packed_widths(group.dtype)}"
    rows = naming.packed_rows(group.dtype)
    names = [m.field.name for m in group.members]
    locals_ = ", ".join(naming.value_local(m.field) for m in group.members)
    return GroupView(
        alloc_stmt=_join(
            f"{packed}: torch.Tensor = _rt.new_buffer(",
            [f"(pool_size, {group.columns})", dtype, "self.device", "debug"],
        ),
        doc=naming.doc_text(
            f"Rows of {', '.join(names)} ({dtype}) side by side (Note [Packed layout])."
        ),
        widths_stmt=f"{widths} = {naming.shape_literal(tuple(m.width for m in group.members))}",
        split_stmt=_join(f"{locals_} = {rows}.split_with_sizes(", [widths, "1"]),
    )


@attrs.frozen
class FusedView:
    """``resolve_future``'s gather block in a packed map (Note [Fused gather]): one
    ``_rt.gather_rows`` call when the map's ``fused_gather`` is set, else the torch
    gathers, each into a local that the reads then hand to the batch."""

    call_stmt: tuple[str, ...]
    torch_stmts: tuple[str, ...]


def _fused_view(
    groups: Sequence[PackedGroup], fields: Sequence[FieldView]
) -> FusedView:
    required = [naming.packed_rows(g.dtype) for g in groups]
    required_args = [f"self.{naming.packed_buffer(g.dtype)}" for g in groups]
    optional: list[str] = []
    optional_args: list[str] = []
    torch_stmts = [
        f"{naming.packed_rows(g.dtype)} = "
        f"self.{naming.packed_buffer(g.dtype)}.index_select(0, indices)"
        for g in groups
    ]
    for f in fields:
        if f.fused_arg is None or f.local_gather_stmts is None:
            continue
        (optional if f.optional else required).append(f.src_local)
        (optional_args if f.optional else required_args).append(f.fused_arg)
        torch_stmts.extend(f.local_gather_stmts)

    def targets(names: list[str]) -> str:
        return f"({names[0]},)" if len(names) == 1 else ", ".join(names)

    def literal(args: list[str]) -> str:
        return _join("(", tuple(args), ",)" if len(args) == 1 else ")")

    if optional:
        both = ", ".join(
            targets(names) if len(names) == 1 else f"({targets(names)})"
            for names in (required, optional)
        )
        head = f"{both} = _rt.gather_rows_optional("
        args: list[str] = [
            "indices",
            literal(required_args),
            literal(optional_args),
        ]
    else:
        head = f"{targets(required)} = _rt.gather_rows("
        args = ["indices", literal(required_args)]
    return FusedView(call_stmt=(_join(head, args),), torch_stmts=tuple(torch_stmts))


def _summary(f: Field) -> str:
    dtype = (
        "dtype from payload"
        if isinstance(f.dtype, FromPayload)
        else naming.dtype(f.dtype)
    )
    parts = [
        f"{f.lane.value} lane",
        f"{naming.describe_shape(f.shape)} {dtype}",
        f.alloc.value,
    ]
    if f.optional:
        parts.append("optional")
    line = f"``{f.name}``: " + ", ".join(parts)
    if f.target is not None:
        # Continued on its own line of the class doc string (see the template).
        line += f";\n      -> ``batch.{f.target}`` ({f.resolve.value})"
    return line


@attrs.frozen
class Attribute:
    """One member of a generated Protocol."""

    name: str
    type: str
    writable: bool

    @property
    def getter(self) -> str:
        """The read-only property's ``def`` line."""
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
    indices: str  # "batch.req_pool_indices"
    dims: tuple[str, ...]
    pool_check: str
    dim_checks: tuple[str, ...]
    fields: tuple[FieldView, ...]
    #: Packed buffers (Note [Packed layout]); empty for ``Layout.SEPARATE``.
    groups: tuple[GroupView, ...]
    fused: bool
    protocols: tuple[ProtocolView, ...]  # nested first, the batch protocol last
    debug_stmt: str
    fence_stmt: str | None
    #: What the inline row checks compare with (Note [Checked values] in runtime.py).
    cache_stmts: tuple[str, ...]
    exports: tuple[str, ...]
    #: Method bodies (``methods.py``), by method name: the public class (debug off) and
    #: its debug-mode subclass (Note [Two shapes] in ``methods.py``).
    bodies: dict[str, tuple[str, ...]]
    debug_bodies: dict[str, tuple[str, ...]]
    #: Each method's ``def`` line, by method name, in the order the class defines them.
    defs: dict[str, str]
    #: The debug-mode subclass.
    debug_cls: str
    #: The constructor's parameters after ``self``.
    init_params: str

    @property
    def forward(self) -> list[FieldView]:
        return [f for f in self.fields if f.lane is Lane.FORWARD]

    @property
    def schedule(self) -> list[FieldView]:
        return [f for f in self.fields if f.lane is Lane.SCHEDULE]

    @property
    def forward_resolved(self) -> list[FieldView]:
        return [f for f in self.forward if f.target is not None]

    @property
    def placeholders(self) -> list[FieldView]:
        return [f for f in self.fields if f.placeholder]

    @property
    def optional_fields(self) -> list[FieldView]:
        return [f for f in self.fields if f.optional]

    @property
    def slots_gathered(self) -> bool:
        """``resolve_future`` always gathers with the batch's slots, so its
        ``index_select`` refuses any slot outside the pool (Note [Slots on the host])."""
        return _slots_gathered(self.fields)

    @property
    def publish_params(self) -> list[FieldView]:
        """Required schedule fields first (positional), then optional ones (default None)."""
        return _publish_params(self.fields)


def _slots_gathered(fields: Sequence[FieldView]) -> bool:
    return any(
        f.lane is Lane.FORWARD
        and f.target is not None
        and not f.placeholder
        and not f.optional
        for f in fields
    )


def _publish_params(fields: Sequence[FieldView]) -> list[FieldView]:
    schedule = [f for f in fields if f.lane is Lane.SCHEDULE]
    return [f for f in schedule if not f.optional] + [f for f in schedule if f.optional]


def _protocols(schema: Schema) -> tuple[ProtocolView, ...]:
    """Batch protocols: one per object on a dotted path, members in first-use order."""
    members: dict[tuple[str, ...], dict[str, Attribute]] = {(): {}}

    def add(path: str, type_: str, writable: bool) -> None:
        parts = tuple(path.split("."))
        for depth in range(1, len(parts)):
            owner, name = parts[: depth - 1], parts[depth - 1]
            nested = parts[:depth]
            members.setdefault(nested, {})
            members.setdefault(owner, {}).setdefault(
                name, Attribute(name, naming.nested_protocol(schema, nested), False)
            )
        owner, name = parts[:-1], parts[-1]
        current = members.setdefault(owner, {}).get(name)
        if current is None or (writable and not current.writable):
            members[owner][name] = Attribute(name, type_, writable)

    add(schema.indices, "torch.Tensor", False)
    for f in schema.fields:
        tensor = "torch.Tensor | None" if f.optional else "torch.Tensor"
        if f.target is not None:
            # Placeholder targets are assigned by invalidate; gather targets by resolve.
            placeholder = f.resolve is Resolve.PLACEHOLDER
            add(f.target, "torch.Tensor" if placeholder else tensor, True)
        if f.host_mirror is not None:
            add(f.host_mirror, tensor, True)
        if f.host_sum is not None:
            add(f.host_sum, "int | None" if f.optional else "int", True)

    views = []
    for path in sorted((p for p in members if p), key=lambda p: (-len(p), p)):
        views.append(
            ProtocolView(
                name=naming.nested_protocol(schema, path),
                doc=naming.doc_text(
                    f"The attributes of ``batch.{'.'.join(path)}`` that {schema.name} "
                    "reads and writes."
                ),
                attributes=tuple(members[path].values()),
            )
        )
    views.append(
        ProtocolView(
            name=naming.batch_protocol(schema),
            doc=naming.doc_text(
                f"What {schema.name} reads and writes on a batch; any class with these fits."
            ),
            attributes=tuple(members[()].values()),
        )
    )
    return tuple(views)


def _names_literal(keyword: str, names: Sequence[str]) -> str:
    """``keyword=("a", "b")``: a tuple of string literals that ruff may split."""
    literals = tuple(naming.string_literal(n) for n in names)
    if len(literals) == 1:
        return _join(f"{keyword}=(", literals, ",)")
    return _join(f"{keyword}=(", literals)


def _debug_stmt(schema: Schema) -> str:
    """The debug-mode checker's construction (``relay.runtime.DebugChecks``)."""
    forward = [f.name for f in schema.fields if f.lane is Lane.FORWARD]
    schedule = [f for f in schema.fields if f.lane is Lane.SCHEDULE]
    args = ["self.device", "self.pool_size", naming.string_literal(schema.name)]
    if forward:
        args.append(_names_literal("forward", forward))
    if schedule:
        args.append(_names_literal("schedule", [f.name for f in schedule]))
        consumers = [naming.resolve_method(f) for f in schedule]
        args.append(_names_literal("consumers", consumers))
    return _join("self._debug = _rt.DebugChecks(", args)


def _bodies(
    schema: Schema,
    fields: Sequence[FieldView],
    groups: Sequence[GroupView],
    fused: FusedView | None,
    shape: Shape,
) -> dict[str, tuple[str, ...]]:
    """Every method body of one generated class (``methods.py``), by method name."""
    forward = [f for f in fields if f.lane is Lane.FORWARD]
    slots_gathered = _slots_gathered(fields)
    bodies = {
        "stash": methods.write(schema.name, "stash", forward, slots_gathered, shape),
        "publish": methods.write(
            schema.name, "publish", _publish_params(fields), slots_gathered, shape
        ),
        "invalidate": methods.invalidate([f for f in fields if f.placeholder], shape),
        "release": methods.release(shape),
        "resolve_future": methods.resolve_future(
            schema,
            [f for f in forward if f.target is not None],
            fused=fused,
            groups=groups,
            slots_gathered=slots_gathered,
            shape=shape,
        ),
    }
    for f in fields:
        if f.lane is Lane.SCHEDULE:
            bodies[f.names.reader] = methods.resolve_schedule(schema, f, shape)
    return {name: tuple(body) for name, body in bodies.items()}


def _exports(schema: Schema, protocols: Sequence[ProtocolView]) -> tuple[str, ...]:
    exports = [schema.name, naming.batch_protocol(schema)]
    if any(f.lane is Lane.FORWARD for f in schema.fields):
        exports.append(naming.payload_class(schema))
    exports.extend(p.name for p in protocols if p.name != naming.batch_protocol(schema))
    return tuple(sorted(exports))


def map_view(schema: Schema, *, source: str) -> MapView:
    """The view of one validated schema."""
    for owner, doc in [
        (schema.name, schema.doc),
        *((f.name, f.doc) for f in schema.fields),
    ]:
        problem = naming.doc_problem(doc)
        if problem is not None:
            raise ValueError(f"{owner}: doc {problem}")
    packed = packed_groups(schema)
    member_of = {m.field.name: (g, m) for g in packed for m in g.members}
    fields = tuple(
        _field_view(schema, f, member_of.get(f.name), bool(packed))
        for f in schema.fields
    )
    groups = tuple(_group_view(g) for g in packed)
    fused = _fused_view(packed, fields) if packed else None
    cleaned = naming.clean_doc(schema.doc)
    first_line = cleaned.split("\n")[0] if cleaned else schema.name
    cls_literal = naming.string_literal(schema.name)
    dims = tuple(naming.symbolic_dims(schema.fields))
    protocols = _protocols(schema)
    return MapView(
        module_doc=naming.doc_text(
            f"{first_line}\n\nGenerated from {source} by relay; see docs/generated.md."
        ),
        cls=schema.name,
        doc=naming.escape_doc(cleaned) or schema.name,
        payload_cls=naming.payload_class(schema),
        indices=f"batch.{schema.indices}",
        dims=dims,
        pool_check=f'self.pool_size = _rt.check_dim({cls_literal}, "pool_size", pool_size)',
        dim_checks=tuple(
            f"{d} = _rt.check_dim({cls_literal}, {naming.string_literal(d)}, {d})"
            for d in dims
        ),
        fields=fields,
        groups=groups,
        fused=fused is not None,
        protocols=protocols,
        debug_stmt=_debug_stmt(schema),
        fence_stmt="self._fence = _rt.new_fence(self.device, debug)"
        if any(f.lane is Lane.SCHEDULE for f in schema.fields)
        else None,
        cache_stmts=tuple(
            stmt for f in fields for stmt in kinds.alloc(f.field).init_cache(f.names)
        ),
        exports=_exports(schema, protocols),
        bodies=_bodies(schema, fields, groups, fused, Shape.OFF),
        debug_bodies=_bodies(schema, fields, groups, fused, Shape.DEBUG),
        defs=_defs(schema, fields),
        debug_cls=naming.debug_class(schema),
        init_params=", ".join(
            [
                "device: torch.device | str",
                "pool_size: int",
                "*",
                *(f"{d}: int" for d in dims),
                "debug: bool = False",
            ]
        ),
    )


def _defs(schema: Schema, fields: Sequence[FieldView]) -> dict[str, str]:
    """Every method's ``def`` line, in the order the class defines them."""
    batch = f"batch: {naming.batch_protocol(schema)}"
    indices = "indices: torch.Tensor"
    defs = {}
    if any(f.lane is Lane.FORWARD for f in fields):
        payload = f"payload: {naming.payload_class(schema)}"
        defs["stash"] = _def("stash", ["self", indices, payload], "None")
    publish = _publish_params(fields)
    if publish:
        params = [
            f"{f.payload_name}: {f.value_type}" + (" = None" if f.optional else "")
            for f in publish
        ]
        defs["publish"] = _def("publish", ["self", indices, *params], "None")
    if any(f.placeholder for f in fields):
        defs["invalidate"] = _def("invalidate", ["self", batch, indices], "None")
    defs["release"] = _def("release", ["self", indices], "None")
    if any(f.lane is Lane.FORWARD and f.target is not None for f in fields):
        defs["resolve_future"] = _def("resolve_future", ["self", batch], "None")
    for f in fields:
        if f.lane is Lane.SCHEDULE:
            defs[f.names.reader] = _def(f.names.reader, ["self", batch], "None")
    return defs
