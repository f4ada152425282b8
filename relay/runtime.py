"""What generated maps call: the map's state, and every path that is not the common case.

A generated method is one body: cheap pre-tests, then its torch calls, one line per
field (Note [One body] below). Everything else, refusals with relay's messages, casts,
lazy allocation, debug mode, is here, generic, driven by the map's ``Table``: the
schema's own ``Field`` declarations, which the generated module writes out once
(Note [One model of a field]). What the runtime reads and writes on a map is its
``MapState``, a typed object the map holds; nothing here reads or sets an attribute
of a map by name. Generated modules import this module as ``_rt`` and nothing else
from relay, so its names are the contract between the generator and the runtime.
"""

from __future__ import annotations

import bisect
import functools
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, cast

import numpy as np
import torch

from relay.cpu_stream import host_order_place
from relay.debug import DebugChecks, poison
from relay.debug.messages import request_at, text
from relay.debug.owners import MemberRows, MemberTail, Owners
from relay.device import CpuFence, Fence, HostMirror, new_fence
from relay.errors import RelayError, SlotError
from relay.schema import (
    FROM_PAYLOAD,
    Alloc,
    BatchRows,
    Carried,
    Field,
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
    Staged,
    Switch,
    Tails,
    TailsKv,
    TargetShape,
    Unwritten,
    resolve_method,
)

__all__ = [
    "FROM_PAYLOAD",
    "SLOT_DTYPES",
    "Alloc",
    "BatchRows",
    "Carried",
    "CpuFence",
    "DebugChecks",
    "Fence",
    "Field",
    "Guard",
    "HostCopy",
    "HostMirror",
    "IfNone",
    "Lane",
    "Layout",
    "MapState",
    "MemberRows",
    "MemberTail",
    "Members",
    "Owners",
    "Resolve",
    "Scatter",
    "ScheduleSlots",
    "Schema",
    "Seed",
    "Span",
    "Staged",
    "Switch",
    "Table",
    "Tails",
    "TailsKv",
    "TargetShape",
    "Unwritten",
    "adopted",
    "apply_seeds",
    "bind_tail_list",
    "bind_tails",
    "buffer",
    "check_cast",
    "check_dim",
    "check_rows",
    "graph_wrote",
    "guard_finite",
    "guard_non_negative",
    "guard_positive",
    "host_sum",
    "int_sum",
    "lazy_buffer",
    "never_stashed",
    "parent_is_none",
    "publish",
    "read_back",
    "read_slots",
    "read_tails",
    "scatter_at",
    "scatter_kept",
    "scatter_span",
    "scattered",
    "seed",
    "span_at",
    "stash",
    "stash_partial",
    "switch",
    "tail_locations",
    "write_kept",
    "write_optional",
    "write_rows",
    "write_slots",
]

#: A guard: checks a value about to be written, in debug mode (``guard_*`` below).
GuardFn = Callable[[torch.Tensor, str], None]


# Note [One body]
# A generated write tests, inline, that the call is the common case: debug off, slots
# the map may index with as they are (``write_rows``), and every value a tensor of the
# declared dtype and row shape, on the map's device, not requiring grad. Then each
# field's write is one ``index_copy_`` that cannot fail, so a call is all or nothing.
# The tests decide; no exception does: nothing is caught and passed over. Anything
# else goes to ``stash`` or ``publish`` here, which check, refuse, cast, allocate and
# run debug mode's bookkeeping, field by field from the table, and write only once
# every check passed. The resolves have no second path: they read the same rows
# either way, and in debug mode they also report what they read (``read_back``).

# Note [One model of a field]
# A generated module writes its schema out as the schema's own declarations (``Field``
# and ``Schema`` of relay/schema.py, keyword arguments, docs left out), and ``Table``
# reads those: there is no second spelling of an option. A new field option is its
# attribute on ``Field`` (or on a grouped declaration), its rule in
# relay/codegen/validate.py (groups.py for a group's), and the code that acts on it:
# here for the generic paths, or relay/codegen/methods.py for the bodies.


def _reader(f: Field) -> str:
    """The resolve that reads ``f``: ``resolve_future``, or its schedule-side resolve."""
    return "resolve_future" if f.lane is Lane.FORWARD else resolve_method(f)


def _guard(f: Field) -> GuardFn | None:
    """The runtime check of ``f``'s guard kind (Note [Guards in debug mode])."""
    return _GUARDS[f.guard]


class Table:
    """A map's schema as the generic paths read it: its fields by position, per lane."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.owner = schema.name
        self.fields = schema.fields
        #: Positions of the forward fields (``stash``, ``seed``), in declaration order.
        self.forward = tuple(
            i for i, f in enumerate(self.fields) if f.lane is Lane.FORWARD
        )
        #: Positions of the schedule fields, in declaration order: ``publish`` hands
        #: its values over in this order.
        self.schedule = tuple(
            i for i, f in enumerate(self.fields) if f.lane is Lane.SCHEDULE
        )
        self.readers = tuple(_reader(f) for f in self.fields)
        #: Each scatter field's declared target dtype (Note [Casting scatters]).
        self.casts = tuple(f.scatter.cast if f.scatter else None for f in self.fields)

    def what(self, i: int) -> str:
        """How messages name field ``i``: ``Map.field``."""
        return f"{self.owner}.{self.fields[i].name}"

    def declared_row(self, i: int) -> tuple[int | None, ...]:
        """Field ``i``'s row dims, symbolic ones as ``None`` (any size until allocated)."""
        return tuple(d if isinstance(d, int) else None for d in self.fields[i].shape)

    def dtype(self, i: int) -> torch.dtype | None:
        """Field ``i``'s dtype; ``None`` where it comes from the first payload."""
        dtype = self.fields[i].dtype
        return dtype if isinstance(dtype, torch.dtype) else None


#: What ``seed`` took: its place in host order, the slots, the values, the owners and
#: debug mode's per-row counts, for ``apply_seeds`` (Note [Seeds]).
Seed = tuple[
    int,
    torch.Tensor,
    list[torch.Tensor | None],
    "Owners | None",
    dict[int, torch.Tensor],
]
#: Queueing a seed and taking the due ones are each one step, whichever threads call.
_seeds_lock = threading.Lock()


