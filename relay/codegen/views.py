"""Views: exactly what the template needs, computed once from a validated schema.

The template only fills holes, loops and branches on typed plans; every decision
(which methods exist, how a field is written and read, what a line says) is made
here, in Python, where it can be read and tested.

Statements are spelled on one line each, however long: the pinned formatter lays the
module out afterwards (Note [Formatter pin] in ``formatting.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from relay.codegen import naming
from relay.codegen.layout import Member, PackedGroup, packed_groups
from relay.schema import Alloc, Field, FromPayload, Guard, Lane, Resolve, Schema

_GUARDS = {Guard.POSITIVE: "guard_positive", Guard.NON_NEGATIVE: "guard_non_negative"}


class WritePlan(enum.Enum):
    """How ``stash`` / ``publish`` write a field."""

    #: ``buf.index_copy_(0, slots, value.to(dtype))`` into a buffer made at construction.
    EAGER = "eager"
    #: Allocate from the first payload that carries it, then write as ``EAGER``.
    LAZY = "lazy"


class ReadPlan(enum.Enum):
    """How a resolve hands a field to the batch."""

    #: ``target = buf.index_select(0, indices)``: one gather.
    GATHER = "gather"
    #: Replace each negative ``-slot`` in the target by ``buf[slot]``.
    PLACEHOLDER = "placeholder"


# Note [Optional fields]
# An optional field is handed over by a resolve only when the latest write (stash or
# publish) carried it; otherwise the resolve sets its targets to None. That decision
# is a Python flag per field, so it costs no op and no host sync. A write that omits
# the field clears the rows it covers (one index_fill_, only once the buffer exists),
# so a later resolve that mixes those rows with rows of a carrying write reads zeros
# there, never an earlier value; debug mode reports such a read. A field always or
# never carried costs nothing extra.


class Presence(enum.Enum):
    """What a resolve knows about whether the buffer holds this step's rows."""

    #: Required and eager: always there.
    ALWAYS = "always"
    #: Optional: handed over only when the latest write carried it (Note [Optional fields]).
    CARRIED = "carried"
    #: Required and lazy: a resolve before the first stash is an error.
    ALLOCATED = "allocated"


def _join(opener: str, args: Sequence[str], closer: str = ")") -> str:
    """``opener`` + the arguments + ``closer`` on one line: ruff lays it out."""
    return opener + ", ".join(args) + closer


def _if(test: str) -> str:
    return f"if {test}:"


def _def(name: str, params: Sequence[str], returns: str) -> str:
    """A method's ``def`` line."""
    return f"def {name}({', '.join(params)}) -> {returns}:"


