"""The bodies of the generated methods, assembled from what each field's kinds contribute.

A body is a list of plain statements, nested blocks indented four spaces relative to
the method body; the template indents them into place and the pinned formatter lays
them out. ``Shape`` says which generated class a body is for.

Note [Two shapes] (in ``relay/runtime.py``): the public class (``EagleFutureMap``) is
debug mode off, each method holding only its work: the checks that cost no op (row
shapes, the host slot check on the CPU), the writes, the gathers, the fence. Built with
``debug=True``, the constructor makes the map an instance of the private subclass
(``_EagleFutureMapDebug``, via ``relay.runtime.debug_class``): the same work with debug
mode's checks and reports around it, through ``relay.runtime.DebugChecks`` and the
guard helpers. The API, the payload and batch types and what mypy sees are one
class's; ``isinstance`` holds for both.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from relay.codegen import kinds, naming
from relay.codegen.kinds.base import join
from relay.runtime import HOST_SUM_IN_PYTHON_MAX
from relay.schema import Schema

if TYPE_CHECKING:
    from relay.codegen.views import FieldView, FusedView, GroupView

__all__ = [
    "Shape",
    "invalidate",
    "release",
    "resolve_future",
    "resolve_schedule",
    "write",
]


class Shape(enum.Enum):
    """Which class a body belongs to (Note [Two shapes])."""

    #: The public class: debug mode off, the work alone.
    OFF = "off"
    #: The debug-mode subclass: the same work inside debug mode's checks.
    DEBUG = "debug"


def _indent(lines: Sequence[str]) -> list[str]:
    return ["    " + line for line in lines]


def _debug(lines: Sequence[str], shape: Shape) -> list[str]:
    """Debug-mode statements: there in the debug subclass, absent with debug off."""
    return list(lines) if shape is Shape.DEBUG else []


def _debug_flag(shape: Shape) -> str:
    """Whether the map checks, as source (a new lazy buffer starts poisoned then)."""
    return str(shape is Shape.DEBUG)


# --- stash / publish ---------------------------------------------------------------------


def _check(f: FieldView) -> list[str]:
    """The row-shape check of ``f``'s value (Note [Checked values] in runtime.py)."""
    n = f.names
    given = n.src if f.optional else n.given
    args = [n.what, given, "indices", n.buf, *kinds.alloc(f.field).check_args(n)]
    check = join(f"{n.src} = _rt.check_rows(", args)
    if not f.optional:
        return [check]
    bind = [f"{n.src} = {n.given}"] if n.src != n.given else []
    return [*bind, f"if {n.src} is not None:", f"    {check}"]


def _expected(f: FieldView) -> tuple[str, str]:
    """The dtype and shape ``f``'s value must have, as source: a lazy field's from the
    attributes its allocation sets, rows after ``index_shape`` (the writes' local)."""
    n = f.names
    dtype = f"self.{naming.dtype_cache(f.field)}" if f.lazy else n.dtype
    shape = "index_shape"
    if f.field.shape:
        shape += f" + self.{naming.row_cache(f.field)}"
    return str(dtype), shape


def _inline_check(f: FieldView) -> list[str]:
    """Debug off, the checked path: the common case of ``_check`` tested inline,
    ``check_rows`` called only when it fails (Note [Checked values] in runtime.py)."""
    n = f.names
    args = [n.what, n.src, "indices", n.buf, *kinds.alloc(f.field).check_args(n)]
    dtype, shape = _expected(f)
    common = [
        f"type({n.src}) is not torch.Tensor",
        f"{n.src}.dtype is not {dtype}",
        f"{n.src}.shape != {shape}",
    ]
    test = " or ".join(common)
    bind = [f"{n.src} = {n.given}"] if n.src != n.given else []
    check = join(f"{n.src} = _rt.check_rows(", args)
    if f.optional:
        return [*bind, f"if {n.src} is not None and ({test}):", f"    {check}"]
    return [*bind, f"if {test}:", f"    {check}"]


def _fast_test(f: FieldView, torch_checks: bool) -> str:
    """The fast path's test of ``f``'s value (Note [Fast writes] in runtime.py): its
    number of dims where ``torch_checks`` (the first write, whose own checks refuse
    before writing anything), else its dtype and whole shape."""
    n = f.names
    if torch_checks:
        return f"{n.src}.ndim == {1 + len(f.field.shape)}"
    dtype, shape = _expected(f)
    test = f"{n.src}.dtype is {dtype} and {n.src}.shape == {shape}"
    return f"({n.src} is None or ({test}))" if f.optional else test