class MapState:
    """What the runtime reads and writes on a map, typed: the map holds one
    (``self._state``) and hands it to every runtime call."""

    __slots__ = (
        "buffers",
        "carried",
        "columns",
        "cpu",
        "debug",
        "device",
        "dtypes",
        "fence",
        "flat",
        "floating",
        "host_check",
        "on",
        "pool_size",
        "produced",
        "rows",
        "seeds",
        "shapes",
        "slots",
        "spans",
        "table",
        "unread",
    )

    def __init__(
        self, table: Table, device: torch.device, pool_size: int, debug: bool
    ) -> None:
        self.table = table
        #: With its index (``cuda:0`` for ``cuda``), as tensors made there report it.
        self.device = torch.empty(0, device=device).device
        #: Whether the map lives on the CPU (the common case's gate reads it).
        self.cpu = self.device.type == "cpu"
        #: Debug off on the CPU: the common case checks a write's slots on the host
        #: (Note [Slots on the host]); one test of the gate's.
        self.host_check = self.cpu and not debug
        self.pool_size = pool_size
        #: The pool's slots, for the host check of a write's slots on the CPU.
        self.slots = slot_set(pool_size)
        #: Each field's buffer by position; ``None`` until a lazy one is allocated.
        self.buffers: list[torch.Tensor | None] = [None] * len(table.fields)
        #: Each buffer's dtype and row shape, for the gate (``None`` and ``()`` before
        #: a lazy one is allocated: no value fits then).
        self.dtypes: list[torch.dtype | None] = [None] * len(table.fields)
        self.rows: list[tuple[int, ...]] = [()] * len(table.fields)
        #: Each buffer's value shape by a write's slots' shape (Note [Value shapes]).
        self.shapes: list[ValueShapes] = [ValueShapes(()) for _ in table.fields]
        #: Each buffer: whether its dtype is one a tensor may require grad in (a value of
        #: an integer one never does: the gate reads no ``requires_grad`` then).
        self.floating: list[bool] = [False] * len(table.fields)
        #: Each buffer whose rows hold one element, as one dimension (a flat target's
        #: gather reads it: Note [One-element rows]); ``None`` for the others.
        self.flat: list[torch.Tensor | None] = [None] * len(table.fields)
        #: Each optional field: whether the latest write carried it.
        self.carried: list[bool] = [False] * len(table.fields)
        #: Each field: whether this map relays it (``False`` for a field whose
        #: ``Switch`` keyword the constructor was given false: ``switch``).
        self.on: list[bool] = [True] * len(table.fields)
        #: A scattered field's row positions after its start (``arange(width)``).
        self.columns: dict[int, torch.Tensor] = {}
        #: Each counted scatter's plan of what its fields fix (``SpanPlan``), by its
        #: fields; remade when a buffer is adopted (a row's width may change).
        self.spans: dict[tuple[int, ...], SpanPlan] = {}
        #: Debug mode's checker; ``None`` with debug off.
        self.debug: DebugChecks | None = (
            _debug_checks(table, device, pool_size) if debug else None
        )
        #: Rows ``seed`` took, for the next ``resolve_future`` to write first.
        self.seeds: list[Seed] = []
        #: The fence ``publish`` records and the schedule-side resolves wait on.
        self.fence: Fence | CpuFence = new_fence(device, debug)
        #: Debug mode: each counted scatter field's count its latest write stashed per
        #: slot (Note [Counted scatters]).
        self.produced: dict[int, torch.Tensor] = {}
        #: Debug mode, from a resolve's scatter to its read check: per counted or
        #: ``when`` field, the requests it laid nothing for (their rows are not read).
        self.unread: dict[int, torch.Tensor] = {}

    def buffer(
        self, i: int, shape: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        """Field ``i``'s eager buffer: zeros, or debug mode's poison where the field
        does not declare that unwritten rows read as zeros."""
        zeros = self.table.fields[i].unwritten is Unwritten.ZEROS
        return self.adopt(
            i, buffer(shape, dtype, self.device, self.debug is not None, zeros)
        )

    def adopt(self, i: int, buf: torch.Tensor) -> torch.Tensor:
        """Field ``i``'s buffer ``buf`` (a packed group's view the map made, or one the
        runtime allocated), with its dtype and row shape for the gate."""
        self.buffers[i] = buf
        self.dtypes[i] = buf.dtype
        self.rows[i] = tuple(buf.shape[1:])
        self.shapes[i] = ValueShapes(self.rows[i])
        self.floating[i] = buf.dtype.is_floating_point or buf.dtype.is_complex
        one = buf.dim() > 1 and math.prod(self.rows[i]) == 1
        self.flat[i] = buf.view(-1) if one else None
        self.columns.pop(i, None)  # its row's width may have changed: made again
        self.spans.clear()
        return buf


class ValueShapes(dict[torch.Size, torch.Size]):
    """A buffer's value shape by a write's slots' shape (Note [Value shapes])."""

    __slots__ = ("rows",)

    def __init__(self, rows: tuple[int, ...]) -> None:
        super().__init__()
        self.rows = rows

    def __missing__(self, index_shape: torch.Size) -> torch.Size:
        shape = self[index_shape] = torch.Size((*index_shape, *self.rows))
        return shape


# Note [Value shapes]
# A write's value for a field with rows has the shape ``(n, *rows)`` for ``n`` slots.
# Concatenating ``torch.Size``s costs about four times a dict read (145 ns against 35
# on the CPU), so the gate reads that shape from a dict keyed by the slots' shape, made
# the first time a count is written (an entry per count written, so at most the largest
# batch's). ``adopt`` makes it anew: an adopted buffer's rows may differ.


# Note [One-element rows]
# A flat target takes a field's rows flattened. Where a row holds one element (one
# draft per request), those are the buffer's own elements at the slots: one gather
# from the buffer's one-dimensional view hands them, where a gather of rows and a
# ``flatten`` view cost about three times as much on the CPU. The view is made when the
# buffer is (``MapState.adopt``), so an adopted buffer gets its own.


def check_dim(table: Table, name: str, value: int) -> int:
    """A dim given to a constructor must be a positive int; 0 too where only counted
    scatter fields use it (vLLM's draft width without speculation: every count is 0)."""
    counted = [
        f.scatter is not None and f.scatter.lengths is not None
        for f in table.fields
        if name in f.shape
    ]
    low = 0 if counted and all(counted) else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a non-negative" if low == 0 else "a positive"
        raise ValueError(
            f"{table.owner}: dim {name!r} must be {kind} int (got {value!r} that is "
            f"a {type(value).__name__})"
        )
    return value


def switch(s: MapState, keyword: str, value: bool) -> bool:
    """A ``Switch`` keyword's value given to the constructor: a bool, which turns the
    fields gated on it on or off for this map's life."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{s.table.owner}: {keyword} must be a bool saying whether this map relays "
            f"the fields switched by it (got {value!r} of type "
            f"{type(value).__name__}); pass {keyword}=True or {keyword}=False"
        )
    for i, f in enumerate(s.table.fields):
        if isinstance(f.gate, Switch) and f.gate.keyword == keyword:
            s.on[i] = value
    return value


def buffer(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    debug: bool,
    zeros: bool = False,
) -> torch.Tensor:
    """A relay buffer: zeros, or poison in debug mode so an unwritten row is visible
    (zeros there too where the field declares that unwritten rows read as zeros)."""
    if debug and not zeros:
        return torch.full(shape, poison(dtype), dtype=dtype, device=device)
    return torch.zeros(shape, dtype=dtype, device=device)


def _debug_checks(table: Table, device: torch.device, pool_size: int) -> DebugChecks:
    """Debug mode's checker for a map of ``table``."""
    fields = table.fields
    schedule = [fields[i] for i in table.schedule]
    return DebugChecks(
        device,
        pool_size,
        table.owner,
        forward=tuple(fields[i].name for i in table.forward),
        schedule=tuple(f.name for f in schedule),
        consumers=tuple(dict.fromkeys(_reader(f) for f in schedule)),
        initial_zeros=tuple(f.name for f in fields if f.unwritten is Unwritten.ZEROS),
        seeds=tuple(fields[i].name for i in table.forward)
        if table.schema.seeded
        else (),
        graph_written=tuple(f.name for f in fields if f.graph_written),
    )


# --- the common case's gate --------------------------------------------------------------

_INT64 = torch.int64  # module constants: reading torch.int64 costs an attribute lookup
_INT32 = torch.int32
_TENSOR = torch.Tensor
_AMINMAX = torch.aminmax
#: A 0-dim integer tensor's value: ``tolist`` reads it without an op (typed once here
#: rather than cast per call).
_INT = cast(Callable[[torch.Tensor], int], torch.Tensor.tolist)


# Note [Slots on the host]
# On the CPU an indexed write checks each index as it goes, so a slot outside the pool
# would leave some rows written: the slots are checked first, every time. Up to
# ``HOST_SLOTS_IN_PYTHON_MAX`` of them are read as a list (``Tensor.numpy`` would
# dispatch a view op) and tested against the pool's slots in one call
# (``slot_set``: a set's membership test costs less than ``min`` and ``max``); more
# with one ``aminmax``. Nothing is taken on trust: slots an engine edited in place
# after a resolve (through ``.data`` or a numpy alias, which no version counter sees)
# are checked like any others. On CUDA a bad slot is a device-side assert whatever
# relay does, and a host check would be a sync: there only debug mode checks slots.


def write_rows(s: MapState, indices: torch.Tensor) -> torch.Size | None:
    """``(n,)`` (their shape) when a write may index with ``indices`` as they are: debug
    off, a 1-D int64 tensor of at least one slot, in the pool (Note [Slots on the
    host]). Else ``None``, and the write takes the checked path. The tests are ordered
    so the CPU's common case reads each property once; what failed is the checked
    path's to say."""
    if type(indices) is not _TENSOR or indices.dtype is not _INT64:
        return None
    shape = indices.shape  # one read for the rank and the count
    if s.host_check:
        if shape in _LISTED:  # 1-D, 1 to HOST_SLOTS_IN_PYTHON_MAX slots: one lookup
            # tolist: no op dispatched; a bad slot is the checked path's to name
            if indices.is_cpu and s.slots.issuperset(indices.tolist()):
                return shape
            return None
        if len(shape) != 1 or not shape[0] or not indices.is_cpu:
            return None  # the checked path refuses slots on another device, or none
        low, high = _AMINMAX(indices)  # host_slots_ok's aminmax, inlined
        if _INT(low) < 0 or _INT(high) >= s.pool_size:
            return None
        return shape
    if s.debug is not None or len(shape) != 1 or not shape[0]:
        return None
    if indices.device != s.device:
        return None
    return shape


#: Up to this many slots, the host check reads them as a list; above, one ``aminmax``.
HOST_SLOTS_IN_PYTHON_MAX = 32
#: The slots' shapes the host check reads as a list: 1-D, 1 to the most above.
_LISTED = frozenset(torch.Size((n,)) for n in range(1, HOST_SLOTS_IN_PYTHON_MAX + 1))
#: Pools up to this many slots are tested against a set of them (4 MiB at most, one
#: per pool size); larger ones by ``min`` and ``max``.
SLOT_SET_MAX = 1 << 16


class Slots(Protocol):
    """A pool's slots as the host check tests them."""

    def issuperset(self, values: Iterable[int], /) -> bool: ...


class _SlotRange:
    """The slots of a pool too large for a set: ``issuperset`` by ``min`` and ``max``."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def issuperset(self, values: Iterable[int], /) -> bool:
        listed = list(values)
        return not listed or (min(listed) >= 0 and max(listed) < self.size)


@functools.lru_cache(maxsize=16)
def slot_set(pool_size: int) -> Slots:
    """The slots ``0 .. pool_size - 1``, made once per pool size and shared."""
    if pool_size <= SLOT_SET_MAX:
        return frozenset(range(pool_size))
    return _SlotRange(pool_size)


def host_slots_ok(slots: torch.Tensor, pool_size: int) -> bool:
    """Whether every slot of host ``slots`` is in the pool (Note [Slots on the host])."""
    if slots.numel() <= HOST_SLOTS_IN_PYTHON_MAX:
        return slot_set(pool_size).issuperset(_host_values(slots))
    low, high = torch.aminmax(slots)  # one op; tolist() reads them without another
    return cast(int, low.tolist()) >= 0 and cast(int, high.tolist()) < pool_size


def _host_values(slots: torch.Tensor) -> list[int]:
    values = slots.tolist()  # no op dispatched; an int for a 0-dim slot
    return values if isinstance(values, list) else [values]


def read_slots(s: MapState, op: str, indices: torch.Tensor) -> torch.Tensor:
    """The slots resolve ``op`` gathers with: in debug mode checked first (in the pool,
    none twice); int64 and int32 ones as they are, narrower integer ones widened
    (``index_select`` takes no other)."""
    if not isinstance(indices, torch.Tensor) or indices.device != s.device:
        _refuse_indices(f"{s.table.owner}.{op}", indices, s.device)
    if s.debug is not None:
        s.debug.check_slots(op, indices)
    if indices.dtype is torch.int64 or indices.dtype is torch.int32:
        return indices
    return _refuse_indices(f"{s.table.owner}.{op}", indices).long()


# Note [Scatter destinations]
# A scatter writes each request's row at its start offset in a flat target, and
# index_copy_ checks positions one by one as it goes: a bad offset would leave the
# target partly written, and a torch error would name no map, field or request. So
# the target and the positions are checked before the scatter, with debug on and off
# alike: always what costs no device read (a flat target of the field's dtype on the
# map's device; integer offsets, int32 taken, one per request); on the CPU, where
# offsets and counts are read on the host anyway, each count in its row's width and
# each request's span inside the target and apart from every other request's
# (``_spans_ok``, no op up to ``HOST_POSITIONS_IN_PYTHON_MAX`` requests). Off the CPU
# a count outside its row is a device-side assert (``assert_counts``: no sync), and a
# position outside the target the index op's own; overlapping spans are debug mode's
# there. Debug mode checks ranges and overlaps on every device
# (``DebugChecks.check_scatter``) and, in a target one of whose fields is guarded
# non-negative, that every position a span writes holds a negative placeholder before
# the scatter (``DebugChecks.check_claimed``: a span running into a request the
# scatter does not write, such as the next prefill row) and that none is left after
# it (vLLM's -1: a position no request's row covered). A scatter that declares its
# batch rows has each span checked inside its own row in both modes (Note
# [Row-bounded scatters]). A resolve of several scatter targets plans every one
# (``scatter_at``, ``span_at``) before it writes the first.


def _laid(s: MapState, i: int) -> torch.dtype | None:
    """The dtype field ``i``'s scatter lays into its target (Note [Casting scatters])."""
    cast = s.table.casts[i]
    return cast if cast is not None else s.dtypes[i]


def _target(s: MapState, i: int, target: object) -> int:
    """The size of ``target``, field ``i``'s scatter target, if a scatter may write it:
    a flat tensor of the dtype the field lays in (its buffer's, or its ``cast``) on the
    map's device; refused if not."""
    dtype = _laid(s, i)
    if (
        type(target) is torch.Tensor
        and target.dtype is dtype
        and target.ndim == 1
        and (target.is_cpu if s.cpu else target.device == s.device)
    ):
        return target.numel()
    f = s.table.fields[i]
    got = (
        f"a {target.dtype} tensor of shape {tuple(target.shape)} on {target.device}"
        if isinstance(target, torch.Tensor)
        else f"a {type(target).__name__}"
    )
    scatter = f.scatter
    if scatter is not None and scatter.cast is not None:
        fix = f"Hand a {dtype} target, or declare Scatter(cast=...) as its dtype"
    else:
        fix = (
            f"Hand a {dtype} target, or declare the field with the target's dtype "
            "(Scatter(cast=<the target's dtype>) lays an integer field into another "
            "integer dtype)"
        )
    raise RelayError(
        f"{s.table.what(i)}: batch.{f.target} must be a flat {dtype} tensor on "
        f"{s.device} to scatter the field into, got {got}. {fix}. Nothing was written"
    )


# Note [Casting scatters]
# An engine's values and its target may differ in dtype on purpose: vLLM samples
# int64 tokens and its input_ids are int32. ``Scatter(cast=...)`` declares the target's
# dtype: the buffer keeps the field's own, and a resolve casts each gathered row as
# it is laid in (``.int()`` in the generated body, or ``.to(...)``), as vLLM casts its
# drafts before its own scatter. Validation takes only casts that keep every value's
# kind: an integer field into an integer target, a floating one into a wider floating
# one. An integer target narrower than the field cannot hold every value, so debug
# mode checks each stashed value that a resolve may lay in (a counted row's real ones)
# on the device, with no host sync (``check_cast``); with debug off a value out of
# range wraps, as torch's cast does.


def _narrowed(f: Field) -> torch.dtype | None:
    """The integer dtype ``f``'s scatter casts to where it cannot hold every value of
    the field's dtype (debug mode checks the values: Note [Casting scatters])."""
    scatter = f.scatter
    cast = scatter.cast if scatter is not None else None
    dtype = f.dtype
    if cast is None or not isinstance(dtype, torch.dtype) or dtype == torch.bool:
        return None
    if dtype.is_floating_point or cast.is_floating_point:
        return None  # a wider floating dtype holds every value
    wide, narrow = torch.iinfo(dtype), torch.iinfo(cast)
    return cast if narrow.min > wide.min or narrow.max < wide.max else None


def check_cast(value: torch.Tensor, cast: torch.dtype, what: str, target: str) -> None:
    """Assert, on the device, that every value survives the cast to ``cast``."""
    same = value.to(cast).to(value.dtype) == value
    torch._assert_async(
        same.all(), text("cast_summary", what=what, cast=cast, target=target)
    )


def scatter_at(
    s: MapState,
    i: int,
    offsets: object,
    indices: torch.Tensor,
    target: torch.Tensor,
    owners: Owners | None = None,
    rows: Bounds | None = None,
) -> torch.Tensor:
    """Where field ``i``'s gathered rows go in flat ``target``: each request's start
    offset, then its row's columns (Note [Scatter destinations]), inside its batch row
    where ``rows`` bounds them (Note [Row-bounded scatters]); refused, naming the
    request (by its id where ``owners`` names them), before anything is written."""
    f = s.table.fields[i]
    offsets_path = f.scatter.offsets if f.scatter is not None else None
    what = f"{s.table.what(i)}: batch.{offsets_path}"
    n = indices.numel()
    if (
        not isinstance(offsets, torch.Tensor)
        or offsets.dtype not in (torch.int64, torch.int32)
        or offsets.ndim != 1
        or offsets.numel() != n
    ):
        got = (
            f"a {offsets.dtype} tensor of shape {tuple(offsets.shape)}"
            if isinstance(offsets, torch.Tensor)
            else f"a {type(offsets).__name__}"
        )
        raise RelayError(
            f"{what} must hold one integer start offset per request ({n}, an int64 "
            f"or int32 vector), got {got}. Nothing was written"
        )
    size = _target(s, i, target)
    starts = offsets if offsets.dtype is torch.int64 else offsets.long()
    width = math.prod(s.rows[i])
    debug = s.debug
    if debug is not None:
        debug.check_scatter(f.name, indices, starts, width, size, owners)
        if _claimed(s, i):
            none: list[torch.Tensor | None] = [None]
            places = (starts, [width], none, [False])
            _debug_claims(s, debug, (i,), indices, places, target, owners)
    elif starts.is_cpu and not _spans_ok(starts, [], [], width, size):
        _name_span(s, (i,), indices, starts, [width], [None], size, owners)
    if rows is not None:
        bounds = _bounds(s, i, rows, n, s.device)
        if debug is not None or starts.is_cpu:
            _rows_fit(s, (i,), indices, starts, [width], [None], bounds, owners)
        else:
            assert_rows(starts, width, bounds, s.table.what(i))
    if not s.rows[i]:
        return starts
    columns = s.columns.get(i)
    if columns is None:
        columns = s.columns[i] = torch.arange(width, device=starts.device)
    return (starts.unsqueeze(1) + columns).flatten()


def _claimed(s: MapState, i: int) -> bool:
    """Whether debug mode checks the positions of field ``i``'s target around its
    spans: a guarded target whose scatters say the rest is theirs to check (a
    ``Scatter(rest_checked=False)`` target's other positions are the engine's)."""
    target = s.table.fields[i].target
    return _guarded(s, i) and all(
        g.scatter.rest_checked
        for g in s.table.fields
        if g.scatter is not None and g.target == target
    )


def _guarded(s: MapState, i: int) -> bool:
    """Whether a scatter field into field ``i``'s target is guarded non-negative."""
    target = s.table.fields[i].target
    return any(
        g.guard in (Guard.NON_NEGATIVE, Guard.POSITIVE)
        for g in s.table.fields
        if g.scatter is not None and g.target == target
    )


def scattered(s: MapState, i: int, target: torch.Tensor) -> None:
    """Debug mode, after field ``i``'s scatter (the last of those into its target): a
    target one of whose fields is guarded non-negative holds no negative placeholder
    (Note [Scatter destinations])."""
    if s.debug is not None and _guarded(s, i):
        s.debug.check_scattered(s.table.fields[i].name, target)


# Note [Counted scatters]
# A scatter field that declares ``lengths`` lays only each request's first
# ``lengths[i]`` values of its row into the target, and one that declares ``after``
# starts where another scatter field into the same target ends in each request's span
# (the sampled token, then 0 to K drafts). Such a target's fields are planned by one
# call, ``span_at``: every field's counts and every request's span checked (Note
# [Scatter destinations]), each field's positions and values built; ``scatter_span``
# then writes them, so a refused resolve writes none of them. A count is 0 to its
# row's width in both modes: one outside is refused, never clamped (a count above the
# width would leave a gap before the next field, a negative one lay it over the field
# before). Rows keep their full width in the buffer: what varies is how many of a
# row's values a resolve lays in, so a producer and a consumer cannot disagree on
# where a row's values are, only on how many there are. Debug mode keeps the count
# each stash carried per slot and reports a resolve that reads more (reading fewer is
# a trim, the scheduler's right); a row of which a resolve lays nothing is not read
# (not checked, not consumed), and a stash's guard checks only each row's counted
# values. A field with ``when`` lays a request's whole row or none of it, and takes
# its row's width of the span either way. On the CPU the values are picked with a mask;
# elsewhere a mask would read the counts back to the host, a sync that stalls the
# overlap, so each covered position takes the value of the one entry that covers it
# (``scatter_kept``), with no host read. Debug off on the CPU, a lean plan (one counted
# field, alone or after one value per request: ``SpanPlan.lean``) reads each tensor
# once and all its counts and spans in one ``_spans_ok``; anything it does not take
# goes the general way, which refuses it, naming it.

#: What ``span_at`` hands ``scatter_span``: each field's positions, values, and the
#: mask of the entries it keeps (``None``: all, already picked on the host).
Span = tuple[list[torch.Tensor], list[torch.Tensor], list["torch.Tensor | None"]]


def _per_request(
    s: MapState, i: int, path: object, value: object, n: int, device: torch.device
) -> torch.Tensor:
    """``value`` (``batch.<path>`` of field ``i``) as int64 if it holds one integer per
    request, on the target's device; refused before anything is written otherwise."""
    if (
        type(value) is torch.Tensor
        and value.shape == (n,)
        and (value.is_cpu if s.cpu else value.device == device)
    ):
        dtype = value.dtype
        if dtype is _INT64:
            return value
        if dtype is torch.int32:
            return value.long()
    got = (
        f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
        if isinstance(value, torch.Tensor)
        else f"a {type(value).__name__}"
    )
    raise RelayError(
        f"{s.table.what(i)}: batch.{path} must hold one integer per request ({n}, an "
        f"int64 or int32 vector on {device}, the target's device), got {got}. Nothing "
        "was written"
    )


#: Up to this many requests, a scatter's host check reads offsets and counts as lists
#: (no op); above, a few ops on the CPU cost less than reading them.
HOST_POSITIONS_IN_PYTHON_MAX = 48


class SpanPlan:
    """What a counted scatter's fields fix, made once per map (``MapState.spans``): per
    field its ``Scatter``, row width, whether it takes its width whatever it lays
    (``when``), the dtype it lays in, and its row's columns (``arange(width)``)."""

    __slots__ = (
        "columns", "fixed", "head", "laid", "lean", "mixed", "offsets", "scatters",
        "tail", "tail_columns", "unmasked", "widths",
    )  # fmt: skip

    def __init__(self, s: MapState, fields: tuple[int, ...]) -> None:
        self.scatters = [s.table.fields[i].scatter for i in fields]
        self.widths = [math.prod(s.rows[i]) for i in fields]
        self.fixed = [sc is not None and sc.when is not None for sc in self.scatters]
        self.laid = [_laid(s, i) for i in fields]
        #: Whether the fields lay different dtypes (no target takes them all).
        self.mixed = any(laid is not self.laid[0] for laid in self.laid)
        first = self.scatters[0]
        self.offsets = first.offsets if first is not None else None
        self.columns = [_columns(s, i, w) for i, w in zip(fields, self.widths)]
        #: Whether ``span_at`` takes its lean path: debug off on the CPU, one counted
        #: field of one dtype and flat rows, alone or after one value per request
        #: (vLLM's sampled token, then its drafts), every buffer made.
        last = self.scatters[-1]
        self.lean = (
            s.host_check
            and not self.mixed
            and len(fields) <= 2
            and last is not None
            and last.lengths is not None
            and last.when is None
            and all(s.buffers[i] is not None for i in fields)
            and len(s.rows[fields[-1]]) == 1
            and all(s.rows[i] == () for i in fields[:-1])
            and all(
                sc is None or (sc.lengths is None and sc.when is None)
                for sc in self.scatters[:-1]
            )
        )
        #: The lean path's: the values before the counted ones (0 or 1), the counted
        #: field's width (as ``_spans_ok`` takes it) and columns, and no masks (the
        #: kept values are picked on the host).
        self.head = len(fields) - 1
        self.tail = self.widths[-1:]
        self.tail_columns = self.columns[-1]
        self.unmasked: list[torch.Tensor | None] = [None] * len(fields)


def _columns(s: MapState, i: int, width: int) -> torch.Tensor:
    """Field ``i``'s row positions after its start, made once."""
    columns = s.columns.get(i)
    if columns is None:
        columns = s.columns[i] = torch.arange(width, device=s.device)
    return columns


def span_at(
    s: MapState,
    fields: tuple[int, ...],
    blocks: tuple[torch.Tensor, ...],
    offsets: object,
    indices: torch.Tensor,
    target: torch.Tensor,
    lengths: tuple[object, ...],
    owners: Owners | None = None,
    rows: Bounds | None = None,
) -> Span:
    """Where the gathered ``blocks`` of scatter ``fields`` (in their order in a request's
    span) go in flat ``target``, for ``scatter_span``: each request's span from its
    start offset, each field's first ``lengths`` values of its row (all of them where
    ``None``) after the fields before it (Note [Counted scatters]), inside its batch
    row where ``rows`` bounds them (Note [Row-bounded scatters]). Every count and span
    is checked here, naming the request: a refused call writes nothing."""
    plan = s.spans.get(fields)
    if plan is None:
        plan = s.spans[fields] = SpanPlan(s, fields)
    n = indices.numel()
    last = lengths[-1]  # the counted field's counts
    if (  # the common case of a lean plan (``SpanPlan.lean``): each tensor read once
        plan.lean
        and type(target) is _TENSOR
        and type(offsets) is _TENSOR
        and type(last) is _TENSOR
        and target.is_cpu
        and offsets.is_cpu
        and last.is_cpu
        and target.dtype is plan.laid[0]
        and len(flat := target.shape) == 1
        and offsets.shape == last.shape == (n,)
    ):
        at_dtype, count_dtype = offsets.dtype, last.dtype
        if (at_dtype is _INT64 or at_dtype is _INT32) and (
            count_dtype is _INT64 or count_dtype is _INT32
        ):
            starts = offsets if at_dtype is _INT64 else offsets.long()
            kept = last if count_dtype is _INT64 else last.long()
            head = plan.head  # the value before the counted ones, if any
            bounds = None if rows is None else _bounds(s, fields[0], rows, n, s.device)
            if _spans_ok(starts, [kept], plan.tail, head, flat[0], bounds):
                columns = plan.tail_columns  # the same ops as _span_places
                at = (starts + 1 if head else starts).unsqueeze(1) + columns
                keep = columns < kept.unsqueeze(1)
                if head:
                    return (
                        [starts, at[keep]],
                        [blocks[0], blocks[1][keep]],
                        plan.unmasked,
                    )
                return [at[keep]], [blocks[0][keep]], plan.unmasked
            # A count or span found wrong: refused by the general plan, naming it (or
            # requests out of start order, planned there).
    return _span_plan(
        s, plan, fields, blocks, offsets, indices, target, lengths, n, owners, rows
    )


def _span_plan(
    s: MapState,
    plan: SpanPlan,
    fields: tuple[int, ...],
    blocks: tuple[torch.Tensor, ...],
    offsets: object,
    indices: torch.Tensor,
    target: torch.Tensor,
    lengths: tuple[object, ...],
    n: int,
    owners: Owners | None,
    rows: Bounds | None,
) -> Span:
    """``span_at`` of any plan, in either mode, on any device: each count read per
    field, then checked as the mode and device say (Note [Scatter destinations])."""
    size = _target(s, fields[0], target)
    if plan.mixed:
        for i in fields[1:]:
            if _laid(s, i) is not target.dtype:
                _target(s, i, target)  # refused, naming the field
    home = s.device
    starts = _per_request(s, fields[0], plan.offsets, offsets, n, home)
    widths, fixed = plan.widths, plan.fixed
    counts: list[torch.Tensor | None] = []
    # Each field's room in the span: its count, or ``None``, its width (a ``when``
    # field takes its width whatever it lays); the counted ones, and the rest's sum.
    room: list[torch.Tensor | None] = []
    counted: list[torch.Tensor] = []
    counted_widths: list[int] = []
    taken = 0
    for i, scatter, width, whole, value in zip(
        fields, plan.scatters, widths, fixed, lengths
    ):
        count: torch.Tensor | None = None
        if value is not None and scatter is not None and scatter.when is not None:
            if isinstance(value, torch.Tensor) and value.dtype is torch.bool:
                value = value.long()  # 0 or the whole row
            flag = _per_request(s, i, scatter.when, value, n, home)
            count = (flag != 0).long() * width
        elif value is not None:
            path = scatter.lengths if scatter else None
            count = _per_request(s, i, path, value, n, home)
        counts.append(count)
        if whole or count is None:
            room.append(None)
            taken += width
        else:
            room.append(count)
            counted.append(count)
            counted_widths.append(width)
    debug = s.debug
    host = target.is_cpu
    bounds = None if rows is None else _bounds(s, fields[0], rows, n, home)
    if debug is not None:
        _debug_span(s, debug, fields, indices, starts, widths, room, size, owners)
        if bounds is not None:
            _rows_fit(s, fields, indices, starts, widths, room, bounds, owners)
        if _claimed(s, fields[0]):
            places = (starts, widths, counts, fixed)
            _debug_claims(s, debug, fields, indices, places, target, owners)
        for i, count in zip(fields, counts):
            if count is not None:  # Note [Counted scatters]: a row laid 0 is unread
                s.unread[i] = count == 0
    elif host:  # every count and span read on the host (Note [Scatter destinations])
        if not _spans_ok(starts, counted, counted_widths, taken, size, bounds):
            _name_span(s, fields, indices, starts, widths, room, size, owners)
            if bounds is not None:
                _rows_fit(s, fields, indices, starts, widths, room, bounds, owners)
    else:
        _assert_span(s, fields, starts, widths, room, bounds)
    return _span_places(plan, blocks, starts, counts, host)


def _assert_span(
    s: MapState,
    fields: tuple[int, ...],
    starts: torch.Tensor,
    widths: list[int],
    room: list[torch.Tensor | None],
    bounds: tuple[torch.Tensor, torch.Tensor | None] | None,
) -> None:
    """Debug off, off the CPU, a span's checks as device-side asserts (Note [Scatter
    destinations]): no host read. ``room``: each field's count, or ``None``: its
    width."""
    span: torch.Tensor | int = 0
    for i, width, count in zip(fields, widths, room):
        if count is not None:
            assert_counts(count, width, s.table.what(i))
        span = span + (width if count is None else count)
    if bounds is not None:
        assert_rows(starts, span, bounds, s.table.what(fields[0]))


def scatter_span(target: torch.Tensor, span: Span) -> None:
    """Write the span ``span_at`` planned and checked into ``target``."""
    positions, values, masks = span
    for at, value, mask in zip(positions, values, masks):
        if mask is None:
            target.index_copy_(0, at, value)
        else:
            scatter_kept(target, at, mask, value)


def assert_counts(count: torch.Tensor, width: int, what: str) -> None:
    """Off the CPU, every count 0 to ``width``, as a device-side assert: no host read
    (Note [Scatter destinations])."""
    torch._assert_async(
        (count.clamp(0, width) == count).all(),
        f"{what}: a count is outside its row's 0 to {width}",
    )


def _spans_ok(
    starts: torch.Tensor,
    counts: list[torch.Tensor],
    widths: list[int],
    fixed: int,
    size: int,
    bounds: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> bool:
    """On the host, whether each of ``counts`` is 0 to its ``widths`` and each request's
    span (``fixed`` plus its counts, from its start) lies inside ``size`` positions,
    ends before the next request's starts, and (``bounds``) lies inside its own batch
    row. Requests out of start order fail here and ``_name_span`` decides (Note
    [Scatter destinations])."""
    n = starts.numel()
    if n <= HOST_POSITIONS_IN_PYTHON_MAX:
        at: list[int] = starts.tolist()  # no op dispatched
        taken: list[list[int]] = [c.tolist() for c in counts]
        for each, width in zip(taken, widths):
            if min(each) < 0 or max(each) > width:
                return False
        end = 0
        if not taken:
            for a in at:
                if a < end:
                    return False
                end = a + fixed
            spans = [fixed] * n
        else:
            laid = taken[0] if len(taken) == 1 else [sum(c) for c in zip(*taken)]
            spans = [fixed + c for c in laid]
            for a, span in zip(at, spans):
                if a < end:
                    return False
                end = a + span
        if end > size:
            return False
        return bounds is None or _rows_ok(at, spans, bounds)
    # Above, numpy reads them in place: one view op per tensor, no data op.
    at_np = starts.numpy()
    ends = at_np
    for count, width in zip(counts, widths):
        made = count.numpy()
        if made.min() < 0 or made.max() > width:
            return False
        ends = ends + made
    if n > 1 and (at_np[1:] - ends[:-1]).min() < fixed:
        return False
    if bounds is not None and not _rows_ok_np(at_np, ends + fixed - at_np, bounds):
        return False
    return bool(at_np[0] >= 0 and ends[-1] + fixed <= size)


def _scatter_path(table: Table, i: int, option: str) -> str | None:
    """Field ``i``'s scatter's ``offsets`` or ``lengths`` path, for a message."""
    scatter = table.fields[i].scatter
    if scatter is None:
        return None
    return scatter.offsets if option == "offsets" else scatter.lengths


def _name_span(
    s: MapState,
    fields: tuple[int, ...],
    indices: torch.Tensor,
    starts: torch.Tensor,
    widths: list[int],
    counts: list[torch.Tensor | None],
    size: int,
    owners: Owners | None = None,
) -> None:
    """Refuse the first count outside its row, then the first value outside the
    target, then the first span inside another's, once ``_spans_ok`` found the spans
    out of order or wrong (debug off, on the host: Note [Scatter destinations]).
    Returns when none is: requests out of start order whose spans lie apart."""
    table = s.table
    n = starts.numel()
    at: list[int] = starts.tolist()
    slots: list[int] = indices.reshape(-1).tolist()
    taken = [
        [w] * n if c is None else cast(list[int], c.tolist())
        for w, c in zip(widths, counts)
    ]
    for i, width, count, each in zip(fields, widths, counts, taken):
        for j, c in enumerate(each):
            if count is not None and not 0 <= c <= width:
                raise RelayError(
                    f"{table.what(i)}: {request_at(j, slots[j], owners)} has a count "
                    f"of {c} value(s), outside [0, {width}]: a row holds {width} "
                    f"(batch.{_scatter_path(table, i, 'lengths')}). Nothing was "
                    "written"
                )
    single = len(fields) == 1
    for j in range(n):
        first = at[j]
        for i, each in zip(fields, taken):
            if each[j] and (first < 0 or first + each[j] > size):
                raise RelayError(
                    f"{table.what(i)}: batch.{_scatter_path(table, i, 'offsets')}: "
                    f"{request_at(j, slots[j], owners)} starts at {first}, so its "
                    f"{each[j]} value(s) would not fit the target's {size} positions. "
                    "Nothing was written"
                    if single
                    else f"{table.what(i)}: {request_at(j, slots[j], owners)} puts its "
                    f"{each[j]} value(s) from {first}, outside the target's {size} "
                    "positions. Nothing was written"
                )
            first += each[j]
    spans = [sum(each[j] for each in taken) for j in range(n)]
    last: int | None = None  # the request whose span ends last so far
    for j in sorted(range(n), key=at.__getitem__):
        if spans[j] == 0:
            continue
        if last is not None and at[j] < at[last] + spans[last]:
            raise RelayError(
                f"{table.what(fields[0])}: {request_at(j, slots[j], owners)} starts "
                f"at {at[j]}, inside the {spans[last]} position(s) of "
                f"{request_at(last, slots[last], owners)} from {at[last]}: one would "
                "overwrite the "
                "other's values (a count larger than the span its batch laid out, or "
                "an offset off). Nothing was written"
            )
        if last is None or at[j] + spans[j] > at[last] + spans[last]:
            last = j


# Note [Row-bounded scatters]
# The checks above keep the handed-over spans apart from each other, but a batch has
# rows the scatter does not write (a prefill row, a request absent from the last
# step): a span one value too long runs onto such a row's first token, and nothing
# above knows where that row starts. ``Scatter(rows=BatchRows(...))`` hands the map
# every row's start (vLLM's ``query_start_loc``) and each request's row, and each
# request's span must lie inside its own row: from its row's start to the next row's
# (a span of no values is not placed). On the CPU, in both modes, and in debug mode
# on every device, the starts are read on the host and the first span outside its row
# is refused, naming the request, the field and the row, as is a row outside the
# batch or shared by two requests; off the CPU with debug off, one device-side assert
# (``assert_rows``: a few ops, no sync) refuses the same, and row starts out of order,
# so the handed-over spans are kept apart there too. Either way before the target
# changes.

#: ``rows=`` of a bounded scatter's plan: ``batch.<starts>`` (every batch row's start,
#: then the last row's end) and ``batch.<index>`` (each request's row; ``None`` where
#: request ``i`` is row ``i``).
Bounds = tuple[object, object]


def _bounds(
    s: MapState, i: int, rows: Bounds, n: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Field ``i``'s scatter's row starts and each request's row (Note [Row-bounded
    scatters]), as the batch holds them (int32 is read as it is: no op); refused,
    before anything is written, unless the starts are one integer vector on
    ``device`` with a start per row and the last row's end, and the rows one integer
    per request (or, without them, a row per request)."""
    scatter = s.table.fields[i].scatter
    assert scatter is not None and scatter.rows is not None
    declared = scatter.rows
    starts, index = rows
    rows_given = index is not None
    if (
        type(starts) is torch.Tensor
        and (starts.dtype is torch.int64 or starts.dtype is torch.int32)
        and starts.ndim == 1
        and starts.device == device
        and (starts.numel() >= 2 if rows_given and n else starts.numel() == n + 1)
    ):
        if index is None:
            return starts, None
        if (
            type(index) is torch.Tensor
            and (index.dtype is torch.int64 or index.dtype is torch.int32)
            and index.shape == (n,)
            and index.device == device
        ):
            return starts, index
        return starts, _per_request(s, i, declared.index, index, n, device)  # refused
    got = (
        f"a {starts.dtype} tensor of shape {tuple(starts.shape)} on {starts.device}"
        if isinstance(starts, torch.Tensor)
        else f"a {type(starts).__name__}"
    )
    many = "a start per batch row" if rows_given else f"a start per request ({n})"
    raise RelayError(
        f"{s.table.what(i)}: batch.{declared.starts} must hold {many} and the last "
        f"row's end (an int64 or int32 vector on {device}), got {got}. Hand the "
        "batch's cumulative row starts from 0 (vLLM's query_start_loc). Nothing was "
        "written"
    )


def _rows_fit(
    s: MapState,
    fields: tuple[int, ...],
    indices: torch.Tensor,
    starts: torch.Tensor,
    widths: list[int],
    counts: list[torch.Tensor | None],
    bounds: tuple[torch.Tensor, torch.Tensor | None],
    owners: Owners | None = None,
) -> None:
    """On the host: each request's span (``widths``, or ``counts`` where given, of
    each field in turn from its start) inside its own batch row, and no row paired
    with two requests; else the first that is not refused, naming the request and the
    field (Note [Row-bounded scatters])."""
    n = starts.numel()
    fixed = sum(w for w, c in zip(widths, counts) if c is None)
    counted = [c for c in counts if c is not None]
    if n > HOST_POSITIONS_IN_PYTHON_MAX and starts.is_cpu:
        spans = sum((c.numpy() for c in counted), np.full(n, fixed))
        ok = _rows_ok_np(starts.numpy(), spans, bounds)
    else:
        each = [cast(list[int], c.tolist()) for c in counted]
        spans_l = [fixed + sum(c) for c in zip(*each)] if each else [fixed] * n
        ok = _rows_ok(starts.tolist(), spans_l, bounds)
    if not ok:
        _name_row(s, fields, indices, starts, widths, counts, bounds, owners)


def _rows_ok(
    at: list[int],
    spans: list[int],
    bounds: tuple[torch.Tensor, torch.Tensor | None],
) -> bool:
    """Whether each request's span of ``spans[j]`` positions from ``at[j]`` lies inside
    its own batch row, no row taken twice (a span of no positions is not placed)."""
    row_starts, index = bounds
    ends: list[int] = row_starts.tolist()
    if index is None:  # request i is row i: rows apart by construction
        for a, low, high, span in zip(at, ends, ends[1:], spans):
            if span and not low <= a <= high - span:
                return False
        return True
    last = len(ends) - 2
    seen: set[int] = set()
    for a, r, span in zip(at, index.tolist(), spans):
        if span:
            if (
                not 0 <= r <= last
                or r in seen
                or not ends[r] <= a <= ends[r + 1] - span
            ):
                return False
            seen.add(r)
    return True


def _rows_ok_np(
    at: np.ndarray, spans: np.ndarray, bounds: tuple[torch.Tensor, torch.Tensor | None]
) -> bool:
    """``_rows_ok`` through numpy, for many requests: one view op per tensor."""
    row_starts, index = bounds
    live = spans > 0
    rows = (np.arange(at.size) if index is None else index.numpy())[live]
    ends = row_starts.numpy()
    if not ((rows >= 0) & (rows < ends.size - 1)).all():
        return False
    if np.unique(rows).size != rows.size:
        return False
    first = at[live]
    return bool(((first >= ends[rows]) & (first + spans[live] <= ends[rows + 1])).all())


def _name_row(
    s: MapState,
    fields: tuple[int, ...],
    indices: torch.Tensor,
    starts: torch.Tensor,
    widths: list[int],
    counts: list[torch.Tensor | None],
    bounds: tuple[torch.Tensor, torch.Tensor | None],
    owners: Owners | None = None,
) -> None:
    """Refuse the first request paired with no row of the batch, or with a row another
    request has, or whose span leaves its row, once ``_rows_fit`` found one."""
    table = s.table
    n = starts.numel()
    row_starts, index = bounds
    ends: list[int] = row_starts.tolist()
    at: list[int] = starts.tolist()
    rows: list[int] = list(range(n)) if index is None else index.tolist()
    slots: list[int] = indices.reshape(-1).tolist()
    taken = [
        [w] * n if c is None else cast(list[int], c.tolist())
        for w, c in zip(widths, counts)
    ]
    scatter = table.fields[fields[0]].scatter
    assert scatter is not None and scatter.rows is not None
    path = scatter.rows.starts
    held: dict[int, int] = {}  # the request each row was paired with
    for j in range(n):
        if not any(each[j] for each in taken):
            continue  # places nothing
        r = rows[j]
        whose = request_at(j, slots[j], owners)
        if not 0 <= r < len(ends) - 1:
            raise RelayError(
                f"{table.what(fields[0])}: {whose} is paired with batch row {r} "
                f"(batch.{scatter.rows.index}), but batch.{path} holds "
                f"{len(ends) - 1} row(s). Pair each request with its row of this "
                "batch. Nothing was written"
            )
        if r in held:
            other = request_at(held[r], slots[held[r]], owners)
            raise RelayError(
                f"{table.what(fields[0])}: {whose} and {other} are both paired with "
                f"batch row {r} (batch.{scatter.rows.index}): one would overwrite the "
                "other's row. Pair each request with its own row. Nothing was written"
            )
        held[r] = j
        low, high = ends[r], ends[r + 1]
        first = at[j]
        for i, each in zip(fields, taken):
            last = first + each[j]
            if each[j] and (first < low or last > high):
                out = first if first < low else high
                k = bisect.bisect_right(ends, out) - 1
                if not 0 <= k < len(ends) - 1:
                    side = "in no row of the batch"
                elif ends[k] == out:
                    side = f"batch row {k}'s first, another request's"
                else:
                    side = f"inside batch row {k}, another request's"
                raise RelayError(
                    f"{table.what(i)}: {whose} would lay its {each[j]} value(s) at "
                    f"positions {first} to {last - 1}, outside its batch row {r} "
                    f"(positions {low} to {high - 1} by batch.{path}): position "
                    f"{out} is {side}. Lay out each request's row for the values it "
                    "is handed (a count larger than its row was laid out for, an "
                    "offset off, or the wrong row). Nothing was written"
                )
            first = last


def assert_rows(
    starts: torch.Tensor,
    span: torch.Tensor | int,
    bounds: tuple[torch.Tensor, torch.Tensor | None],
    what: str,
) -> None:
    """Off the CPU, as one device-side assert (no host read: Note [Row-bounded
    scatters]): each request's span of ``span`` positions from its start inside its
    own batch row, the rows' starts in order and no row paired with two requests, so
    the spans lie apart from each other too."""
    row_starts, index = bounds
    if isinstance(span, int) and span == 0:
        return
    ordered = (row_starts[1:] >= row_starts[:-1]).all()
    if index is None:
        low, high = row_starts[:-1], row_starts[1:]
        known: torch.Tensor | bool = True
    else:
        row = index.clamp(0, row_starts.numel() - 2)
        known = row == index
        low, high = row_starts.index_select(0, row), row_starts.index_select(0, row + 1)
    inside = known & (starts >= low) & (starts + span <= high)
    if isinstance(span, torch.Tensor):
        placed = span != 0
        inside = inside | ~placed
    if index is not None:  # a request placing nothing takes no row
        own = (
            index
            if isinstance(span, int)
            else torch.where(
                placed, index, -1 - torch.arange(index.numel(), device=index.device)
            )
        )
        taken = own.sort().values
        ordered = ordered & (taken[1:] > taken[:-1]).all()
    torch._assert_async(
        inside.all() & ordered,
        f"{what}: a request's span runs outside its batch row (or its row is not "
        "one of the batch's, or is another request's, or the rows' starts are out "
        "of order)",
    )


def _span_places(
    plan: SpanPlan,
    rows: tuple[torch.Tensor, ...],
    starts: torch.Tensor,
    counts: list[torch.Tensor | None],
    host: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor | None]]:
    """Each field's target positions and values, in span order: on the host only the
    counted ones; elsewhere all of a counted field's, with the mask of those kept. A
    ``fixed`` field takes its row's width of the span whatever it lays."""
    positions: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    masks: list[torch.Tensor | None] = []
    first = starts
    before: int = 0
    counted: torch.Tensor | None = None
    for block, width, count, whole, columns in zip(
        rows, plan.widths, counts, plan.fixed, plan.columns
    ):
        if positions:  # after the fields before it in the span
            first = first + (before if counted is None else counted)
        before, counted = width, None if whole else count
        if count is None and width == 1:  # one value per request: at its start
            positions.append(first)
            values.append(block if block.ndim == 1 else block.flatten())
            masks.append(None)
            continue
        at = first.unsqueeze(1) + columns
        if block.ndim != 2:
            block = block.reshape(len(starts), width)
        if count is None:
            at, block, keep = at.flatten(), block.flatten(), None
        elif host:
            keep = columns < count.unsqueeze(1)
            at, block, keep = at[keep], block[keep], None
        else:
            keep = columns < count.unsqueeze(1)
        positions.append(at)
        values.append(block)
        masks.append(keep)
    return positions, values, masks