@attrs.frozen
class FieldView:
    """One field: its typed plans and the statements that carry them out."""

    name: str
    lane: Lane
    write: WritePlan
    read: ReadPlan
    presence: Presence
    #: The local (or publish parameter) holding the checked value: the payload name.
    src: str
    #: ``bonus_tokens = payload.bonus_tokens`` for an optional stash field, else ``None``.
    bind_stmt: str | None
    payload_name: str
    value_type: str
    buf: str
    buf_type: str
    #: ``self._<field>_carried`` of an optional field, else ``None``.
    carried: str | None
    target: str | None  # "batch.spec_info.topk_p"
    host_mirror: str | None  # "batch.seq_lens_cpu"
    host_sum: str | None
    host_attr: str | None  # "_new_seq_lens_host", when mirrored or summed
    host_init: str | None  # its construction
    resolve_method: str | None
    doc: str
    summary: str
    # Constructor.
    alloc_stmt: str  # eager buffer allocation, at the constructor's body indent
    #: Packed layout: the buffer is this fixed view of its group's buffer, else ``None``.
    column_stmt: str | None
    # stash / publish.
    check_stmt: str
    guard_stmt: str | None
    write_stmt: str
    lazy_alloc_stmt: str | None
    clear_stmt: str | None
    # Resolves.
    #: The ``if`` line guarding an optional read in the resolve.
    read_test: str | None
    #: The debug ``if`` of a resolve whose only read is this optional one (one ``if``,
    #: not two nested, as linters want).
    solo_debug_read_test: str | None
    #: The read itself: a gather, or the placeholder substitution, then host copies.
    read_stmts: tuple[str, ...]
    #: The read hands the batch a local that ``resolve_future``'s gather block set
    #: (Note [Fused gather]): no ``if`` of its own, ``None`` already in the local.
    plain_read: bool
    #: That gather block's torch path for this field (``None`` when not in the block).
    local_gather_stmts: tuple[str, ...] | None
    #: The local the gather block sets for this field.
    src_local: str
    #: What the fused gather is given for this field: its buffer, or for an optional one
    #: the buffer only when the latest write carried it.
    fused_arg: str | None
    #: What an optional read hands over when the latest write did not carry it.
    none_stmts: tuple[str, ...]
    #: The debug-mode ``read`` report of this field alone: a schedule resolve's, or a
    #: placeholder's (its own rows and pending mask); gathers of ``resolve_future`` are
    #: reported together (``MapView.forward_read_stmt``).
    read_stmt: str
    never_stashed_stmt: str | None  # the error of a required lazy field read too early
    read_doc: tuple[str, ...]
    resolve_def: str | None  # the schedule resolve's ``def`` line

    @property
    def placeholder(self) -> bool:
        return self.read is ReadPlan.PLACEHOLDER

    @property
    def optional(self) -> bool:
        return self.presence is Presence.CARRIED

    @property
    def lazy(self) -> bool:
        return self.write is WritePlan.LAZY

    @property
    def needs_stash(self) -> bool:
        """A required lazy field: resolving it before its first stash is an error."""
        return self.presence is Presence.ALLOCATED


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
    cls_literal: str
    doc: str
    payload_cls: str
    batch_cls: str
    indices: str  # "batch.req_pool_indices"
    dims: tuple[str, ...]
    pool_check: str
    dim_checks: tuple[str, ...]
    fields: tuple[FieldView, ...]
    #: Packed buffers (Note [Packed layout]); empty for ``Layout.SEPARATE``.
    groups: tuple[GroupView, ...]
    fused: FusedView | None
    protocols: tuple[ProtocolView, ...]  # nested first, the batch protocol last
    debug_stmt: str
    #: The debug reports of ``stash`` and ``publish`` (one each) and of the gathers
    #: of ``resolve_future`` (one for all of them); ``None`` where there are none.
    stash_wrote_stmt: str | None
    publish_wrote_stmt: str | None
    forward_read_stmt: str | None
    stash_def: str
    invalidate_def: str
    resolve_future_def: str
    fence_stmt: str | None
    exports: tuple[str, ...]

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
    def solo_optional_forward_read(self) -> bool:
        """``resolve_future`` reads one field only, and it is optional."""
        reads = self.forward_resolved
        return len(reads) == 1 and reads[0].optional

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
        return any(
            f.read is ReadPlan.GATHER and f.presence is not Presence.CARRIED
            for f in self.forward_resolved
        )

    def host_slots_test(self) -> str:
        """When a write checks its slots on the host (Note [Slots on the host])."""
        if self.slots_gathered:
            return (
                "elif indices.is_cpu and not _rt.slots_vouched("
                "self._slots_gathered, indices):"
            )
        return "elif indices.is_cpu:"

    def host_slots_stmt(self, op: str) -> str:
        """The debug-off slot check of a CPU write (Note [Slots on the host])."""
        return _join(
            "_rt.check_host_slots(",
            [naming.string_literal(f"{self.cls}.{op}"), "indices", "self.pool_size"],
        )

    @property
    def publish_params(self) -> list[FieldView]:
        """Required schedule fields first (positional), then optional ones (default None)."""
        return [f for f in self.schedule if not f.optional] + [
            f for f in self.schedule if f.optional
        ]


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


def _presence(f: Field) -> Presence:
    if f.optional:
        return Presence.CARRIED
    return Presence.ALWAYS if f.alloc is Alloc.EAGER else Presence.ALLOCATED


