"""The packed layout: which fields share a buffer, and where each one's columns sit.

# Note [Packed layout]
With ``Schema(layout=Layout.PACKED)`` the forward-lane fields of one dtype that are
eager, required and gathered into a target share one ``(pool_size, columns)`` buffer:
each field's row is flattened to columns and the fields sit side by side in
declaration order (an int64 bonus token and an int64 ``(topk,)`` row give
``(pool_size, 1 + topk)``). ``resolve_future`` then gathers the whole group with one
``index_select`` and hands the batch views of the gathered block (split into the
fields' columns, squeezed or unflattened back to their row shape): one data op per
dtype group instead of one per field, and view ops that move no data.

Each field keeps its ``<field>_buf`` attribute, now a fixed view of the packed buffer
made once at construction, so ``stash`` still writes one ``index_copy_`` per field and
runs no view op per call.

Lazy and optional fields keep their own buffer: a lazy field's width or dtype is known
only from its first payload, and an optional field's rows are cleared when a stash
omits it, which a shared buffer would turn into a second write of the same rows.
Placeholder fields read other rows than ``indices``, and a field without a target is
never gathered. A dtype with a single packable field keeps its own buffer too: packing
it alone would save nothing.

The batch gets views of one gathered block: tensors that share storage and are not
contiguous when their group holds more than one field (call ``.contiguous()`` where a
kernel needs it). Each resolve gathers a fresh block, so later stashes never change
what a batch holds.
"""

from __future__ import annotations

import math

import attrs
import torch

from relay.schema import (
    Alloc,
    Field,
    Lane,
    Layout,
    Resolve,
    Schema,
    TargetShape,
    Unwritten,
)

__all__ = ["Member", "PackedGroup", "packable", "packed_groups"]


def packable(field: Field) -> bool:
    """A field the packed layout puts into its dtype's shared buffer, if it has company."""
    return (
        field.lane is Lane.FORWARD
        and field.alloc is Alloc.EAGER
        and field.optional is False
        and isinstance(field.dtype, torch.dtype)
        and field.resolve is Resolve.GATHER
        and field.target is not None
        and field.target_shape is TargetShape.ROWS
        and field.unwritten is Unwritten.REFUSED
    )


@attrs.frozen
class Member:
    """One field of a packed group: its first column and its number of columns, as
    source expressions over the constructor's dims (``"1 + topk"``, ``"topk * 4"``)."""

    field: Field
    start: str
    width: str


@attrs.frozen
class PackedGroup:
    """The packable fields of one dtype, in declaration order, and their columns."""

    dtype: torch.dtype
    members: tuple[Member, ...]

    @property
    def columns(self) -> str:
        """The packed buffer's width, as a source expression."""
        return _plus(self.members[-1].start, self.members[-1].width)


def _width(field: Field) -> str:
    """A row's column count: ``"1"`` for a scalar, the product of its dims."""
    fixed = math.prod(d for d in field.shape if isinstance(d, int))
    named = [d for d in field.shape if isinstance(d, str)]
    if not named:
        return str(fixed)
    return " * ".join([*named, *([str(fixed)] if fixed != 1 else [])])


def _plus(start: str, width: str) -> str:
    if start == "0":
        return width
    if start.isdigit() and width.isdigit():
        return str(int(start) + int(width))
    return f"{start} + {width}"


def packed_groups(schema: Schema) -> tuple[PackedGroup, ...]:
    """The shared buffers of ``schema`` (none unless its layout is ``Layout.PACKED``), in
    the order of each group's first field."""
    if schema.layout is not Layout.PACKED:
        return ()
    by_dtype: dict[torch.dtype, list[Field]] = {}
    for field in schema.fields:
        if isinstance(field, Field) and packable(field):
            assert isinstance(field.dtype, torch.dtype)
            by_dtype.setdefault(field.dtype, []).append(field)
    groups = []
    for dtype, fields in by_dtype.items():
        if len(fields) < 2:
            continue
        members = []
        start = "0"
        for field in fields:
            width = _width(field)
            members.append(Member(field, start, width))
            start = _plus(start, width)
        groups.append(PackedGroup(dtype, tuple(members)))
    return tuple(groups)