def _debug_span(
    s: MapState,
    debug: DebugChecks,
    fields: tuple[int, ...],
    indices: torch.Tensor,
    starts: torch.Tensor,
    widths: list[int],
    counts: list[torch.Tensor | None],
    size: int,
    owners: Owners | None,
) -> None:
    """Debug mode, before a span's scatter: each count in its row's width and no more
    than the slot's stash wrote, each request's span inside the target and apart from
    the others' (named by the span's first field)."""
    span: torch.Tensor | int = 0
    for i, width, count in zip(fields, widths, counts):
        if count is not None:
            name = s.table.fields[i].name
            produced = s.produced.get(i)
            debug.check_counts(name, indices, count, width, produced, owners)
        span = span + (width if count is None else count)
    head = s.table.fields[fields[0]].name
    debug.check_scatter(head, indices, starts, span, size, owners)


def _debug_claims(
    s: MapState,
    debug: DebugChecks,
    fields: tuple[int, ...],
    indices: torch.Tensor,
    places: tuple[torch.Tensor, list[int], list[torch.Tensor | None], list[bool]],
    target: torch.Tensor,
    owners: Owners | None = None,
) -> None:
    """Debug mode, before a scatter into a guarded target, after its ranges were
    checked: every position each field would write holds a negative placeholder, not
    another request's value (Note [Scatter destinations]). ``places``: the starts,
    and each field's width, count and whether it takes its width whatever it lays."""
    first, widths, counts, fixed = places
    for i, width, count, whole in zip(fields, widths, counts, fixed):
        columns = torch.arange(width, device=first.device)
        at = first.unsqueeze(1) + columns
        keep = (
            torch.ones_like(at, dtype=torch.bool)
            if count is None
            else columns < count.unsqueeze(1)
        )
        name = s.table.fields[i].name
        debug.check_claimed(name, indices, at, keep, target, owners)
        first = first + (width if count is None or whole else count)