def _field_view(
    schema: Schema, f: Field, member: tuple[PackedGroup, Member] | None, fused: bool
) -> FieldView:
    lane = f.lane
    write = WritePlan.EAGER if f.alloc is Alloc.EAGER else WritePlan.LAZY
    read = ReadPlan.PLACEHOLDER if f.resolve is Resolve.PLACEHOLDER else ReadPlan.GATHER
    presence = _presence(f)
    buf = f"self.{naming.buffer(f)}"
    # Note [Checked values]: check_rows returns the value ready to write (cast only
    # when its dtype differs), so the write itself dispatches one op and no ``.to``.
    src = f.payload_name
    given = f"payload.{f.payload_name}" if lane is Lane.FORWARD else f.payload_name
    bind_stmt = f"{src} = {given}" if f.optional and lane is Lane.FORWARD else None
    what = naming.string_literal(f"{schema.name}.{f.name}")
    field_literal = naming.string_literal(f.name)
    carried = f"self.{naming.carried_flag(f)}" if f.optional else None
    target = f"batch.{f.target}" if f.target is not None else None
    mirrored = f.host_mirror is not None or f.host_sum is not None
    host_attr = naming.host_mirror(f) if mirrored else None
    method = naming.resolve_method(f) if lane is Lane.SCHEDULE else None
    reader = "resolve_future" if lane is Lane.FORWARD else method
    assert reader is not None
    lazy = write is WritePlan.LAZY
    dtype = None if isinstance(f.dtype, FromPayload) else naming.dtype(f.dtype)
    row = naming.declared_row(f)

    # stash / publish: the checks sit under ``if src is not None:`` for optional fields.
    check_args = [what, src if f.optional else given, "indices", buf]
    if lazy:
        check_args += [row, dtype or "None"]
    check_stmt = _join(f"{src} = _rt.check_rows(", check_args)
    guard_stmt = None
    if f.guard in _GUARDS:
        guard_stmt = _join(f"_rt.{_GUARDS[f.guard]}(", [src, what])

    write_stmt = _join(f"{buf}.index_copy_(", ["0", "slots", src])
    lazy_alloc_stmt = None
    if lazy:
        lazy_alloc_stmt = _join(
            f"{buf} = _rt.lazy_buffer(",
            [
                what,
                "self.pool_size",
                row,
                dtype or "None",
                src,
                "self._debug is not None",
            ],
        )
    clear_stmt = (
        _join(f"{buf}.index_fill_(", ["0", "slots", "0"]) if f.optional else None
    )

    # Resolves.
    read_test = solo_debug_read_test = None
    if presence is Presence.CARRIED:
        assert carried is not None
        test = f"{carried} and {buf} is not None" if lazy else carried
        read_test = _if(test)
        solo_debug_read_test = _if(f"self._debug is not None and {test}")
    value = naming.value_local(f)
    at, pending, rows = naming.placeholder_locals(f)
    placeholder_stmts: tuple[str, ...] = ()
    buffers = _buffers([(f.name, naming.buffer(f))])
    read_args: list[str]
    if read is ReadPlan.PLACEHOLDER:
        assert target is not None
        gather_stmt = _join(f"{value} = {buf}.index_select(", ["0", rows])
        placeholder_stmts = (
            f"{at} = {target}",
            f"{pending} = {at} < 0",
            f"{rows} = {at}.neg().clamp(min=0)",
            gather_stmt,
            _join(f"{at}.copy_(", [f"torch.where({pending}, {value}, {at})"]),
        )
        read_args = [f'"{reader}"', rows, buffers, f"taken={pending}"]
        host_src = at
    elif lane is Lane.SCHEDULE:
        gather_stmt = _join(f"{value} = {buf}.index_select(", ["0", "indices"])
        read_args = [f'"{reader}"', "indices", buffers]
        host_src = value
    else:  # a forward gather; a field without a target is only stashed: this goes unused
        gather_stmt = _join(
            f"{target or value} = {buf}.index_select(", ["0", "indices"]
        )
        read_args = [f'"{reader}"', "indices", buffers]
        host_src = value

    read_stmt = _join("self._debug.read(", read_args)
    # Note [Fused gather]: a packed map gathers every forward gather field in one block.
    in_block = (
        fused
        and lane is Lane.FORWARD
        and read is ReadPlan.GATHER
        and target is not None
    )
    local_read = f"{target} = {value}" if in_block and member is None else None
    local_gather_stmts: tuple[str, ...] | None = None
    fused_arg: str | None = None
    if in_block and member is None:
        fused_arg = buf
        local_gather = _join(f"{value} = {buf}.index_select(", ["0", "indices"])
        local_gather_stmts = (local_gather,)
        if presence is Presence.CARRIED:
            assert carried is not None
            test = f"{carried} and {buf} is not None" if lazy else carried
            fused_arg = f"{buf} if {carried} else None"
            local_gather_stmts = (
                f"{value} = None",
                _if(test)
                + "\n    "
                + _join(f"{value} = {buf}.index_select(", ["0", "indices"]),
            )
    host: list[str] = []
    none: list[str] = []
    if lane is Lane.SCHEDULE and read is ReadPlan.GATHER and target is not None:
        host.append(f"{target} = {value}")
    if f.host_mirror is not None:
        mirror = f"batch.{f.host_mirror}"
        host.append(_join(f"{mirror} = self.{host_attr}.copy(", [host_src]))
        if f.host_sum is not None:
            host.append(_join(f"batch.{f.host_sum} = _rt.host_sum(", [mirror]))
    elif f.host_sum is not None:
        host.append(
            _join(
                f"batch.{f.host_sum} = _rt.host_sum(",
                [f"self.{host_attr}.copy({host_src})"],
            )
        )
    if presence is Presence.CARRIED:
        for path in (f.target, f.host_mirror, f.host_sum):
            if path is not None and not (
                path == f.target and read is ReadPlan.PLACEHOLDER
            ):
                none.append(f"batch.{path} = None")

    return FieldView(
        name=f.name,
        lane=lane,
        write=write,
        read=read,
        presence=presence,
        src=src,
        bind_stmt=bind_stmt,
        payload_name=f.payload_name,
        value_type="torch.Tensor | None" if f.optional else "torch.Tensor",
        buf=naming.buffer(f),
        buf_type="torch.Tensor | None" if lazy else "torch.Tensor",
        carried=carried,
        target=target,
        host_mirror=f"batch.{f.host_mirror}" if f.host_mirror else None,
        host_sum=f"batch.{f.host_sum}" if f.host_sum else None,
        host_attr=host_attr,
        host_init=_join(
            f"self.{host_attr} = _rt.HostMirror(", ["self.device", "pool_size"]
        )
        if host_attr
        else None,
        resolve_method=method,
        doc=naming.doc_text(f.doc) or f.name,
        summary=naming.escape_doc(_summary(f)),
        alloc_stmt=_join(
            f"{buf}: torch.Tensor = _rt.new_buffer(",
            [naming.eager_shape(f), dtype or "None", "self.device", "debug"],
        ),
        column_stmt=_column(f, buf, *member) if member else None,
        check_stmt=check_stmt,
        guard_stmt=guard_stmt,
        write_stmt=write_stmt,
        lazy_alloc_stmt=lazy_alloc_stmt,
        clear_stmt=clear_stmt,
        read_test=read_test,
        solo_debug_read_test=solo_debug_read_test,
        read_stmts=(*placeholder_stmts, *host)
        if placeholder_stmts
        else (_packed_read(f, target) if member else local_read or gather_stmt, *host),
        plain_read=in_block,
        src_local=value,
        local_gather_stmts=local_gather_stmts,
        fused_arg=fused_arg,
        none_stmts=tuple(none),
        read_stmt=read_stmt,
        never_stashed_stmt=_join(
            "raise _rt.never_stashed(",
            [naming.string_literal(schema.name), field_literal],
        )
        if presence is Presence.ALLOCATED
        else None,
        read_doc=_read_doc(f),
        resolve_def=_def(
            method, ["self", f"batch: {naming.batch_protocol(schema)}"], "None"
        )
        if method
        else None,
    )


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

    call_stmt: str
    torch_stmts: tuple[str, ...]