def _fast_write(fields: Sequence[FieldView], records: bool) -> list[str]:
    """Debug off, slots ``resolve_future`` vouched for: the writes after the tests that
    let them run as they are, else on to the checked path (Note [Fast writes])."""
    first = fields[0]
    torch_checks = not first.optional and not first.lazy
    tests = [_fast_test(f, torch_checks and f is first) for f in fields]
    binds = [
        f"{f.names.src} = {f.names.given}"
        for f in fields
        if f.names.src != f.names.given
    ]
    if any("index_shape" in test for test in tests):
        # A plain tuple: vouched slots are a vector, and a tuple adds to a row in a
        # third of the time a torch.Size does (Note [Fast writes]).
        binds.insert(0, "index_shape: tuple[int, ...] = (indices.numel(),)")
    writes = []
    for f in fields:
        writes += _write_field(f, Shape.OFF, fast=True)
    if records:
        writes.append("self._fence.record()")
    vouch = "indices is self._gathered and indices._version == self._gathered_version"
    if binds:  # the values' tests read what the binds take from the payload
        body = [f"if {vouch}:", *_indent([*binds, f"if {' and '.join(tests)}:"])]
        depth = "        "  # inside both ifs
    else:
        body = [f"if {' and '.join([vouch, *tests])}:"]
        depth = "    "
    written = [depth + line for line in [*writes, "return"]]
    return [
        "# Note [Fast writes] in relay/runtime.py.",
        "try:",
        *_indent([*body, *written]),
        "except (AttributeError, IndexError, RuntimeError, TypeError):",
        "    pass  # the checked path below refuses it, or writes it again whole",
    ]


def _guard(f: FieldView) -> list[str]:
    stmt = kinds.guard(f.field).statement(f.names)
    if stmt is None:
        return []
    if f.optional:
        return [f"if {f.names.src} is not None:", f"    {stmt}"]
    return [stmt]


def _write_field(f: FieldView, shape: Shape, *, fast: bool = False) -> list[str]:
    """The write of ``f``'s checked value into rows ``slots``; ``fast``: on the fast
    path (Note [Fast writes] in runtime.py), into rows ``indices``, whose test saw the
    buffer made."""
    n = f.names
    alloc = kinds.alloc(f.field)
    if fast:
        stmts = alloc.fast_write(n)
    else:
        stmts = alloc.write(n, _debug_flag(shape), cache=shape is Shape.OFF)
    slots = "indices" if fast else "slots"
    if not f.optional:
        return stmts
    return [
        f"{n.carried} = {n.src} is not None",
        f"if {n.src} is not None:",
        *_indent(stmts),
        f"elif {n.buf} is not None:" if alloc.lazy else "else:",
        "    # Note [Optional fields]: no earlier value survives an omission.",
        f"    {n.buf}.index_fill_(0, {slots}, 0)",
    ]


def _carried(fields: Sequence[FieldView], flag: str) -> list[str]:
    """``carried={"hidden_states": ...}`` for the optional ``fields`` (none: nothing):
    whether a write carried each (``flag="src"``) or a resolve reads it (``"carried"``)."""
    optional = [f for f in fields if f.optional]
    if not optional:
        return []
    items = [
        f"{naming.string_literal(f.name)}: "
        + (f"{f.names.src} is not None" if flag == "src" else str(f.names.carried))
        for f in optional
    ]
    return [join("carried={", items, "}")]


def _names(names: Sequence[str]) -> str:
    literals = [naming.string_literal(name) for name in names]
    return join("(", literals, ",)" if len(literals) == 1 else ")")