def scatter_kept(
    target: torch.Tensor, at: torch.Tensor, keep: torch.Tensor, block: torch.Tensor
) -> None:
    """``target[at[keep]] = block[keep]`` with no host read (Note [Counted scatters]):
    each position takes the number of the kept entry that covers it (positions were
    checked not to overlap), then its value; an entry not kept covers nothing. A kept
    entry outside the target fails in ``scatter_reduce_``, before ``target`` changes
    (on CUDA a device-side assert, as any index op's): it is never moved into range."""
    size = target.numel()
    if size == 0:
        return
    entry = torch.arange(keep.numel(), device=target.device).view_as(keep)
    taken = torch.where(keep, entry, -1).flatten()
    cover = torch.full((size,), -1, dtype=torch.int64, device=target.device)
    # An entry not kept may point anywhere: it covers position 0 with -1, a no-op.
    cover.scatter_reduce_(0, torch.where(keep, at, 0).flatten(), taken, "amax")
    values = block.flatten().index_select(0, cover.clamp(min=0))
    target.copy_(torch.where(cover >= 0, values, target))


def _widened(s: MapState, i: int, value: torch.Tensor | None) -> torch.Tensor | None:
    """A counted field's rows narrower than its buffer's, padded to its width with
    zeros (vLLM's drafts are as wide as the step's draft count, which changes per
    step); the counts keep the padding from being read (Note [Counted scatters])."""
    f = s.table.fields[i]
    counted = f.scatter is not None and f.scatter.lengths is not None
    if not counted or not isinstance(value, torch.Tensor) or value.ndim != 2:
        return value
    width = math.prod(s.rows[i]) if s.buffers[i] is not None else None
    if width is None or len(f.shape) != 1 or value.shape[1] >= width:
        return value
    return torch.nn.functional.pad(value, (0, width - value.shape[1]))


