"""The bodies of the generated methods: one body each (Note [One body] in runtime.py).

A body is a list of plain statements, nested blocks indented four spaces relative to
the method body; the template indents them into place and the formatter lays them
out. A write is its common case's gate, then one torch call per field; what is not
the common case is one call into ``relay.runtime``. Every name a body reads is bound
above its first use, by construction: the slots are read from ``batch`` itself, and
the nested objects a resolve writes into are bound once, after the zero-slots return
and before any read.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from relay.codegen.layout import PackedGroup
from relay.codegen.literals import (
    TENSOR,
    cast_to,
    gate_dtype,
    join,
    plus,
    string_literal,
)
from relay.codegen.naming import Names
from relay.schema import (
    Alloc,
    Carried,
    Field,
    IfNone,
    Lane,
    Members,
    Resolve,
    Scatter,
    Schema,
    Switch,
    TargetShape,
    resolve_method,
)

__all__ = [
    "PackedReads",
    "invalidate",
    "partial_read",
    "release",
    "resolve_future",
    "resolve_schedule",
    "write",
]


def _indent(lines: Sequence[str]) -> list[str]:
    return ["    " + line for line in lines]


def _names(names: Sequence[str]) -> str:
    literals = [string_literal(name) for name in names]
    return join("(", literals, ",)" if len(literals) == 1 else ")")


def _buf(names: Names, schema: Schema, f: Field) -> str:
    """The buffer a body names: a lazy one from the state's list, not through the
    map's property (a call per read); ``state`` is the body's first local."""
    if f.alloc is Alloc.LAZY:
        return f"state.buffers[{schema.fields.index(f)}]"
    return f"self.{names.buffer[f.name]}"


def _lazy(f: Field) -> bool:
    return f.alloc is Alloc.LAZY


# --- stash / publish / seed -------------------------------------------------------------


def _carried(schema: Schema, f: Field) -> str:
    """Whether the latest write carried optional field ``f``: the map state's flag."""
    return f"state.carried[{schema.fields.index(f)}]"


def _fits(schema: Schema, f: Field, v: str) -> str:
    """Whether ``v`` fits ``f``'s buffer, spelled out (a call per value is what the gate
    saves): a tensor of its dtype (an eager buffer's is the declared one; a lazy one's
    is the state's, ``None`` before it exists, which nothing fits), one buffer row per
    slot, on the map's device (``is_cpu`` on a CPU map: no ``torch.device`` made), not
    requiring grad (untested where the dtype tested is an integer one: torch lets no
    integer tensor require grad; a lazy buffer's dtype is known once it exists)."""
    i = schema.fields.index(f)
    want = f"state.dtypes[{i}]"
    grad = f" and not (state.floating[{i}] and {v}.requires_grad)"  # from the payload
    if isinstance(f.dtype, torch.dtype):
        floating = f.dtype.is_floating_point or f.dtype.is_complex
        grad = f" and not {v}.requires_grad" if floating else ""
        if not _lazy(f):
            want = gate_dtype(f.dtype)
    rows = f"state.shapes[{i}][index_shape]" if f.shape else "index_shape"
    return (
        f"(type({v}) is {TENSOR}"
        f" and {v}.dtype is {want}"
        f" and {v}.shape == {rows}"
        f" and ({v}.is_cpu if state.cpu else {v}.device == state.device)"
        f"{grad})"
    )


def _test(schema: Schema, f: Field, v: str) -> str:
    """The gate's test of ``f``'s value ``v`` (``_fits``); an optional field's may be
    left out (tested here: no test of a value left out); a lazy field's buffer must
    exist."""
    i = schema.fields.index(f)
    test = _fits(schema, f, v)
    # A value given is tested first: one ``is None`` test (the write's) where it is.
    if isinstance(f.gate, Switch):  # a field this map does not relay takes anything
        return f"({test} or {v} is None or not {_on(schema, f)})"
    if f.optional or f.graph_written:  # Note [Left to others] in runtime.py
        return f"({test} or {v} is None)"
    if _lazy(f):  # true once the test is; it narrows the buffer's type for the write
        return f"{test} and state.buffers[{i}] is not None"
    return test


def _on(schema: Schema, f: Field) -> str:
    """Whether this map relays ``f`` (its ``Switch`` keyword, as the constructor got it)."""
    return f"state.on[{schema.fields.index(f)}]"


def _write(names: Names, schema: Schema, f: Field, v: str) -> list[str]:
    """The common case's write of ``f``'s value ``v`` (Note [One body] in runtime.py)."""
    buf = _buf(names, schema, f)
    given = f"{v} is not None"
    if isinstance(f.gate, Switch):  # dropped where this map does not relay it
        given = f"{given} and {_on(schema, f)}"
    if f.optional and f.kept:  # left out, the rows and the flag stay
        flag = _carried(schema, f)
        if _lazy(f):  # the gate let the value through: its buffer exists
            return [
                f"if {given}:",
                f"    if {buf} is not None:",  # narrows the buffer's type
                f"        {buf}.index_copy_(0, indices, {v})",
                f"    {flag} = True",
            ]
        return [
            f"if {given}:",
            f"    {buf}.index_copy_(0, indices, {v})",
            f"    {flag} = True",
        ]
    if f.optional:
        flag = _carried(schema, f)
        if isinstance(f.gate, Switch):
            v = f"{v} if {_on(schema, f)} else None"
        return [f"{flag} = _rt.write_optional({buf}, indices, {v})"]
    if f.graph_written:  # None: the graph wrote the rows (Note [Left to others])
        return [f"if {v} is not None:", f"    {buf}.index_copy_(0, indices, {v})"]
    return [f"{buf}.index_copy_(0, indices, {v})"]