def write(
    cls: str,
    op: str,
    fields: Sequence[FieldView],
    vouched: bool,
    shape: Shape,
) -> list[str]:
    """``stash`` or ``publish``: every check before any write, then the writes; publish
    records the fence. ``vouched``: whether ``resolve_future`` vouches for its slots
    (Note [Vouched slots] in runtime.py)."""
    records = op == "publish"
    lines = ["# Every check before any write: a refused call leaves the map as it was."]
    if shape is Shape.DEBUG:
        for f in fields:
            lines += _check(f)
        lines += ["if indices.numel() == 0:", "    return"]
        lines.append(f'self._debug.check_slots("{op}", indices)')
        for f in fields:
            lines += _guard(f)
        lines.append(
            "slots = indices if indices.dtype is torch.int64 else indices.long()"
        )
    else:
        if vouched and fields:
            lines[:0] = _fast_write(fields, records)
        lines.append(
            "index_shape = indices.shape if type(indices) is torch.Tensor else _rt.NO_ROWS"
        )
        for f in fields:
            lines += _inline_check(f)
        first = fields[0].names.what if fields else naming.string_literal(cls)
        args = [
            naming.string_literal(f"{cls}.{op}"),
            first,
            "indices",
            "self.pool_size",
        ]
        vouch = (
            "indices is self._gathered and indices._version == self._gathered_version"
            " and indices.dtype is torch.int64"
        )
        slow = join("_rt.write_slots(", args)
        if vouched:  # Note [Vouched slots] in runtime.py
            lines += [f"vouched = {vouch}", f"slots = indices if vouched else {slow}"]
        else:
            lines.append(f"slots = {slow}")
        lines += ["if slots is None:", "    return"]
    for f in fields:
        lines += _write_field(f, shape)
    wrote = [f'"{op}"', "indices", _names([f.name for f in fields])]
    report = [join("self._debug.wrote(", [*wrote, *_carried(fields, "src")])]
    if records:
        report.append("self._debug.publishing()")
    lines += _debug(report, shape)
    if records:
        lines.append("self._fence.record()")
    return lines


# --- resolves ------------------------------------------------------------------------------


def _buffers(fields: Sequence[FieldView]) -> str:
    """``{"topk_p": self.topk_p_buf, ...}``: what a debug ``read`` report reads."""
    items = [f"{naming.string_literal(f.name)}: {f.names.buf}" for f in fields]
    return join("{", items, "}")


def _host(f: FieldView, source: str) -> list[str]:
    """The host mirror and host sum of a schedule field, copied from ``source``."""
    n, field = f.names, f.field
    if field.host_mirror is None and field.host_sum is None:
        return []
    copy = f"{n.host}.copy({source})"
    if field.host_sum is None:
        return [f"batch.{field.host_mirror} = {copy}"]
    stmts = [f"host = {copy}"]
    if field.host_mirror is not None:
        stmts.append(f"batch.{field.host_mirror} = host")
    dtype = field.dtype
    if isinstance(dtype, torch.dtype) and not (
        dtype.is_floating_point or dtype.is_complex
    ):
        # relay.runtime.host_sum inlined for integers: it dispatches no data op.
        most = HOST_SUM_IN_PYTHON_MAX
        total = (
            f"sum(host.tolist()) if host.numel() <= {most} else int(host.numpy().sum())"
        )
    else:
        total = "_rt.host_sum(host)"
    stmts.append(f"batch.{field.host_sum} = {total}")
    return stmts


def _carried_test(f: FieldView) -> str:
    """Whether a resolve hands ``f`` over (Note [Optional fields])."""
    n = f.names
    return f"{n.carried} and {n.buf} is not None" if f.lazy else str(n.carried)


def _none(f: FieldView) -> list[str]:
    """What an optional read hands the batch when the latest write did not carry it."""
    field = f.field
    paths = [field.host_mirror, field.host_sum]
    if not kinds.resolve(field).target_always_tensor:
        paths.insert(0, field.target)
    return [f"batch.{p} = None" for p in paths if p is not None]


def _read_field(schema: Schema, f: FieldView) -> list[str]:
    """Hand ``f`` to the batch (not for fields of a fused gather block)."""
    read = kinds.resolve(f.field).read(f.names)
    stmts = [*read.stmts, *_host(f, read.host_src)]
    if f.optional:
        return [f"if {_carried_test(f)}:", *_indent(stmts), "else:", *_indent(_none(f))]
    return [*kinds.alloc(f.field).before_read(schema, f.names), *stmts]


def _read_report(f: FieldView) -> str:
    """The debug ``read`` report of one field: its own rows (placeholders, schedule)."""
    read = kinds.resolve(f.field).read(f.names)
    args = [f'"{f.names.reader}"', read.rows, _buffers([f]), *read.extra]
    return join("self._debug.read(", args)


def _reports(reads: Sequence[FieldView], group: str | None, shape: Shape) -> list[str]:
    """The debug reports of a resolve: ``group`` for every gather at once where set
    (resolve_future), then each placeholder's own."""
    if shape is Shape.OFF:
        return []
    if len(reads) == 1 and reads[0].optional and group is None:
        # The only read is optional: reported when it was handed over.
        return [f"if {_carried_test(reads[0])}:", f"    {_read_report(reads[0])}"]
    own = [_read_report(f) for f in reads if f.placeholder or group is None]
    return _debug([*([group] if group else []), *own], shape)