def stashed_counts(
    s: MapState, indices: torch.Tensor, payload: object, owners: Owners | None = None
) -> dict[int, torch.Tensor]:
    """Debug mode: the producer's count of each counted scatter field, from the
    payload attribute named after its ``lengths`` (Note [Counted scatters]); checked
    before anything is written. Nothing with debug off."""
    debug = s.debug
    n = indices.numel() if isinstance(indices, torch.Tensor) else 0
    if debug is None or n == 0:
        return {}
    table = s.table
    counts = {}
    for i in table.forward:
        f = table.fields[i]
        scatter = f.scatter
        if scatter is None or scatter.lengths is None:
            continue
        name = scatter.lengths.rsplit(".", 1)[-1]
        value = getattr(payload, name)
        if not (
            isinstance(value, torch.Tensor)
            and value.dtype in (torch.int64, torch.int32)
            and value.numel() == n
            and value.ndim <= 1
            and value.device == s.device
        ):
            got = (
                f"a {value.dtype} tensor of shape {tuple(value.shape)}"
                if isinstance(value, torch.Tensor)
                else f"a {type(value).__name__}"
            )
            raise RelayError(
                f"{table.what(i)}: payload.{name} must hold one integer count per row "
                f"({n}, an int64 or int32 vector on {s.device}), got {got}. Nothing was "
                "written"
            )
        count = value.reshape(-1).long()
        if s.buffers[i] is not None:  # a lazy one's width comes with its first rows
            width = math.prod(s.rows[i])
            rows = getattr(payload, f.payload_name)
            if isinstance(rows, torch.Tensor) and rows.ndim == 2 and len(f.shape) == 1:
                width = min(width, rows.shape[1])  # a narrower step (_widened)
            debug.check_counts(f.name, indices, count, width, None, owners)
        counts[i] = count
    return counts