def write(
    names: Names, schema: Schema, op: str, fields: Sequence[Field], checked: str
) -> list[str]:
    """``stash`` or ``publish``: the gate, the writes, else ``checked`` (the call of
    the runtime's checked path). The gate's tests decide; nothing is caught (Note [One
    body] in runtime.py)."""
    # stash reads each payload value once; publish and stash_partial take them as such
    values = [f.payload_name for f in fields]
    bind = [f"{v} = payload.{v}" for v in values] if op == "stash" else []
    writes = [
        line for f, v in zip(fields, values) for line in _write(names, schema, f, v)
    ]
    if op == "publish":
        writes.append("state.fence.record()")
    tests = [_test(schema, f, v) for f, v in zip(fields, values)]
    gate = " and ".join(["index_shape", *tests])
    return [
        "state = self._state",
        *bind,
        "index_shape = _rt.write_rows(state, indices)",
        f"if {gate}:",
        *_indent(writes),
        "else:",
        f"    {checked}",
    ]


# --- resolves ------------------------------------------------------------------------------
# What a Resolve kind emits lives here: its read (``_reads``) and its line of the
# resolve's doc string (``resolve_doc``); its rules live in validate.py, its runtime
# help in relay/runtime.py, its meaning in relay/testing/model.py.


def resolve_doc(names: Names, f: Field) -> str:
    """The resolve doc string's line for ``f``'s target."""
    later = " (when the latest write carried it, else ``None``)" if f.optional else ""
    scatter = f.scatter
    inside = (
        f", inside its row of ``batch.{scatter.rows.starts}``"
        if scatter is not None and scatter.rows is not None
        else ""
    )
    cast = "" if scatter is None or scatter.cast is None else f", as ``{scatter.cast}``"
    if scatter is not None and (scatter.after or scatter.lengths):
        after = f", after ``{scatter.after}``" if scatter.after else ""
        count = (
            f", the first ``batch.{scatter.lengths}`` of each row"
            if scatter.lengths
            else ""
        )
        return (
            f"- ``batch.{f.target}``: from each row's ``batch.{scatter.offsets}``"
            f"{inside}{after}, ``{names.buffer[f.name]}[indices]``{count}{cast}."
        )
    if scatter is not None:
        return (
            f"- ``batch.{f.target}``: from each row's ``batch.{scatter.offsets}``"
            f"{inside}, ``{names.buffer[f.name]}[indices]``{cast}."
        )
    if f.resolve is Resolve.PLACEHOLDER:
        return (
            f"- ``batch.{f.target}``: each placeholder ``-slot`` becomes "
            f"``{names.buffer[f.name]}[slot]``{later}."
        )
    return f"- ``batch.{f.target} = {names.buffer[f.name]}[indices]{_flat(f)}``{later}."


@attrs.frozen
class PackedReads:
    """A packed map's gather block (Note [Packed layout] in layout.py): the packed
    groups, and each packed field's group."""

    groups: tuple[PackedGroup, ...]
    member_of: dict[str, PackedGroup]


def _stashed(names: Names, schema: Schema, f: Field) -> list[str]:
    """A required lazy field read before its first stash has no buffer to read."""
    if not _lazy(f) or f.optional:
        return []
    owner, name = names.literal, names.field_literal[f.name]
    return [
        f"if {_buf(names, schema, f)} is None:",
        f"    raise _rt.never_stashed({owner}, {name})",
    ]


def _flat(f: Field) -> str:
    return ".flatten()" if f.target_shape is TargetShape.FLAT else ""


def _gather(names: Names, schema: Schema, f: Field) -> str:
    """``f``'s rows at ``indices`` as its target takes them (not for packed fields); a
    flat target's rows of one element from the buffer's flat view, where the map has
    one (Note [One-element rows] in relay/runtime.py)."""
    rows = f"{_buf(names, schema, f)}.index_select(0, indices)"
    if not _flat(f):
        return rows
    flat = f"state.flat[{schema.fields.index(f)}]"
    return (
        f"({flat}.index_select(0, indices) if {flat} is not None else {rows}.flatten())"
    )


def _gather_read(
    names: Names, schema: Schema, f: Field, target: str, gate: str | None = None
) -> list[str]:
    """Hand ``f``'s rows at ``indices`` to ``target`` (not for packed fields); ``gate``
    spells ``f``'s gate."""
    if f.optional:
        flag = _carried(schema, f)
        if gate is not None:  # the batch says whether its rows hold the field
            flag = f"{flag} and {gate}"
        return [f"{target} = {_gather_optional(names, schema, f, flag, True)}"]
    return [*_stashed(names, schema, f), f"{target} = {_gather(names, schema, f)}"]