def _group_report(reads: Sequence[FieldView]) -> str | None:
    gathers = [f for f in reads if not f.placeholder]
    if not gathers:
        return None
    args = [
        '"resolve_future"',
        "indices",
        _buffers(gathers),
        *_carried(gathers, "carried"),
    ]
    return join("self._debug.read(", args)


def _fused(
    schema: Schema,
    reads: Sequence[FieldView],
    fused: FusedView,
    groups: Sequence[GroupView],
) -> list[str]:
    """A packed map's gather block (Note [Fused gather] in views.py), then its reads."""
    lines = []
    for f in reads:
        if f.plain_read and f.needs_stash:
            lines += kinds.alloc(f.field).before_read(schema, f.names)
    lines += ["if self.fused_gather:", *_indent(fused.call_stmt)]
    lines += ["else:", *_indent(fused.torch_stmts)]
    lines += [g.split_stmt for g in groups]
    for f in reads:
        lines += list(f.block_read) if f.plain_read else _read_field(schema, f)
    return lines


def _nested_once(lines: list[str], taken: set[str]) -> list[str]:
    """``spec_info = batch.spec_info`` once, after the zero-slots return, where the
    resolve hands several attributes of one nested batch object over (each
    ``batch.spec_info.x`` would read it again); ``taken``: locals it must not shadow."""
    counts: dict[str, int] = {}
    for line in lines:
        for name in re.findall(r"\bbatch\.(\w+)\.", line):
            counts[name] = counts.get(name, 0) + 1
    for name, count in counts.items():
        if count < 2 or name in taken or name in naming.RESERVED:
            continue
        at = lines.index("    return") + 1
        lines = [line.replace(f"batch.{name}.", f"{name}.") for line in lines]
        lines.insert(at, f"{name} = batch.{name}")
    return lines


def resolve_future(
    schema: Schema,
    reads: Sequence[FieldView],
    *,
    fused: FusedView | None,
    groups: Sequence[GroupView],
    slots_gathered: bool,
    shape: Shape,
) -> list[str]:
    """The forward-lane resolve: gathers and placeholder substitutions."""
    lines = [
        f"indices = batch.{schema.indices}",
        "if indices.numel() == 0:",
        "    return",
        *_debug(['self._debug.check_slots("resolve_future", indices)'], shape),
    ]
    if fused is not None:
        lines += _fused(schema, reads, fused, groups)
    else:
        for f in reads:
            lines += _read_field(schema, f)
    lines += _reports(reads, _group_report(reads), shape)
    if slots_gathered and shape is Shape.OFF:
        # Debug mode checks every write's slots; only the work remembers the gather.
        lines += [
            "try:",
            "    self._gathered_version = indices._version",
            "except RuntimeError:  # an inference tensor keeps no version counter",
            "    self._gathered = None",
            "else:",
            "    # Vouched for as a vector only (Note [Vouched slots]).",
            "    self._gathered = indices if indices.ndim == 1 else None",
        ]
    return _nested_once(lines, {f.name for f in schema.fields})


def resolve_schedule(schema: Schema, f: FieldView, shape: Shape) -> list[str]:
    """A schedule-lane resolve: the fence wait, then the field's read."""
    method = f.names.reader
    return [
        f"indices = batch.{schema.indices}",
        "if indices.numel() == 0:",
        "    return",
        "self._fence.wait()",
        *_debug(
            [
                f'self._debug.waited("{method}")',
                f'self._debug.check_slots("{method}", indices)',
            ],
            shape,
        ),
        *_read_field(schema, f),
        *_reports([f], None, shape),
    ]


def invalidate(placeholders: Sequence[FieldView], shape: Shape) -> list[str]:
    """Placeholders ``-indices`` into every placeholder target."""
    lines = ["if indices.numel() == 0:", "    return"]
    lines += _debug(
        ['self._debug.check_slots("invalidate", indices, scratch_ok=False)'], shape
    )
    for f in placeholders:
        lines += kinds.resolve(f.field).invalidate(f.names)
    return lines


def release(shape: Shape) -> list[str]:
    """Nothing with debug off; debug mode marks the slots' unread values stale."""
    return _debug(
        ["if indices.numel() > 0:", "    self._debug.release(indices)"], shape
    )