def record_counts(
    s: MapState, indices: torch.Tensor, counts: dict[int, torch.Tensor]
) -> None:
    """Debug mode, after a write: the count each slot's row now carries."""
    slots = indices.reshape(-1).long()
    for i, count in counts.items():
        produced = s.produced.get(i)
        if produced is None:
            width = math.prod(s.rows[i])
            produced = s.produced[i] = torch.full(
                (s.pool_size,), width, dtype=torch.int64, device=s.device
            )
        produced.index_copy_(0, slots, count)


def write_optional(
    buf: torch.Tensor | None, indices: torch.Tensor, value: torch.Tensor | None
) -> bool:
    """The common case's write of an optional or lazy field; whether it carried a value.
    An omitted value zero-fills its rows (Note [Optional fields]); the gate let a value
    through only once its buffer exists."""
    if value is None:
        if buf is not None:
            buf.index_fill_(0, indices, 0)
        return False
    if buf is not None:
        buf.index_copy_(0, indices, value)
    return True


# --- the checked path ----------------------------------------------------------------------


def stash(
    s: MapState, indices: torch.Tensor, payload: object, owners: Owners | None = None
) -> None:
    """``stash`` off the common case (Note [One body])."""
    table = s.table
    values = [
        _widened(s, i, getattr(payload, table.fields[i].payload_name))
        for i in table.forward
    ]
    counts = stashed_counts(s, indices, payload, owners)
    if _write(s, "stash", table.forward, indices, values, owners, counts) and counts:
        record_counts(s, indices, counts)


def publish(
    s: MapState,
    indices: torch.Tensor,
    values: Sequence[torch.Tensor | None],
    owners: Owners | None = None,
) -> None:
    """``publish`` off the common case: the values in declaration order."""
    if not _write(s, "publish", s.table.schedule, indices, values, owners):
        return
    if s.debug is not None:
        s.debug.publishing()
    s.fence.record()


def _write(
    s: MapState,
    op: str,
    fields: Sequence[int],
    indices: torch.Tensor,
    given: Sequence[torch.Tensor | None],
    owners: Owners | None = None,
    counts: Mapping[int, torch.Tensor] | None = None,
) -> bool:
    """Every check before any write, so a refused call leaves the map as it was;
    whether there was a row to write. ``counts``: debug mode's count of each counted
    scatter field's real values per row (its guard checks those only)."""
    values = _checked(s, op, fields, indices, given, owners, counts)
    if values is None:
        return False
    slots, checked = values
    _apply(s, op, fields, slots, checked, owners)
    return True


def _apply(
    s: MapState,
    op: str,
    fields: Sequence[int],
    slots: torch.Tensor,
    values: Sequence[torch.Tensor | None],
    owners: Owners | None,
) -> None:
    """Write checked ``values`` into rows ``slots``, then debug mode's record of it.
    No autograd graph is recorded: a value that requires grad is written detached
    (a map's buffers never chain one step's graph into the next)."""
    debug = s.debug
    with torch.no_grad():
        for i, value in zip(fields, values):
            _write_field(s, i, slots, value)
    if debug is None:
        return
    table = s.table
    # A kept or graph-written field left out was not written (Note [Left to others]).
    fields, values = _written(table, fields, values)
    carried = {
        table.fields[i].name: v is not None
        for i, v in zip(fields, values)
        if table.fields[i].optional
    }
    names = tuple(table.fields[i].name for i in fields)
    if op == "seed":
        debug.seeded(slots, names, carried=carried, owners=owners)
    else:
        debug.wrote(op, slots, names, carried=carried, owners=owners)


def _checked(
    s: MapState,
    op: str,
    fields: Sequence[int],
    indices: torch.Tensor,
    given: Sequence[torch.Tensor | None],
    owners: Owners | None,
    counts: Mapping[int, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor | None]] | None:
    """The int64 slots and the values ready to write, or ``None`` for zero slots;
    refuses what cannot be written, naming it, before anything is written. A 0-dim
    slot is one slot, its value one row ``(1, *row)``, as ``resolve_future`` hands
    such a slot's row back."""
    table = s.table
    if isinstance(indices, torch.Tensor) and indices.ndim == 0:
        indices = indices.reshape(1)
    values = [
        None  # a field this map does not relay drops its value unread
        if (
            value is None
            and (table.fields[i].optional or table.fields[i].graph_written)
        )
        or not s.on[i]
        else check_rows(
            table.what(i),
            value,
            indices,
            s.buffers[i],
            table.declared_row(i),
            table.dtype(i),
            s.device,
        )
        for i, value in zip(fields, given)
    ]
    first = table.what(fields[0]) if fields else table.owner
    slots = write_slots(
        f"{table.owner}.{op}",
        first,
        indices,
        s.pool_size,
        host=s.debug is None,
        device=s.device,
    )
    if slots is None:
        return None
    if owners is not None:
        _check_owners(f"{table.owner}.{op}", owners, slots.numel())
    debug = s.debug
    if debug is not None:
        debug.check_slots(op, indices, scratch_ok=op != "seed")
        for i, value in zip(fields, values):
            f = table.fields[i]
            guard, cast = _guard(f), _narrowed(f)
            if value is None or (guard is None and cast is None):
                continue
            count = None if counts is None else counts.get(i)
            real = value if count is None else _counted(value, count)
            if guard is not None:
                guard(real, table.what(i))
            if cast is not None:
                check_cast(real, cast, table.what(i), f"batch.{f.target}")
    return slots, values


def _counted(value: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``value``'s rows with each value past the row's count replaced by 1, which
    every guard passes: a counted row's tail is no value (vLLM fills it with -1), and
    no resolve reads it (Note [Counted scatters])."""
    rows = value.reshape(count.numel(), -1)
    columns = torch.arange(rows.shape[1], device=rows.device)
    real = columns < count.to(rows.device).unsqueeze(1)
    return torch.where(real, rows, torch.ones((), dtype=rows.dtype, device=rows.device))


def _check_owners(what: str, owners: Owners, count: int) -> None:
    """``owners`` names one request per row; refused before any write otherwise."""
    given = owners.numel() if isinstance(owners, torch.Tensor) else len(owners)
    if given != count:
        raise RelayError(
            f"{what}: owners must name one request per row: {count} rows, {given} "
            "owners. Nothing was written"
        )


def _write_field(
    s: MapState, i: int, slots: torch.Tensor, value: torch.Tensor | None
) -> None:
    f = s.table.fields[i]
    buf = s.buffers[i]
    if value is None and (f.kept or f.graph_written):
        return  # Note [Left to others]
    if f.optional:
        s.carried[i] = value is not None
    if value is None:  # an optional field left out: Note [Optional fields]
        if buf is not None:
            buf.index_fill_(0, slots, 0)
        return
    if buf is None:
        buf = s.adopt(
            i,
            lazy_buffer(
                s.pool_size,
                s.table.dtype(i),
                value[(0,) * slots.ndim],
                s.debug is not None,
                f.unwritten is Unwritten.ZEROS,
            ),
        )
    buf.index_copy_(0, slots, value)


# Note [Seeds]
# A request prefilled elsewhere starts with no forward of its own, so the scheduler
# hands its first values to the map: ``seed``. The slot's previous request may still
# have a forward launched and not finished, which reads the row and stashes into it.
# The seed must be written after that stash and before the next forward's read: by the
# first forward launched after the seed, never by one launched before it. So ``seed``
# checks and copies the values, stamps them with its place in the host order of
# launches, and queues them; a ``resolve_future`` writes, first, the queued seeds
# stamped at or before its own place, and leaves the later ones for the forward
# launched after them. On a device the host enqueues a forward's resolve at its launch,
# so every queued seed is due; on relay's CPU stream a task runs its resolve later,
# and its place is its launch (``host_order_place`` in relay/cpu_stream.py). A task
# that seeds is placed at its own launch too, so the seed is the next task's, on
# whichever thread it ran. No wait and no fence of its own.


def seed(
    s: MapState, indices: torch.Tensor, payload: object, owners: Owners | None = None
) -> None:
    """``seed``: check the rows now, queue copies for the next ``resolve_future``
    (Note [Seeds])."""
    table = s.table
    given = [getattr(payload, table.fields[i].payload_name) for i in table.forward]
    for i, value in zip(table.forward, given):
        if value is None and table.fields[i].graph_written:
            raise RelayError(
                f"{table.what(i)}: seed needs its value: a captured graph writes the "
                "rows of the steps it runs, and a seeded request ran none here. "
                "Nothing was written"
            )
    counts = stashed_counts(s, indices, payload, owners)
    checked = _checked(s, "seed", table.forward, indices, given, owners, counts)
    if checked is not None:
        slots, values = checked
        copies = [None if v is None else v.detach().clone() for v in values]
        kept = {i: count.clone() for i, count in counts.items()}
        queued = (host_order_place(), slots.clone(), copies, owners, kept)
        with _seeds_lock:
            s.seeds.append(queued)


def apply_seeds(s: MapState) -> None:
    """Write the queued seeds made before the calling forward's launch, oldest first
    (on the forward stream, in resolve_future); later ones stay queued (Note [Seeds])."""
    place = host_order_place()
    with _seeds_lock:
        due = sorted((seed for seed in s.seeds if seed[0] <= place), key=_place)
        if due:
            s.seeds = [seed for seed in s.seeds if seed[0] > place]
    for _, slots, values, owners, counts in due:
        _apply(s, "seed", s.table.forward, slots, values, owners)
        if counts:  # the counts the rows carry from now on, as a stash's
            record_counts(s, slots, counts)


def _place(seed: Seed) -> int:
    return seed[0]


def parent_is_none(table: Table, method: str, parent: str) -> RelayError:
    """The error of a resolve whose optional parent is ``None`` where the schema says to
    refuse it."""
    return RelayError(
        f"{table.owner}.{method}: batch.{parent} is None, and the schema says a resolve "
        f"refuses that (optional_parents={{{parent!r}: IfNone.REFUSE}}); give the batch "
        f"its {parent}, or declare IfNone.SKIP to leave the fields under it alone"
    )


def lazy_buffer(
    pool_size: int,
    dtype: torch.dtype | None,
    first: torch.Tensor,
    debug: bool,
    zeros: bool = False,
) -> torch.Tensor:
    """A lazy field's buffer, shaped and typed by one row ``first`` of its first value,
    which ``check_rows`` already accepted."""
    row = tuple(first.shape)
    return buffer((pool_size, *row), dtype or first.dtype, first.device, debug, zeros)


def check_rows(
    what: str,
    value: object,
    indices: object,
    buf: torch.Tensor | None,
    declared_row: tuple[int | None, ...] = (),
    declared_dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """``value`` ready to write into ``buf`` at ``indices``: a tensor with one row per
    index, shaped like the buffer's rows (before a lazy buffer exists: like
    ``declared_row``, ``None`` matching any size), of a dtype that casts to the
    buffer's (or ``declared_dtype``) without losing values, cast only when it differs.

    Types, shapes and dtypes only: it dispatches no torch op. Without it an indexed
    write would broadcast a (n, 1) tensor into (n, topk) rows, or wrap and truncate
    values cast into a narrower dtype, without a word.
    """
    if not isinstance(value, torch.Tensor):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise RelayError(
            f"{what}: got {shown} of type {type(value).__name__}, not a tensor; "
            "payload values and publish arguments are torch.Tensors with one row per "
            "slot (e.g. torch.as_tensor(values, device=...)). Nothing was written"
        )
    slots = _refuse_indices(what, indices)
    home = buf.device if buf is not None else device  # a lazy buffer: the map's device
    if home is not None and value.device != home:
        raise RelayError(
            f"{what}: got a tensor on {value.device} for a map on {home}; move "
            f"it first (.to({str(home)!r})). Nothing was written"
        )
    got = tuple(value.shape)
    lead = tuple(slots.shape)  # a 0-dim slot is one slot, its value one row
    if buf is not None:
        expected: tuple[int | str, ...] = (*lead, *buf.shape[1:])
        ok = got == expected
    else:
        expected = (*lead, *("?" if d is None else d for d in declared_row))
        ok = (
            len(got) == len(expected)
            and got[: len(lead)] == lead
            and all(
                want in (None, size)
                for want, size in zip(declared_row, got[len(lead) :])
            )
        )
        if ok and slots.numel() > 0 and 0 in got[len(lead) :]:
            raise RelayError(
                f"{what}: the first payload has rows of shape {got[1:]}, with a "
                "zero-width dim; a lazy buffer takes its row shape from its first "
                "payload, so it would stay empty. Leave the field out (None) until "
                "its rows have a width"
            )
    if not ok:
        raise RelayError(
            f"{what}: got a tensor of shape {got} for {slots.numel()} slot(s); expected "
            f"{expected} (one row per index, rows as declared; '?' is any size)"
        )
    want = buf.dtype if buf is not None else declared_dtype
    if want is None or value.dtype is want:
        return value
    _refuse_cast(what, value.dtype, want)
    return value.to(want)


def _refuse_cast(what: str, got: torch.dtype, want: torch.dtype) -> None:
    """Refuse a cast that can change a value: to a lower kind (float to int drops the
    fraction) or to an integer dtype that cannot hold every value of ``got`` (it wraps).
    Floating casts (float32 to bfloat16) are taken: they round, never wrap."""
    if _kind(got) > _kind(want):
        raise RelayError(
            f"{what}: got {got} values for a {want} field; the cast would drop their "
            f"fractional or imaginary part. Convert them first (e.g. .round().to({want}))"
        )
    if _kind(got) == _kind(want) == 1 and not _holds(want, got):
        raise RelayError(
            f"{what}: got {got} values for a {want} field; the cast would wrap values "
            f"{want} cannot hold (2**31 + 5 would become negative). Convert them "
            f"yourself once you know they fit (.to({want})), or declare dtype={got}"
        )


def _kind(dtype: torch.dtype) -> int:
    """0 bool, 1 integer, 2 floating, 3 complex: a cast to a lower kind loses values."""
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def _holds(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Whether integer dtype ``wide`` holds every value of integer dtype ``narrow``."""
    a, b = torch.iinfo(wide), torch.iinfo(narrow)
    return a.min <= b.min and a.max >= b.max