def _gather_optional(
    names: Names, schema: Schema, f: Field, flag: str, as_target: bool = False
) -> str:
    """Optional field ``f``'s rows at ``indices`` (``as_target``: as its target takes
    them) where ``flag`` (the latest write carried it) holds and its buffer exists,
    else ``None``: spelled out, no call per field."""
    buf = _buf(names, schema, f)
    if _lazy(f):  # the test narrows the buffer's type for the gather
        flag = f"({flag})" if " or " in flag else flag
        flag = f"{flag} and {buf} is not None"
    rows = _gather(names, schema, f) if as_target else f"{buf}.index_select(0, indices)"
    return f"{rows} if {flag} else None"


def _placeholder_read(names: Names, schema: Schema, f: Field, target: str) -> list[str]:
    at, pending, rows = names.placeholder[f.name]
    value = names.value[f.name]
    return [
        f"{at} = {target}",
        f"{pending} = {at} < 0",
        f"{rows} = {at}.neg().clamp(min=0)",
        f"{value} = {_buf(names, schema, f)}.index_select(0, {rows})",
        f"{at}.copy_(torch.where({pending}, {value}, {at}))",
    ]


def _scatter_read(
    names: Names, schema: Schema, f: Field, target: str
) -> tuple[list[str], list[str]]:
    """Rows at ``indices`` into flat ``target`` from each request's start offset: the
    plan (one gather, the checked positions: Note [Scatter destinations] in
    runtime.py), then the write (one scatter). A counted field, or several fields into
    one target, is one span, planned and written where its last field is declared."""
    span = _span(schema, f)
    if span:
        last = max(span, key=schema.fields.index)
        return _span_read(names, schema, span, target) if f is last else ([], [])
    i = schema.fields.index(f)
    rows = names.value[f.name]
    at = names.placeholder[f.name][0]
    flat = ".flatten()" if f.shape else ""
    assert f.scatter is not None
    offsets = f.scatter.offsets
    args = ["state", str(i), _through(offsets, target), "indices", target]
    bounds = _bounds(f.scatter, target)
    plan = [
        *_stashed(names, schema, f),
        f"{rows} = {_buf(names, schema, f)}.index_select(0, indices){flat}{_cast(f)}",
        join(f"{at} = _rt.scatter_at(", [*args, *_owners(schema), *bounds]),
    ]
    return plan, [
        f"{target}.index_copy_(0, {at}, {rows})",
    ]


def _cast(f: Field) -> str:
    """The cast of a scatter's gathered rows to its target's dtype, where it declares
    one (Note [Casting scatters] in runtime.py)."""
    cast = f.scatter.cast if f.scatter is not None else None
    return "" if cast is None else cast_to(cast)


def _scattered(
    schema: Schema, reads: Sequence[Field], spelled: dict[str, str]
) -> list[str]:
    """Debug mode's check of each scatter target once its reads were checked: a slot
    with nothing to hand over is named as such before its poison in the target could
    be taken for a placeholder no request covered."""
    lines = []
    for f in reads:
        if f.scatter is None or f.target is None:
            continue
        span = _span(schema, f)
        if span and f is not max(span, key=schema.fields.index):
            continue
        if not all(g.scatter and g.scatter.rest_checked for g in span or [f]):
            continue  # the rest of the target is the engine's
        i = schema.fields.index(f)
        lines.append(f"_rt.scattered(state, {i}, {spelled[f.target]})")
    return lines


def _span(schema: Schema, f: Field) -> list[Field]:
    """The scatter fields into ``f``'s target, first of a request's span first (``after``
    chains them; validation refused any other layout), where ``f`` counts its values or
    shares its target; else none. The span is read where its last field is declared."""
    shared = [
        (g, scatter)
        for g in schema.fields
        if (scatter := g.scatter) is not None and g.target == f.target
    ]
    if len(shared) == 1 and shared[0][1].lengths is None and shared[0][1].when is None:
        return []
    following = {s.after: g for g, s in shared}
    order = [next(g for g, s in shared if s.after is None)]
    while order[-1].name in following and len(order) < len(shared):
        order.append(following[order[-1].name])
    return order


def _span_read(
    names: Names, schema: Schema, span: Sequence[Field], target: str
) -> tuple[list[str], list[str]]:
    """Every field of one span: each gathered, one checked plan of them all, then its
    write (Note [Counted scatters] in runtime.py)."""
    scatters = [g.scatter for g in span if g.scatter is not None]
    positions = [str(schema.fields.index(g)) for g in span]
    locals_ = [names.value[g.name] for g in span]
    counts = [
        _through(s.lengths or s.when or "", target) if s.lengths or s.when else "None"
        for s in scatters
    ]
    at = names.placeholder[span[-1].name][0]

    def tup(items: list[str]) -> str:
        return join("(", items, ",)" if len(items) == 1 else ")")

    args = [
        "state",
        tup(positions),
        tup(locals_),
        _through(scatters[0].offsets, target),
        "indices",
        target,
        tup(counts),
        *_owners(schema),
        *_bounds(scatters[0], target),
    ]
    plan = [
        *(line for g in span for line in _stashed(names, schema, g)),
        *(
            f"{local} = {_buf(names, schema, g)}.index_select(0, indices){_cast(g)}"
            for g, local in zip(span, locals_)
        ),
        join(f"{at} = _rt.span_at(", args),
    ]
    return plan, [
        f"_rt.scatter_span({target}, {at})",
    ]