def _fused_view(
    groups: Sequence[PackedGroup], fields: Sequence[FieldView]
) -> FusedView:
    required = [naming.packed_rows(g.dtype) for g in groups]
    required_args = [f"self.{naming.packed_buffer(g.dtype)}" for g in groups]
    optional: list[str] = []
    optional_args: list[str] = []
    torch_stmts = [
        _join(
            f"{naming.packed_rows(g.dtype)} = self.{naming.packed_buffer(g.dtype)}"
            ".index_select(",
            ["0", "indices"],
        )
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
    return FusedView(call_stmt=_join(head, args), torch_stmts=tuple(torch_stmts))


def _read_doc(f: Field) -> tuple[str, ...]:
    later = " (when the latest write carried it, else ``None``)" if f.optional else ""
    lines = []
    if f.resolve is Resolve.PLACEHOLDER:
        lines.append(
            f"- ``batch.{f.target}``: each placeholder ``-slot`` becomes "
            f"``{naming.buffer(f)}[slot]``{later}."
        )
    elif f.target is not None:
        lines.append(f"- ``batch.{f.target} = {naming.buffer(f)}[indices]``{later}.")
    if f.host_mirror:
        lines.append(f"- ``batch.{f.host_mirror}``: a host copy of it.")
    if f.host_sum:
        lines.append(f"- ``batch.{f.host_sum}``: the sum of it on the host.")
    return tuple(naming.doc_text(line) for line in lines)


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


def _buffers(fields: Sequence[tuple[str, str]]) -> str:
    """``{"topk_p": self.topk_p_buf, ...}`` from (field name, buffer attribute) pairs:
    what a debug ``read`` report reads."""
    return _join(
        "{",
        tuple(f"{naming.string_literal(name)}: self.{buf}" for name, buf in fields),
        "}",
    )


def _carried(fields: Sequence[FieldView], flag: str) -> str | None:
    """``carried={"hidden_states": <flag>, ...}`` for the optional ``fields``: whether
    this call carried (a write) or reads (a resolve) each; ``None`` when none is
    optional. ``flag`` is ``"src"`` (the payload value is not None) or ``"carried"``
    (the map's flag, Note [Optional fields])."""
    optional = [f for f in fields if f.optional]
    if not optional:
        return None
    return _join(
        "carried={",
        tuple(
            f"{naming.string_literal(f.name)}: "
            + (f"{f.src} is not None" if flag == "src" else str(f.carried))
            for f in optional
        ),
        "}",
    )


def _wrote_stmt(op: str, fields: Sequence[FieldView]) -> str | None:
    """The one debug ``wrote`` report of ``stash`` / ``publish``: every field it writes."""
    if not fields:
        return None
    literals = tuple(naming.string_literal(f.name) for f in fields)
    names = _join("(", literals, ",)" if len(literals) == 1 else ")")
    args: list[str] = [f'"{op}"', "indices", names]
    carried = _carried(fields, "src")
    if carried is not None:
        args.append(carried)
    return _join("self._debug.wrote(", args)


def _forward_read_stmt(fields: Sequence[FieldView]) -> str | None:
    """The one debug ``read`` report of ``resolve_future``'s gathers (placeholders report
    their own rows apart)."""
    gathers = [
        f
        for f in fields
        if f.lane is Lane.FORWARD and f.target is not None and not f.placeholder
    ]
    if not gathers:
        return None
    args: list[str] = [
        '"resolve_future"',
        "indices",
        _buffers([(f.name, f.buf) for f in gathers]),
    ]
    carried = _carried(gathers, "carried")
    if carried is not None:
        args.append(carried)
    return _join("self._debug.read(", args)


def _names_literal(keyword: str, names: Sequence[str]) -> str:
    """``keyword=("a", "b")``: a tuple of string literals that ruff may split."""
    literals = tuple(naming.string_literal(n) for n in names)
    if len(literals) == 1:
        return _join(f"{keyword}=(", literals, ",)")
    return _join(f"{keyword}=(", literals)


def map_view(schema: Schema, *, source: str) -> MapView:
    """The view of one validated schema."""
    for owner, doc in [
        (schema.name, schema.doc),
        *((f.name, f.doc) for f in schema.fields),
    ]:
        problem = naming.doc_problem(doc)
        if problem is not None:
            raise ValueError(f"{owner}: doc {problem}")
    groups = packed_groups(schema)
    member_of = {m.field.name: (g, m) for g in groups for m in g.members}
    fields = tuple(
        _field_view(schema, f, member_of.get(f.name), bool(groups))
        for f in schema.fields
    )
    cleaned = naming.clean_doc(schema.doc)
    first_line = cleaned.split("\n")[0] if cleaned else schema.name
    cls_literal = naming.string_literal(schema.name)
    dims = tuple(naming.symbolic_dims(schema.fields))
    forward = [f.name for f in schema.fields if f.lane is Lane.FORWARD]
    schedule = [f.name for f in schema.fields if f.lane is Lane.SCHEDULE]
    consumers = [
        naming.resolve_method(f) for f in schema.fields if f.lane is Lane.SCHEDULE
    ]
    debug_args: list[str] = ["self.device", "self.pool_size", cls_literal]
    if forward:
        debug_args.append(_names_literal("forward", forward))
    if schedule:
        debug_args.append(_names_literal("schedule", schedule))
        debug_args.append(_names_literal("consumers", consumers))
    protocols = _protocols(schema)
    exports = [schema.name, naming.batch_protocol(schema)]
    if forward:
        exports.append(naming.payload_class(schema))
    exports.extend(p.name for p in protocols if p.name != naming.batch_protocol(schema))
    return MapView(
        module_doc=naming.doc_text(
            f"{first_line}\n\nGenerated from {source} by relay; see docs/generated.md."
        ),
        cls=schema.name,
        cls_literal=cls_literal,
        doc=naming.escape_doc(cleaned) or schema.name,
        payload_cls=naming.payload_class(schema),
        batch_cls=naming.batch_protocol(schema),
        indices=f"batch.{schema.indices}",
        dims=dims,
        pool_check=_join(
            "self.pool_size = _rt.check_dim(",
            [cls_literal, '"pool_size"', "pool_size"],
        ),
        dim_checks=tuple(
            _join(
                f"{d} = _rt.check_dim(",
                [cls_literal, naming.string_literal(d), d],
            )
            for d in dims
        ),
        fields=fields,
        groups=tuple(_group_view(g) for g in groups),
        fused=_fused_view(groups, fields) if groups else None,
        protocols=protocols,
        debug_stmt=_join("self._debug = _rt.DebugChecks(", debug_args),
        stash_wrote_stmt=_wrote_stmt(
            "stash", [f for f in fields if f.lane is Lane.FORWARD]
        ),
        publish_wrote_stmt=_wrote_stmt(
            "publish", [f for f in fields if f.lane is Lane.SCHEDULE]
        ),
        forward_read_stmt=_forward_read_stmt(fields),
        stash_def=_def(
            "stash",
            [
                "self",
                "indices: torch.Tensor",
                f"payload: {naming.payload_class(schema)}",
            ],
            "None",
        ),
        invalidate_def=_def(
            "invalidate",
            [
                "self",
                f"batch: {naming.batch_protocol(schema)}",
                "indices: torch.Tensor",
            ],
            "None",
        ),
        resolve_future_def=_def(
            "resolve_future",
            ["self", f"batch: {naming.batch_protocol(schema)}"],
            "None",
        ),
        fence_stmt="self._fence = _rt.Fence(self.device)" if schedule else None,
        exports=tuple(sorted(exports)),
    )