#: Slot dtypes a write takes: ``.long()`` keeps each of their values. Wider unsigned
#: ones are refused: torch's index ops take none of them.
SLOT_DTYPES = frozenset(
    {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
)


def _refuse_indices(
    what: str, indices: object, device: torch.device | None = None
) -> torch.Tensor:
    """``indices`` if they are one integer slot per row (on ``device`` where given);
    else refuse them."""
    if not isinstance(indices, torch.Tensor):
        raise RelayError(
            f"{what}: indices must be a tensor of request-pool slots (got a "
            f"{type(indices).__name__}), e.g. torch.tensor(slots, device=...). Nothing "
            "was written"
        )
    if indices.dtype not in SLOT_DTYPES:
        wider = "" if indices.dtype.is_floating_point else ", which torch indexes with"
        raise RelayError(
            f"{what}: indices must be integer slots, got a {indices.dtype} tensor"
            + (
                f"{wider} no op (pass request-pool slots as int64 or int32)"
                if wider and indices.dtype != torch.bool
                else ", which a write would truncate to slots (bool ones to slots 0 "
                "and 1); pass request-pool slots as int64 or int32"
            )
            + ". Nothing was written"
        )
    if indices.dim() > 1:
        raise RelayError(
            f"{what}: indices must be one slot per row, a 1-D tensor (got shape "
            f"{tuple(indices.shape)})"
        )
    if device is not None and indices.device != device:
        raise RelayError(
            f"{what}: indices are on {indices.device}, not on the map's device "
            f"{device}; hand the slots on {device} (.to({str(device)!r})). Nothing was "
            "written"
        )
    return indices


def write_slots(
    what: str,
    first: str,
    indices: object,
    pool_size: int,
    *,
    host: bool = True,
    device: torch.device | None = None,
) -> torch.Tensor | None:
    """The int64 slots a checked write indexes with, ``None`` for none. Refuses, named
    as field ``first``, indices that are no vector of integer slots (on ``device``
    where given) and, on the host where ``host`` (debug mode checks slots itself), a
    slot outside the pool."""
    slots = _refuse_indices(first, indices, device)
    if slots.numel() == 0:
        return None
    if host and slots.is_cpu and not host_slots_ok(slots, pool_size):
        values = _host_values(slots)
        outside = [i for i, s in enumerate(values) if not 0 <= s < pool_size]
        if outside:
            raise SlotError(
                f"{what}: slot {values[outside[0]]} at position {outside[0]} is outside "
                f"the pool [0, {pool_size}); slots are request-pool indices of this map "
                "(a negative slot would wrap around). Nothing was written"
            )
    return slots if slots.dtype is torch.int64 else slots.long()


def never_stashed(owner: str, field: str) -> RelayError:
    """The error for resolving a required lazy field before its first stash."""
    return RelayError(
        f"{owner}.{field}: resolved before any stash allocated its buffer; "
        "stash a payload carrying it (the forward that produced the rows) first"
    )


# --- debug mode's reports of a resolve ------------------------------------------------------


def read_back(
    s: MapState,
    op: str,
    indices: torch.Tensor,
    owners: Owners | None = None,
    absent: tuple[str, ...] = (),
    gated_off: tuple[str, ...] = (),
) -> None:
    """Debug mode: ``op`` gathered rows ``indices`` of its fields (optional ones only
    where the latest write carried them; none under the optional parents ``absent``,
    which the batch lacked; none of the fields ``gated_off``, whose gate the batch
    left unset): checked fresh, then poisoned again."""
    debug = s.debug
    assert debug is not None, "read_back runs in debug mode only"
    table = s.table
    read = [
        i
        for i, f in enumerate(table.fields)
        if table.readers[i] == op
        and f.target is not None
        and f.resolve is not Resolve.PLACEHOLDER
        and f.target.split(".")[0] not in absent
        and f.name not in gated_off
    ]
    # A scatter lays its rows in whatever the latest write carried (an optional
    # scatter field keeps its rows when left out): each row's own state says.
    carried = {
        table.fields[i].name: s.carried[i] or table.fields[i].scatter is not None
        for i in read
        if table.fields[i].optional
    }
    # A row a counted scatter laid nothing of is not read (Note [Counted scatters]):
    # such rows are sent to row 0, whose checks pass, one read per masked field.
    unread = {i: s.unread.pop(i) for i in read if i in s.unread}
    plain = {table.fields[i].name: s.buffers[i] for i in read if i not in unread}
    if plain:
        debug.read(op, indices, plain, carried=carried, owners=owners)
    for i, skip in unread.items():
        name = table.fields[i].name
        rows = torch.where(skip, torch.zeros_like(indices), indices)
        buffers = {name: s.buffers[i]}
        debug.read(op, rows, buffers, carried=carried, owners=owners)


#: Up to this many values, ``host_sum`` adds integers in Python; above it numpy does,
#: with no torch op dispatched.
HOST_SUM_IN_PYTHON_MAX = 64


#: The dtypes neither floating nor complex, whose host sum is exact in Python ints
#: (one set test on the hot path).
_EXACT_SUM = frozenset(
    d
    for d in vars(torch).values()
    if isinstance(d, torch.dtype) and not (d.is_floating_point or d.is_complex)
)


def host_sum(values: torch.Tensor) -> int:
    """The sum of a host tensor as an ``int`` (a float sum is truncated)."""
    if values.dtype not in _EXACT_SUM:
        return int(values.sum())
    return int_sum(values)


def int_sum(values: torch.Tensor) -> int:
    """``host_sum`` of a host tensor of integers or bools, whose field declares so: no
    dtype to test."""
    if values.numel() <= HOST_SUM_IN_PYTHON_MAX:
        return sum(values.tolist())
    return int(values.numpy().sum())


# Note [Guards in debug mode]
# Guards run in debug mode only: three device ops (compare, all, assert) per field per
# write, and no host sync. A guard on a floating field lets NaN through (it is not a
# value below the bound); only guard_finite refuses NaN and infinities. A Guard kind
# is its member in relay/schema.py, its rule in relay/codegen/validate.py and its
# check here (``_GUARDS``).


def guard_non_negative(value: torch.Tensor, what: str) -> None:
    """Assert ``value >= 0`` on the device, without a host sync; NaN passes."""
    ok = (value < 0).logical_not_() if value.dtype.is_floating_point else value >= 0
    torch._assert_async(ok.all(), text("guard_non_negative_summary", what=what))


def guard_positive(value: torch.Tensor, what: str) -> None:
    """Assert ``value > 0`` on the device, without a host sync; NaN passes."""
    ok = (value <= 0).logical_not_() if value.dtype.is_floating_point else value > 0
    torch._assert_async(ok.all(), text("guard_positive_summary", what=what))


def guard_finite(value: torch.Tensor, what: str) -> None:
    """Assert no NaN or infinity in ``value`` on the device, without a host sync."""
    torch._assert_async(
        torch.isfinite(value).all(), text("guard_finite_summary", what=what)
    )


_GUARDS: dict[Guard, GuardFn | None] = {
    Guard.NONE: None,
    Guard.NON_NEGATIVE: guard_non_negative,
    Guard.POSITIVE: guard_positive,
    Guard.FINITE: guard_finite,
}


# --- graph-written buffers, partial stashes, late-bound tails ------------------------------

# Note [Left to others]
# A write may leave a field's rows to someone else: a graph-written field's value is
# ``None`` where a captured graph already wrote the rows (``graph_wrote`` tells debug
# mode), and a kept field's rows survive ``stash_partial`` and a ``stash`` that leaves
# an optional kept field out. Such a field is no write of the call: its buffer, its
# carried flag and debug mode's record of its rows stay as they were.


def _written(
    table: Table, fields: Sequence[int], values: Sequence[torch.Tensor | None]
) -> tuple[list[int], list[torch.Tensor | None]]:
    """The fields a write really wrote, and their values (Note [Left to others])."""
    kept = [
        (i, v)
        for i, v in zip(fields, values)
        if v is not None or not (table.fields[i].kept or table.fields[i].graph_written)
    ]
    return [i for i, _ in kept], [v for _, v in kept]


def adopted(
    s: MapState,
    i: int,
    buf: torch.Tensor | None,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """Field ``i``'s buffer: ``buf``, which the engine allocated for a captured graph to
    write, or, without one, a buffer the map makes. An engine's buffer is checked
    against the field and against the map's other buffers (Note [Adopted buffers]);
    once the last graph-written field's is, each is filled in place as its field
    declares (zeros, or debug mode's poison), so a refused one leaves all unfilled."""
    table = s.table
    if buf is None:
        made = s.buffer(i, shape, dtype)
    else:
        made = s.adopt(i, _adoptable(s, i, buf, shape, dtype))
    if i == max(j for j, f in enumerate(table.fields) if f.graph_written):
        for j, f in enumerate(table.fields):
            each = s.buffers[j]
            if not f.graph_written or each is None:
                continue
            if f.unwritten is Unwritten.ZEROS:
                each.zero_()
            elif s.debug is not None:
                each.fill_(poison(each.dtype))
    return made


# Note [Adopted buffers]
# A graph-written field's buffer may be the engine's (``<field>_buf=``): the captured
# graph writes it, the map reads and writes it in place. Two fields sharing storage
# would write each other's rows (a stash of a bonus token read back as a length), and
# a buffer that requires grad fails the first in-place write with a torch error. So
# each is refused, naming the field, unless it is a tensor of the field's dtype and
# shape on the map's device, not requiring grad, and its bytes overlap no other buffer
# of the map (same storage, intersecting byte ranges: disjoint views of one
# allocation are fine).


def _adoptable(
    s: MapState,
    i: int,
    buf: object,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """``buf`` if field ``i`` may adopt it (Note [Adopted buffers]); refused if not."""
    what = s.table.what(i)
    if not isinstance(buf, torch.Tensor):
        raise RelayError(
            f"{what}: the buffer handed to the constructor must be a tensor (got a "
            f"{type(buf).__name__}); allocate it with torch.empty({shape}, "
            f"dtype={dtype}), or leave it out for the map to make its own"
        )
    if buf.dtype != dtype or tuple(buf.shape) != shape or buf.device != s.device:
        raise RelayError(
            f"{what}: the buffer handed to the constructor must be a {dtype} tensor of "
            f"shape {shape} on {s.device} (got a {buf.dtype} tensor of shape "
            f"{tuple(buf.shape)} on {buf.device}); allocate it so, or leave it out for "
            "the map to make its own"
        )
    if buf.requires_grad:
        raise RelayError(
            f"{what}: the buffer handed to the constructor requires grad, but the map "
            "writes it in place, outside autograd; hand buf.detach() (the same memory) "
            "or allocate it with requires_grad=False"
        )
    low, high = _byte_range(buf)
    for j, other in enumerate(s.buffers):
        if other is None or j == i:
            continue
        if other.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
            continue
        other_low, other_high = _byte_range(other)
        if low < other_high and other_low < high:
            raise RelayError(
                f"{what}: the buffer handed to the constructor shares storage with "
                f"{s.table.what(j)}'s buffer (bytes {low} to {high} and "
                f"{other_low} to {other_high} of one storage overlap), so a write to "
                "one would change the other's rows; hand each field its own tensor "
                "(or disjoint views of one), or leave one out for the map to make"
            )
    return buf


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage ``t`` may touch: from its first element to past its
    last (every stride taken at its reach)."""
    size = t.element_size()
    low = high = t.storage_offset()
    for extent, stride in zip(t.shape, t.stride()):
        reach = (extent - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    return int(low) * size, (int(high) + 1) * size


def graph_wrote(
    s: MapState, indices: torch.Tensor, owners: Owners | None = None
) -> None:
    """Debug mode: a captured graph wrote rows ``indices`` of every graph-written field,
    on the calling stream; they are fresh for one read, as a stash would leave them."""
    debug = s.debug
    assert debug is not None, "graph_wrote reports in debug mode only"
    table = s.table
    names = tuple(f.name for f in table.fields if f.graph_written)
    debug.check_slots("graph_wrote", indices)
    debug.wrote("graph_wrote", indices, names, owners=owners)


def write_kept(
    buf: torch.Tensor | None,
    indices: torch.Tensor,
    value: torch.Tensor | None,
    carried: bool,
) -> bool:
    """The common case's write of an optional kept field: a value left out keeps the
    rows and the carried flag (Note [Left to others])."""
    if value is None:
        return carried
    if buf is not None:
        buf.index_copy_(0, indices, value)
    return True


def stash_partial(
    s: MapState,
    indices: torch.Tensor,
    values: Sequence[torch.Tensor | None],
    owners: Owners | None = None,
) -> None:
    """``stash_partial`` off the common case: the fields not kept, in declaration order;
    debug mode first checks every kept row still holds a value to keep."""
    table = s.table
    fields = [i for i in table.forward if not table.fields[i].kept]
    debug = s.debug
    if debug is not None and isinstance(indices, torch.Tensor) and indices.numel():
        # The slots first: one outside the pool is that, not a stale kept row.
        what = f"{table.owner}.stash_partial"
        first = table.what(fields[0]) if fields else table.owner
        write_slots(what, first, indices, s.pool_size, device=s.device)
        kept = [i for i in table.forward if table.fields[i].kept]
        debug.peek(
            "stash_partial",
            indices,
            {table.fields[i].name: s.buffers[i] for i in kept},
            carried={
                table.fields[i].name: s.carried[i] and s.buffers[i] is not None
                for i in kept
                if table.fields[i].optional or s.buffers[i] is None
            },
            stale="kept_stale",
            owners=owners,
        )
    _write(s, "stash_partial", fields, indices, values, owners)


# Note [Tails]
# ``resolve_tails`` builds every tail on a copy of the batch's own tensor or list, and
# rebinds the batch only once all are built, so a refusal leaves it as it was. A KV
# location is read from the table at column ``length + Tails.add - 1``: a column
# outside the row (``-1`` for a published length of 0 with nothing added would read
# the row's last column) or a slot past the table's rows is refused first. The check
# reads the columns on the host where they are there at no cost: on the CPU, and
# wherever the field's host copy was made (it is waited for anyway); elsewhere debug
# mode asserts them on the device.


def bind_tails(
    s: MapState, i: int, path: str, target: object, rows: torch.Tensor
) -> torch.Tensor:
    """A copy of ``target`` (``batch.<path>``) whose last ``len(rows)`` entries are
    ``rows``, cast to its dtype (the batch's own tensor may still be read by the step
    in flight); refused, naming it, if it is no tensor or too short (Note [Tails])."""
    n = rows.shape[0]
    if not isinstance(target, torch.Tensor):
        raise RelayError(
            f"{s.table.what(i)}: batch.{path} must be a tensor of the batch's rows, "
            f"its last {n} the decode rows resolve_tails binds (got a "
            f"{type(target).__name__}); set it before resolve_tails. Nothing was "
            "written"
        )
    if n > target.shape[0]:
        raise _short(s, i, path, n, target.shape[0], "tensor")
    bound = target.clone()
    bound[target.shape[0] - n :] = rows
    return bound


def bind_tail_list(
    s: MapState, i: int, path: str, target: object, rows: torch.Tensor
) -> list[int]:
    """A new list: ``target`` (``batch.<path>``) with its last ``len(rows)`` entries
    the host ``rows``; refused, naming it, if it is no list or too short."""
    n = rows.shape[0]
    if not isinstance(target, list):
        raise RelayError(
            f"{s.table.what(i)}: batch.{path} must be a list of the batch's rows, its "
            f"last {n} the decode rows resolve_tails binds (got a "
            f"{type(target).__name__}); set it before resolve_tails. Nothing was "
            "written"
        )
    if n > len(target):
        raise _short(s, i, path, n, len(target), "list")
    values: list[int] = rows.tolist()
    return [*target[: len(target) - n], *values]


def _short(s: MapState, i: int, path: str, n: int, given: int, kind: str) -> RelayError:
    return RelayError(
        f"{s.table.what(i)}: batch.{path} has {given} entries, but resolve_tails "
        f"binds {n} decode rows, the {kind}'s last rows; build the batch with its "
        "decode rows last. Nothing was written"
    )


def tail_locations(
    s: MapState,
    i: int,
    table: object,
    indices: torch.Tensor,
    columns: torch.Tensor,
    host: torch.Tensor | None,
    owners: Owners | None = None,
) -> torch.Tensor:
    """``table[indices, columns]``: each decode row's KV location, from field ``i``'s
    ``Tails.kv.table``; a column outside the row or a slot past the table's rows is
    refused first, naming the row (Note [Tails]), and its request where ``owners``
    name the batch's (one per batch row; the tails are the last rows). ``host`` is
    the field's host copy of the lengths, where it was made."""
    tails = s.table.fields[i].tails
    assert tails is not None and tails.kv is not None, "a field with tails_kv"
    what = f"{s.table.what(i)}: batch.{tails.kv.table}"
    if (
        not isinstance(table, torch.Tensor)
        or table.ndim != 2
        or table.device != columns.device
    ):
        got = (
            f"a tensor of shape {tuple(table.shape)} on {table.device}"
            if isinstance(table, torch.Tensor)
            else f"a {type(table).__name__}"
        )
        raise RelayError(
            f"{what} must be a 2-D tensor on {columns.device}, a row of KV locations "
            f"per slot, got {got}. Nothing was written"
        )
    rows, width = table.shape
    shift = tails.add - 1
    taken: list[int] | None = None
    if host is not None:
        taken = [x + shift for x in cast(list[int], host.tolist())]
    elif columns.is_cpu:
        taken = columns.tolist()
    if taken is not None:
        slots = cast(list[int], indices.tolist()) if indices.is_cpu else None
        for j, column in enumerate(taken):
            slot = slots[j] if slots is not None else int(indices[j])
            if not 0 <= column < width:
                row = f"decode row {j} (slot {slot}{_tail_owner(owners, j, taken)})"
                raise RelayError(
                    f"{what}: {row} would read column {column} "
                    f"of its {width} (a published length of {column - shift}, plus "
                    f"{tails.add}, minus 1): a length that points before the row or "
                    "past the table. Publish a length within the row (or add to it "
                    "with Tails(add=...)). Nothing was written"
                )
        for j, slot in enumerate(slots or ()):
            if not 0 <= slot < rows:
                raise RelayError(
                    f"{what}: decode row {j} is slot {slot}, but the table has {rows} "
                    "rows; give it a row per slot of the pool. Nothing was written"
                )
    elif s.debug is not None:
        torch._assert_async(
            ((columns >= 0) & (columns < width)).all(),
            f"{what}: a decode row's KV column is outside its row of {width}",
        )
        torch._assert_async(
            (indices < rows).all(), f"{what}: a slot is past the table's {rows} rows"
        )
    return table[indices, columns]


def _tail_owner(owners: Owners | None, j: int, tails: Sequence[object]) -> str:
    """``", request <id>"`` for decode row ``j`` of ``tails``, the batch's last rows,
    where ``owners`` name the batch's requests (and hold a row for it); else ``""``."""
    if owners is None:
        return ""
    rows = owners.reshape(-1).tolist() if isinstance(owners, torch.Tensor) else owners
    at = len(rows) - len(tails) + j
    return f", request {rows[at]!r}" if 0 <= at < len(rows) else ""


def read_tails(
    s: MapState, i: int, indices: torch.Tensor, owners: Owners | None = None
) -> None:
    """Debug mode: ``resolve_tails`` read rows ``indices`` of field ``i`` a second time.
    They must hold a value a reader may take, ordered after its publish; the read
    neither consumes nor poisons them (a schedule-side resolve may take them later).
    ``owners`` name the batch's requests, one per batch row: the tails are its last
    rows, so theirs are the last ones."""
    debug = s.debug
    assert debug is not None, "read_tails runs in debug mode only"
    name = s.table.fields[i].name
    debug.waited(None)
    tails = None
    if owners is not None:
        n = indices.numel()
        rows = owners.reshape(-1) if isinstance(owners, torch.Tensor) else owners
        tails = rows[len(rows) - n :] if len(rows) >= n else rows
    debug.peek(
        "resolve_tails", indices, {name: s.buffers[i]}, stale="stale_tail", owners=tails
    )