def _bounds(scatter: Scatter, target: str) -> list[str]:
    """``rows=`` of a scatter whose span is bounded by its batch rows: the rows'
    starts and each request's row (``None``: request ``i`` is row ``i``)."""
    rows = scatter.rows
    if rows is None:
        return []
    index = _through(rows.index, target) if rows.index is not None else "None"
    return [f"rows=({_through(rows.starts, target)}, {index})"]


def _through(path: str, target: str) -> str:
    """``batch.<path>``, or ``path`` itself where it goes through the parent that
    ``target`` is spelled through: a resolve binds that parent to a local (under an
    optional parent, once it is known to be set, so mypy knows it too)."""
    first = path.split(".")[0]
    if (
        "." in path
        and not target.startswith("batch.")
        and target.split(".")[0] == first
    ):
        return path
    return f"batch.{path}"


def _packed_read(names: Names, f: Field, target: str) -> str:
    """The batch's view of ``f``'s columns of its group's gathered block."""
    local = names.value[f.name]
    if not f.shape:
        return f"{target} = {local}.squeeze(1)"
    if len(f.shape) == 1:
        return f"{target} = {local}"
    return join(
        f"{target} = torch.unflatten(",
        [local, "1", f"self.{names.buffer[f.name]}.shape[1:]"],
    )


def _packed_block(
    names: Names, schema: Schema, reads: Sequence[Field], packed_reads: PackedReads
) -> list[str]:
    """Every gather of a packed map at once: one ``index_select`` per packed buffer and
    per field of its own, then each packed buffer's rows split into its fields."""
    lines = [
        f"{names.packed[g.dtype][2]} = self.{names.packed[g.dtype][0]}"
        ".index_select(0, indices)"
        for g in packed_reads.groups
    ]
    for f in reads:
        if f.name in packed_reads.member_of or f.resolve is not Resolve.GATHER:
            continue
        local = names.value[f.name]
        if f.optional:
            flag = _carried(schema, f)
            lines.append(f"{local} = {_gather_optional(names, schema, f, flag)}")
        else:
            lines.append(f"{local} = {_buf(names, schema, f)}.index_select(0, indices)")
    split = [
        join(
            f"{', '.join(names.value[m.field.name] for m in g.members)} = "
            f"{names.packed[g.dtype][2]}.split_with_sizes(",
            [f"self.{names.packed[g.dtype][1]}", "1"],
        )
        for g in packed_reads.groups
    ]
    return [*lines, *split]


def _parents(
    names: Names, schema: Schema, paths: Sequence[str], bound: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """``spec_info = batch.spec_info`` for each first part of a dotted path written
    more than once (and each in ``bound``, already a local), and the spelling of each
    path through it."""
    firsts = [p.split(".")[0] for p in paths if "." in p]
    taken = names.taken
    shared = [
        name
        for name in dict.fromkeys(firsts)
        if name not in bound and firsts.count(name) > 1 and name not in taken
    ]
    spelled = {}
    for path in paths:
        first = path.split(".")[0]
        local = first in shared or first in bound
        spelled[path] = path if local else f"batch.{path}"
    return [f"{name} = batch.{name}" for name in shared], spelled


def _none(parent: str, how: IfNone, method: str) -> list[str]:
    """What a resolve does where its optional parent is ``None``."""
    if how is IfNone.SKIP:
        return [f"if {parent} is None:", "    return"]
    args = [string_literal(s) for s in (method, parent)]
    return [
        f"if {parent} is None:",
        f"    raise _rt.parent_is_none(_TABLE, {', '.join(args)})",
    ]


def _prologue(
    schema: Schema, method: str, lane: Lane, count: bool = False
) -> tuple[list[str], str | None]:
    """The slots of ``lane``'s resolves (Note [Slots per lane] in relay/schema.py), the
    zero-slots return (``count``: their number kept, for a host sum); and the optional
    parent the slots path goes through, bound (its ``None`` case already handled)."""
    parents = dict(schema.optional_parents)
    slots = schema.slots_of(lane)
    first, _, rest = slots.partition(".")
    lines = []
    bound = None
    if rest and first in parents:
        bound = first
        lines += [f"{first} = batch.{first}", *_none(first, parents[first], method)]
        lines.append(f"indices = {first}.{rest}")
    else:
        lines.append(f"indices = batch.{slots}")
    how = parents.get(slots)
    if how is IfNone.SKIP:  # the slots themselves may be None (sglang's future_indices)
        lines += ["if indices is None:", "    return"]
    elif how is IfNone.REFUSE:
        args = ", ".join(string_literal(a) for a in (method, slots))
        lines += [
            "if indices is None:",
            f"    raise _rt.parent_is_none(_TABLE, {args})",
        ]
    if count:
        lines += ["count = indices.numel()", "if count == 0:", "    return"]
    else:
        lines += ["if indices.numel() == 0:", "    return"]
    return lines, bound


def _slots_read(method: str) -> list[str]:
    """Debug mode's check of the slots a resolve reads, and slots narrower than int64
    widened (``index_select`` takes int64 and int32 only): one test when neither.
    Meta slots are refused there too: ``index_select`` takes them without a word and
    hands back uninitialised rows (an attribute read, no op)."""
    return [
        "if debug is not None or indices.dtype is not _INT64 or indices.is_meta:",
        f'    indices = _rt.read_slots(state, "{method}", indices)',
    ]


def _owners(schema: Schema, lane: Lane = Lane.FORWARD) -> list[str]:
    """``owners=`` of a resolve of ``lane``'s, where that lane names its requests; with
    member rows, built of the batch's requests and tail (debug mode only: a schema
    with member rows has no scatter, whose refusals read the owners in either mode)."""
    owners = schema.owners_of(lane)
    if isinstance(owners, Members):
        return [f"owners=_rt.MemberRows(batch.{owners.requests}, batch.{owners.tail})"]
    return [f"owners=batch.{owners}"] if owners else []


def _plans(
    names: Names, schema: Schema, reads: Sequence[Field], spelled: dict[str, str]
) -> list[str]:
    """Every scatter's plan (its checks and positions), before any of them writes."""
    lines = []
    for f in reads:
        if f.scatter is not None and f.target is not None:
            lines += _scatter_read(names, schema, f, spelled[f.target])[0]
    return lines


def partial_read(reads: Sequence[Field], packed_reads: PackedReads | None) -> bool:
    """Whether ``resolve_future`` takes ``partial=``: it reads kept fields, each an
    optional plain gather, which ``partial=True`` leaves unread (Note [Partial reads])."""
    kept = [f for f in reads if f.kept]
    plain = all(f.optional and f.resolve is Resolve.GATHER for f in kept)
    return packed_reads is None and bool(kept) and plain


# Note [Partial reads]
# ~~~~~~~~~~~~~~~~~~~~
# A resolve may read only what a partial stash writes (sglang's mixed batch gathers its
# decode rows' bonus tokens and none of the draft extras). ``resolve_future(batch,
# partial=True)`` gates every kept field off, as a gate does: ``None`` handed, nothing
# read, and debug mode neither checks nor consumes those rows, which stay for the next
# full read.


def _gate(
    schema: Schema, f: Field, spelled: dict[str, str], partial: bool = False
) -> str | None:
    """``f``'s gate spelled: the batch's flag, or whether the map carries the field a
    ``Carried`` names; a kept field's also off where the call is partial. A ``Switch``
    needs none: a field this map does not relay is never carried."""
    gate = None
    if isinstance(f.gate, Carried):
        other = next(g for g in schema.fields if g.name == f.gate.field)
        gate = _carried(schema, other)
    elif isinstance(f.gate, str):
        gate = spelled[f.gate]
    if partial and f.kept:
        return "not partial" if gate is None else f"not partial and {gate}"
    return gate


def _reads(
    names: Names,
    schema: Schema,
    reads: Sequence[Field],
    packed_reads: PackedReads | None,
    spelled: dict[str, str],
    planned: bool = False,
    partial: bool = False,
) -> list[str]:
    """Each read's lines; a scatter's write alone where ``planned`` (``_plans``); kept
    fields gated on the call's ``partial`` where it takes one."""
    lines = []
    for f in reads:
        assert f.target is not None
        target = spelled[f.target]
        if f.resolve is Resolve.PLACEHOLDER:
            lines += [
                *_stashed(names, schema, f),
                *_placeholder_read(names, schema, f, target),
            ]
        elif f.scatter is not None:
            plan, scatter = _scatter_read(names, schema, f, target)
            lines += scatter if planned else plan + scatter
        elif packed_reads is not None and f.name in packed_reads.member_of:
            lines.append(_packed_read(names, f, target))
        elif packed_reads is not None and f.optional and _flat(f):
            local = names.value[f.name]
            lines.append(f"{target} = None if {local} is None else {local}.flatten()")
        elif packed_reads is not None:
            lines.append(f"{target} = {names.value[f.name]}{_flat(f)}")
        else:
            gate = _gate(schema, f, spelled, partial)
            lines += _gather_read(names, schema, f, target, gate)
    return lines


def _placeholder_reports(
    names: Names, schema: Schema, reads: Sequence[Field]
) -> list[str]:
    report = []
    for f in reads:
        if f.resolve is Resolve.PLACEHOLDER:
            _at, pending, rows = names.placeholder[f.name]
            buffers = f"{{{names.field_literal[f.name]}: {_buf(names, schema, f)}}}"
            args = [
                rows,
                buffers,
                f"taken={pending}",
                "distinct=True",
                *_owners(schema),
            ]
            report.append(join('debug.read("resolve_future", ', args))
    return report


def resolve_future(
    names: Names,
    schema: Schema,
    reads: Sequence[Field],
    packed_reads: PackedReads | None,
) -> list[str]:
    """The forward-lane resolve: seeds first where the map takes them, then gathers and
    placeholder substitutions, those under an optional parent only where it is set;
    debug mode checks the slots and reports the reads."""
    lines, bound = _prologue(schema, "resolve_future", Lane.FORWARD)
    if schema.seeded:  # on the forward stream, whatever this batch holds (Note [Seeds])
        lines[:0] = ["if state.seeds:", "    _rt.apply_seeds(state)"]
    lines[:0] = ["state = self._state"]
    lines += ["debug = state.debug", *_slots_read("resolve_future")]
    parents = {k: v for k, v in schema.optional_parents if k != bound}
    under: dict[str, list[Field]] = {}
    outside = []
    for f in reads:
        first = (f.target or "").split(".")[0]
        if "." in (f.target or "") and first in parents:
            under.setdefault(first, []).append(f)
        else:
            outside.append(f)
    taken = [p for p in (bound, *under) if p is not None]
    paths = [f.target for f in reads if f.target]
    paths += [f.gate for f in reads if isinstance(f.gate, str)]
    binds, spelled = _parents(names, schema, paths, taken)
    lines += binds
    for parent in under:  # refused before anything is handed over
        if parents[parent] is IfNone.REFUSE:
            lines.append(f"{parent} = batch.{parent}")
            lines += _none(parent, IfNone.REFUSE, "resolve_future")

    if packed_reads is not None:
        lines += [s for f in reads for s in _stashed(names, schema, f)]
        lines += _packed_block(names, schema, reads, packed_reads)
    # Every target's plan before any write, those under a parent where it is set.
    lines += _plans(names, schema, outside, spelled)
    bound_early = set()
    for parent, fields in under.items():
        plans = _plans(names, schema, fields, spelled)
        if plans and parents[parent] is IfNone.REFUSE:
            lines += plans
        elif plans:
            bound_early.add(parent)
            lines += [f"{parent} = batch.{parent}", f"if {parent} is not None:"]
            lines += _indent(plans)
    partial = partial_read(reads, packed_reads)
    lines += _reads(
        names, schema, outside, packed_reads, spelled, planned=True, partial=partial
    )
    reports = _placeholder_reports(names, schema, outside) + _scattered(
        schema, outside, spelled
    )
    absent = []
    for parent, fields in under.items():
        body = _reads(
            names, schema, fields, packed_reads, spelled, planned=True, partial=partial
        )
        placeholders = _placeholder_reports(names, schema, fields)
        placeholders += _scattered(schema, fields, spelled)
        if parents[parent] is IfNone.REFUSE:
            lines += body
            reports += placeholders
            continue
        if parent not in bound_early:
            lines.append(f"{parent} = batch.{parent}")
        if placeholders:  # reported where they were read
            body += ["if debug is not None:", *_indent(placeholders)]
        lines += [f"if {parent} is not None:", *_indent(body)]
        named = string_literal(parent)
        absent.append(f"(() if {parent} is not None else ({named},))")
    return lines + _future_reports(schema, reads, reports, absent, spelled, partial)


def _future_reports(
    schema: Schema,
    reads: Sequence[Field],
    reports: list[str],
    absent: list[str],
    spelled: dict[str, str],
    partial: bool = False,
) -> list[str]:
    """The end of ``resolve_future``: debug mode's reports of what it read."""
    if any(f.resolve is not Resolve.PLACEHOLDER for f in reads):
        args = ['"resolve_future"', "indices", *_owners(schema)]
        if absent:
            args.append(f"absent={' + '.join(absent)}")
        gated = [
            f"(() if {gate} else ({string_literal(f.name)},))"
            for f in reads
            if (gate := _gate(schema, f, spelled, partial)) is not None
        ]
        if gated:
            args.append(f"gated_off={' + '.join(gated)}")
        reports = [join("_rt.read_back(state, ", args), *reports]
    return ["if debug is not None:", *_indent(reports)] if reports else []


def _exact_sum(f: Field) -> bool:
    """Whether ``f``'s host sum adds integers of its declared dtype: its host copy's
    dtype is the buffer's, so the sum tests none."""
    dtype = f.dtype
    return (
        isinstance(dtype, torch.dtype)
        and not (dtype.is_floating_point or dtype.is_complex)
        and not _lazy(f)
    )


def _counted_sum(f: Field) -> bool:
    """Whether ``f``'s host sum adds one integer per slot (``_exact_sum``, rows of one
    value): the resolve sums up to ``HOST_SUM_IN_PYTHON_MAX`` of them in Python,
    choosing by the slots' count, which it has read already."""
    host = f.host
    return host is not None and host.sum is not None and _exact_sum(f) and not f.shape


def _host(names: Names, f: Field, source: str) -> list[str]:
    """The host mirror and host sum of a schedule field, copied from ``source``."""
    mirror, total = (f.host.mirror, f.host.sum) if f.host else (None, None)
    if mirror is None and total is None:
        return []
    copy = f"self.{names.host[f.name]}.copy({source})"
    optional = f.host is not None and f.host.optional
    local = "host_copy" if optional else "host"  # ``host`` is the resolve's flag there
    if total is None:
        stmts = [f"batch.{mirror} = {copy}"]
    else:
        stmts = [f"{local} = {copy}"]
        if mirror is not None:
            stmts.append(f"batch.{mirror} = {local}")
        if _counted_sum(f):
            small = "count <= _rt.HOST_SUM_IN_PYTHON_MAX"
            add = f"sum({local}.tolist()) if {small} else _rt.int_sum({local})"
        else:
            add = f"_rt.{'int_sum' if _exact_sum(f) else 'host_sum'}({local})"
        stmts.append(f"batch.{total} = {add}")
    if not optional:
        return stmts
    nones = [f"batch.{p} = None" for p in (mirror, total) if p is not None]
    return ["if host:", *_indent(stmts), "else:", *_indent(nones)]


def resolve_schedule(names: Names, schema: Schema, f: Field) -> list[str]:
    """A schedule-lane resolve: the fence wait (on the stream where the caller asks and
    the field allows it), then the field's read."""
    method = resolve_method(f)
    value = names.value[f.name]
    lines, _bound = _prologue(schema, method, Lane.SCHEDULE, _counted_sum(f))
    lines[:0] = ["state = self._state"]
    if f.host is not None and f.host.stream_ordered:
        lines += [
            "if stream_ordered:",
            "    state.fence.wait_on_stream()",
            "else:",
            "    state.fence.wait()",
        ]
    else:
        lines.append("state.fence.wait()")
    lines.append("debug = state.debug")
    lines += ["if debug is not None:", f'    debug.waited("{method}")']
    lines += _slots_read(method)
    read = [*_stashed(names, schema, f), f"{value} = {_gather(names, schema, f)}"]
    if f.target is not None:
        read.append(f"batch.{f.target} = {value}")
    read += _host(names, f, value)
    if f.optional:
        flag = _carried(schema, f)
        host = f.host
        nones = [host.mirror, host.sum] if host is not None else []
        nones.append(f.target)
        lines += [
            f"if {flag} and {_buf(names, schema, f)} is not None:",
            *_indent(read),
            "else:",
        ]
        lines += _indent([f"batch.{p} = None" for p in nones if p is not None])
    else:
        lines += read
    args = [f'"{method}"', "indices", *_owners(schema, Lane.SCHEDULE)]
    report = join("_rt.read_back(state, ", args)
    return [*lines, "if debug is not None:", f"    {report}"]


def graph_wrote(schema: Schema) -> list[str]:
    """Nothing with debug off; debug mode records the graph's write of the rows."""
    taken = schema.owners is not None or schema.owners_of(Lane.SCHEDULE) is not None
    args = ", ".join(["self._state", "indices", *(["owners"] if taken else [])])
    return ["if self._state.debug is not None:", f"    _rt.graph_wrote({args})"]


def resolve_tails(names: Names, schema: Schema, f: Field) -> list[str]:
    """Late binding of a mixed batch's decode tails from field ``f``'s published rows:
    a stream-ordered fence wait, one gather, then each declared tail built on a copy of
    the batch's tensor, and only when all are built is the batch rebound (a refusal
    leaves it as it was); debug mode checks the second read."""
    tails = f.tails
    assert tails is not None and f.target is not None
    mirror, total = (f.host.mirror, f.host.sum) if f.host else (None, None)
    i = schema.fields.index(f)
    value = names.value[f.name]
    lines = [
        "state = self._state",
        f"indices = batch.{tails.rows}",
        "if indices.numel() == 0:",
        "    return",
        "state.fence.wait_on_stream()",
        "debug = state.debug",
        *_slots_read("resolve_tails"),
        *_stashed(names, schema, f),
        f"{value} = {_buf(names, schema, f)}.index_select(0, indices)",
        "if debug is not None:",  # a stale row is named before its value is used
        f"    _rt.read_tails({', '.join(['state', str(i), 'indices', *_owners(schema)])})",
    ]
    bind = "_rt.bind_tails"
    # An engine that may want no host copy (HostCopy(optional=True)) leaves the
    # mirror None: its tail is bound only where the batch has one.
    maybe = f.host is not None and f.host.optional
    host = "None"
    if mirror is not None:  # validation: a sum, a prefix need a mirror here
        copied = f"self.{names.host[f.name]}.copy({value})"
        if tails.prefix is not None or tails.kv is not None or maybe:  # one copy
            lines.append(f"host = {copied}")
            copied = host = "host"
    bound = [(f.target, "tail_lengths", bind, plus(value, tails.add))]
    if tails.kv is not None:  # the columns checked first: runtime.tail_locations
        columns = plus(value, tails.add - 1)
        args = ["state", str(i), f"batch.{tails.kv.table}", "indices"]
        locations = join(
            "_rt.tail_locations(", [*args, columns, host, *_owners(schema)]
        )
        bound.append((tails.kv.locations, "tail_locations", bind, locations))
    optional_mirror: list[str] = []
    if mirror is not None and not maybe:
        bound.append((mirror, "tail_host", bind, plus(copied, tails.add)))
    elif mirror is not None:
        mirror_args = ["state", str(i), string_literal(mirror), f"batch.{mirror}"]
        call = join(f"{bind}(", [*mirror_args, plus(copied, tails.add)])
        optional_mirror = [f"tail_host = None if batch.{mirror} is None else {call}"]
    if tails.prefix is not None:
        rows = plus("host", tails.add - 1)
        bound.append((tails.prefix, "tail_prefix", "_rt.bind_tail_list", rows))
    lines += [
        join(
            f"{local} = {call}(",
            ["state", str(i), string_literal(a), f"batch.{a}", rows],
        )
        for a, local, call, rows in bound
    ]
    lines += optional_mirror
    lines += [f"batch.{a} = {local}" for a, local, _, _ in bound]
    rebind = [f"batch.{mirror} = tail_host"] if optional_mirror else []
    if total is not None:
        rebind.append(f"batch.{total} = _rt.host_sum(tail_host)")
    if optional_mirror:
        lines += ["if tail_host is not None:", *_indent(rebind)]
    else:
        lines += rebind
    return lines


def invalidate(schema: Schema, placeholders: Sequence[Field]) -> list[str]:
    """Placeholders ``-indices`` into every placeholder target (under an optional
    parent, only where it is set)."""
    lines = [
        "if indices.numel() == 0:",
        "    return",
        "if self._state.debug is not None:",
        '    self._state.debug.check_slots("invalidate", indices, scratch_ok=False)',
    ]
    parents = dict(schema.optional_parents)
    for f in placeholders:
        assert f.target is not None
        first = f.target.split(".")[0]
        write = f"batch.{f.target} = indices.neg()"
        if "." not in f.target or first not in parents:
            lines.append(write)
        elif parents[first] is IfNone.SKIP:
            lines += [f"if batch.{first} is not None:", f"    {write}"]
        else:
            args = ", ".join(string_literal(s) for s in ("invalidate", first))
            lines += [
                f"if batch.{first} is None:",
                f"    raise _rt.parent_is_none(_TABLE, {args})",
                write,
            ]
    return lines


def release() -> list[str]:
    """Nothing with debug off; debug mode marks the slots' unread values stale."""
    return [
        "if self._state.debug is not None:",
        "    self._state.debug.release(indices)",
    ]


def lane_fields(schema: Schema, lane: Lane) -> list[Field]:
    return [f for f in schema.fields if f.lane is lane]


# --- every body of one map -------------------------------------------------------------------


@attrs.frozen
class Bodies:
    """Every method body of one map, and each resolved field's line of its resolve's
    doc string: computed in one pass, before the views assemble the methods."""

    stash: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()
    stash_partial: tuple[str, ...] = ()
    graph_wrote: tuple[str, ...] = ()
    invalidate: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    resolve_future: tuple[str, ...] = ()
    #: Whether ``resolve_future`` takes ``partial=`` (Note [Partial reads]).
    partial_read: bool = False
    #: Each schedule field's resolve, by field name.
    schedule: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    resolve_tails: tuple[str, ...] = ()
    #: Each field's line of its resolve's doc string, by field name.
    read_doc: dict[str, str] = attrs.field(factory=dict)


def bodies(names: Names, schema: Schema, packed_reads: PackedReads | None) -> Bodies:
    """The bodies ``schema``'s map has (an empty one for a method it lacks)."""
    forward = lane_fields(schema, Lane.FORWARD)
    declared = lane_fields(schema, Lane.SCHEDULE)
    schedule = _required_first(declared)
    partial = [f for f in forward if not f.kept]
    passed = ", owners" if schema.owners else ""
    published = ", owners" if schema.owners_of(Lane.SCHEDULE) is not None else ""
    none: tuple[str, ...] = ()
    stash = publish = stash_partial = wrote = placeholders_body = future = none
    if forward:
        checked = f"_rt.stash(state, indices, payload{passed})"
        stash = tuple(write(names, schema, "stash", forward, checked))
    if schedule:
        checked = f"_rt.publish(state, indices, {_values(declared)}{published})"
        publish = tuple(write(names, schema, "publish", schedule, checked))
    if len(partial) < len(forward):
        checked = f"_rt.stash_partial(state, indices, {_values(partial)}{passed})"
        body = write(names, schema, "stash_partial", _required_first(partial), checked)
        stash_partial = tuple(body)
    if any(f.graph_written for f in schema.fields):
        wrote = tuple(graph_wrote(schema))
    placeholders = [f for f in schema.fields if f.resolve is Resolve.PLACEHOLDER]
    if placeholders:
        placeholders_body = tuple(invalidate(schema, placeholders))
    reads = [f for f in forward if f.target is not None]
    if reads:
        future = tuple(resolve_future(names, schema, reads, packed_reads))
    tails = [tuple(resolve_tails(names, schema, f)) for f in declared if f.tails]
    return Bodies(
        stash=stash,
        publish=publish,
        stash_partial=stash_partial,
        graph_wrote=wrote,
        invalidate=placeholders_body,
        release=tuple(release()),
        resolve_future=future,
        partial_read=bool(reads) and partial_read(reads, packed_reads),
        schedule={f.name: tuple(resolve_schedule(names, schema, f)) for f in declared},
        resolve_tails=tails[0] if tails else (),
        read_doc={
            f.name: resolve_doc(names, f) for f in schema.fields if f.target is not None
        },
    )


def _required_first(fields: Sequence[Field]) -> list[Field]:
    """Required parameters first (Python's rule)."""
    return [f for f in fields if not f.optional] + [f for f in fields if f.optional]


def _values(fields: Sequence[Field]) -> str:
    """The checked path's tuple of values, in declaration order as the table has them."""
    sources = [f.payload_name for f in fields]
    return join("(", sources, ",)" if len(sources) == 1 else ")")
