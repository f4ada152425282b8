"""What generated maps call: the field table, and every path that is not the common case.

A generated method is one body: cheap pre-tests, then its torch calls, one line per
field (Note [One body] below). Everything else, refusals with relay's messages, casts,
lazy allocation, debug mode, is here, generic, driven by the map's ``Table`` of
``Column``s that the generator emits once per module. Generated modules import this
module as ``_rt`` and nothing else from relay, so its names are the contract between
the generator and the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from relay.debug import DebugChecks, poison
from relay.debug.messages import text
from relay.debug.owners import Owners
from relay.device import CpuFence, Fence, HostMirror, new_fence
from relay.errors import RelayError, SlotError
from relay.fused import gather_rows, gather_rows_optional
from relay.schema import Lane

__all__ = [
    "FORWARD",
    "SCHEDULE",
    "SLOT_DTYPES",
    "Column",
    "CpuFence",
    "DebugChecks",
    "Fence",
    "HostMirror",
    "Owners",
    "Seed",
    "Table",
    "apply_seeds",
    "check_dim",
    "check_rows",
    "debug_checks",
    "fits",
    "fits_optional",
    "gather_optional",
    "gather_rows",
    "gather_rows_optional",
    "guard_finite",
    "guard_non_negative",
    "guard_positive",
    "host_sum",
    "lazy_buffer",
    "never_stashed",
    "new_buffer",
    "new_fence",
    "parent_is_none",
    "publish",
    "read_back",
    "seed",
    "stash",
    "write_optional",
    "write_rows",
    "write_slots",
]

FORWARD = Lane.FORWARD
SCHEDULE = Lane.SCHEDULE

#: A guard: checks a value about to be written, in debug mode (``guard_*`` below).
GuardFn = Callable[[torch.Tensor, str], None]


# Note [One body]
# A generated write tests, inline, that the call is the common case: debug off, slots
# the map may index with as they are (``write_rows``), and every value a tensor of the
# declared dtype and shape. Then each field's write is one ``index_copy_`` that cannot
# fail, so a call is all or nothing. A required eager first field is tested for its
# number of dims only: its own ``index_copy_`` refuses another dtype or shape before it
# writes anything, and the write goes on to the checked path then, as it does for a
# value that is no tensor. Anything else goes to ``stash`` or ``publish``
# here, which check, refuse, cast, allocate and run debug mode's bookkeeping, field by
# field from the table. The resolves have no second path: they read the same rows
# either way, and in debug mode they also report what they read (``read_back``).


@attrs.frozen
class Column:
    """One field of a map, as the generic paths need it."""

    name: str
    lane: Lane
    #: ``None``: taken from the first payload that carries the field.
    dtype: torch.dtype | None
    #: Row dims: ints, and the names of symbolic dims (any size until allocated).
    row: tuple[int | str, ...] = ()
    lazy: bool = False
    optional: bool = False
    #: The payload attribute (or publish argument) the value comes from.
    source: str = attrs.field(
        default=attrs.Factory(lambda self: self.name, takes_self=True)
    )
    #: Where a resolve hands the rows, for messages and readers of the table.
    target: str | None = None
    guard: GuardFn | None = None
    #: Rows never written read as zeros, in debug mode too (a legal read there).
    zeros: bool = False
    #: The resolve that reads the field: ``resolve_future``, or a schedule-side one.
    reader: str = "resolve_future"
    #: Resolved by placeholder substitution (debug mode reports those rows itself).
    placeholder: bool = False

    @property
    def buf(self) -> str:
        return f"{self.name}_buf"

    @property
    def declared_row(self) -> tuple[int | None, ...]:
        return tuple(d if isinstance(d, int) else None for d in self.row)


class Table:
    """A map's fields in declaration order, split by lane."""

    def __init__(
        self, owner: str, columns: tuple[Column, ...], *, seeded: bool = False
    ) -> None:
        self.owner = owner
        self.columns = columns
        #: The map has ``seed`` (Note [Seeds]).
        self.seeded = seeded
        self.forward = tuple(c for c in columns if c.lane is Lane.FORWARD)
        #: In ``publish``'s parameter order: required fields first.
        self.schedule = tuple(
            sorted(
                (c for c in columns if c.lane is Lane.SCHEDULE),
                key=lambda c: c.optional,
            )
        )

    def what(self, column: Column) -> str:
        return f"{self.owner}.{column.name}"


def check_dim(table: Table, name: str, value: int) -> int:
    """A dim given to a constructor must be a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"{table.owner}: dim {name!r} must be a positive int (got {value!r} that is "
            f"a {type(value).__name__})"
        )
    return value


def new_buffer(
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


def debug_checks(
    table: Table, device: torch.device, pool_size: int, debug: bool
) -> DebugChecks | None:
    """Debug mode's checker for a map of ``table``; ``None`` with debug off."""
    if not debug:
        return None
    schedule = [c for c in table.columns if c.lane is Lane.SCHEDULE]
    return DebugChecks(
        device,
        pool_size,
        table.owner,
        forward=tuple(c.name for c in table.forward),
        schedule=tuple(c.name for c in schedule),
        consumers=tuple(dict.fromkeys(c.reader for c in schedule)),
        initial_zeros=tuple(c.name for c in table.columns if c.zeros),
        seeds=tuple(c.name for c in table.forward) if table.seeded else (),
    )


# --- the common case's gate --------------------------------------------------------------

_INT64 = torch.int64  # a module constant: reading torch.int64 costs an attribute lookup


# Note [Gathered slots]
# On the CPU an indexed write checks each index as it goes, so a slot outside the pool
# would leave some rows written: the slots must be checked first. ``resolve_future``'s
# ``index_select`` checks every slot before it writes anything, and an engine writes
# with the very slots tensor it resolved; ``resolve_future`` remembers that tensor
# (``_gathered``, a plain attribute store), and a write given it takes it as it is
# while its version counter is still 0: no in-place change since it was made, so none
# since the resolve. A tensor changed in place at any time (a persistent slots
# buffer), and any other tensor, is read on the host once, as a list
# (``Tensor.numpy`` would dispatch a view op). On CUDA a bad slot is a device-side
# assert whatever relay does, and a host check would be a sync: there only debug
# mode checks slots.


def write_rows(m: Any, indices: torch.Tensor) -> tuple[int, ...] | None:
    """``(n,)`` when a write of map ``m`` may index with ``indices`` as they are: debug
    off, int64 slots, in the pool (Note [Gathered slots]), at least one. Else ``None``,
    and the write takes the checked path."""
    try:
        if (
            indices is m._gathered  # never set in debug mode
            and indices._version == 0
            and indices.dtype is _INT64
        ):
            return (indices.numel(),)  # a 0-dim slot: one row, as index_copy_ takes it
    except RuntimeError:  # an inference tensor keeps no version counter
        pass
    if (
        m._debug is not None
        or type(indices) is not torch.Tensor
        or indices.dtype is not _INT64
        or indices.ndim != 1
    ):
        return None
    n = indices.shape[0]
    if n == 0 or (
        indices.is_cpu
        and (n > HOST_SLOTS_IN_PYTHON_MAX or not host_slots_ok(indices, m.pool_size))
    ):
        return None  # more slots are read on the host once, by the checked path
    return (n,)


#: Up to this many slots that no resolve gathered with, the gate reads them itself.
HOST_SLOTS_IN_PYTHON_MAX = 16


def host_slots_ok(slots: torch.Tensor, pool_size: int) -> bool:
    """Whether every slot of host ``slots`` is in the pool: read as a list, since
    ``Tensor.numpy`` would dispatch a view op."""
    values = _host_values(slots)
    return min(values) >= 0 and max(values) < pool_size


def _host_values(slots: torch.Tensor) -> list[int]:
    values = slots.tolist()  # no op dispatched; an int for a 0-dim slot
    return values if isinstance(values, list) else [values]


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


def fits(value: object, buf: torch.Tensor | None, index_shape: tuple[int, ...]) -> bool:
    """The gate's test of a lazy field's value: a tensor of its buffer's dtype with one
    buffer row per slot (no buffer yet: the checked path makes it)."""
    if buf is None or type(value) is not torch.Tensor or value.dtype is not buf.dtype:
        return False
    shape = value.shape
    return shape[1:] == buf.shape[1:] and shape[:1] == index_shape


def fits_optional(
    value: object, buf: torch.Tensor | None, index_shape: tuple[int, ...]
) -> bool:
    """``fits`` for an optional field, whose value may be left out (``None``); spelled
    out, not calling ``fits``: a call per field is what the gate saves."""
    if value is None:
        return True
    if buf is None or type(value) is not torch.Tensor or value.dtype is not buf.dtype:
        return False
    shape = value.shape
    return shape[1:] == buf.shape[1:] and shape[:1] == index_shape


def gather_optional(
    buf: torch.Tensor | None, carried: bool, indices: torch.Tensor, flat: bool = False
) -> torch.Tensor | None:
    """An optional field's rows (``flat``: flattened), or ``None`` where the latest
    write left it out."""
    if not carried or buf is None:
        return None
    rows = buf.index_select(0, indices)
    return rows.flatten() if flat else rows


# --- the checked path ----------------------------------------------------------------------


def stash(
    m: Any,
    table: Table,
    indices: torch.Tensor,
    payload: object,
    owners: Owners | None = None,
) -> None:
    """``stash`` off the common case (Note [One body])."""
    values = [getattr(payload, c.source) for c in table.forward]
    _write(m, table, "stash", table.forward, indices, values, owners)


def publish(
    m: Any,
    table: Table,
    indices: torch.Tensor,
    values: Sequence[torch.Tensor | None],
    owners: Owners | None = None,
) -> None:
    """``publish`` off the common case: the values in ``table.schedule``'s order."""
    if not _write(m, table, "publish", table.schedule, indices, values, owners):
        return
    if m._debug is not None:
        m._debug.publishing()
    m._fence.record()


def _write(
    m: Any,
    table: Table,
    op: str,
    columns: Sequence[Column],
    indices: torch.Tensor,
    given: Sequence[torch.Tensor | None],
    owners: Owners | None = None,
) -> bool:
    """Every check before any write, so a refused call leaves the map as it was;
    whether there was a row to write."""
    values = _checked(m, table, op, columns, indices, given)
    if values is None:
        return False
    slots, checked = values
    _apply(m, op, columns, slots, checked, owners)
    return True


def _apply(
    m: Any,
    op: str,
    columns: Sequence[Column],
    slots: torch.Tensor,
    values: Sequence[torch.Tensor | None],
    owners: Owners | None,
) -> None:
    """Write checked ``values`` into rows ``slots``, then debug mode's record of it."""
    debug: DebugChecks | None = m._debug
    for c, value in zip(columns, values):
        _write_column(m, c, slots, value, debug is not None)
    if debug is None:
        return
    carried = {c.name: v is not None for c, v in zip(columns, values) if c.optional}
    names = tuple(c.name for c in columns)
    if op == "seed":
        debug.seeded(slots, names, carried=carried, owners=owners)
    else:
        debug.wrote(op, slots, names, carried=carried, owners=owners)


def _checked(
    m: Any,
    table: Table,
    op: str,
    columns: Sequence[Column],
    indices: torch.Tensor,
    given: Sequence[torch.Tensor | None],
) -> tuple[torch.Tensor, list[torch.Tensor | None]] | None:
    """The int64 slots and the values ready to write, or ``None`` for zero slots;
    refuses what cannot be written, naming it."""
    values = [
        None
        if value is None and c.optional
        else check_rows(
            table.what(c), value, indices, getattr(m, c.buf), c.declared_row, c.dtype
        )
        for c, value in zip(columns, given)
    ]
    debug: DebugChecks | None = m._debug
    first = table.what(columns[0]) if columns else table.owner
    slots = write_slots(
        f"{table.owner}.{op}", first, indices, m.pool_size, host=debug is None
    )
    if slots is None:
        return None
    if debug is not None:
        debug.check_slots(op, indices, scratch_ok=op != "seed")
        for c, value in zip(columns, values):
            if c.guard is not None and value is not None:
                c.guard(value, table.what(c))
    return slots, values


def _write_column(
    m: Any,
    c: Column,
    slots: torch.Tensor,
    value: torch.Tensor | None,
    debug: bool,
) -> None:
    buf: torch.Tensor | None = getattr(m, c.buf)
    if c.optional:
        setattr(m, f"_{c.name}_carried", value is not None)
    if value is None:  # an optional field left out: Note [Optional fields]
        if buf is not None:
            buf.index_fill_(0, slots, 0)
        return
    if buf is None:
        buf = lazy_buffer(
            m.pool_size, c.dtype, value[(0,) * slots.ndim], debug, c.zeros
        )
        setattr(m, c.buf, buf)
    buf.index_copy_(0, slots, value)


#: What ``seed`` took: the slots, the values, and the owners, for ``apply_seeds``.
Seed = tuple[torch.Tensor, list[torch.Tensor | None], "Owners | None"]


# Note [Seeds]
# A request prefilled elsewhere starts with no forward of its own, so the scheduler
# hands its first values to the map: ``seed``. A finished request's last forward may
# still be in flight on the same row and stash there after the scheduler seeded it;
# so ``seed`` checks and copies the values and only queues them, and the next
# ``resolve_future``, which runs on the forward stream after every forward before it,
# writes them first. That orders the seed after the in-flight stash on every device
# policy, with no fence of its own.


def seed(
    m: Any,
    table: Table,
    indices: torch.Tensor,
    payload: object,
    owners: Owners | None = None,
) -> None:
    """``seed``: check the rows now, queue copies for the next ``resolve_future``."""
    given = [getattr(payload, c.source) for c in table.forward]
    checked = _checked(m, table, "seed", table.forward, indices, given)
    if checked is not None:
        slots, values = checked
        copies = [None if v is None else v.clone() for v in values]
        m._seeds.append((slots.clone(), copies, owners))


def apply_seeds(m: Any, table: Table) -> None:
    """Write the queued seeds, oldest first (on the forward stream, in resolve_future)."""
    while m._seeds:
        slots, values, owners = m._seeds.pop(0)
        _apply(m, "seed", table.forward, slots, values, owners)


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
    return new_buffer(
        (pool_size, *row), dtype or first.dtype, first.device, debug, zeros
    )


def check_rows(
    what: str,
    value: object,
    indices: object,
    buf: torch.Tensor | None,
    declared_row: tuple[int | None, ...] = (),
    declared_dtype: torch.dtype | None = None,
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
    if buf is not None and value.device != buf.device:
        raise RelayError(
            f"{what}: got a tensor on {value.device} for a map on {buf.device}; move "
            f"it first (.to({str(buf.device)!r})). Nothing was written"
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


def _refuse_indices(what: str, indices: object) -> torch.Tensor:
    """``indices`` if they are one integer slot per row; else refuse them."""
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
    return indices


def write_slots(
    what: str, first: str, indices: object, pool_size: int, *, host: bool = True
) -> torch.Tensor | None:
    """The int64 slots a checked write indexes with, ``None`` for none. Refuses, named
    as field ``first``, indices that are no vector of integer slots and, on the host
    where ``host`` (debug mode checks slots itself), a slot outside the pool."""
    slots = _refuse_indices(first, indices)
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
    m: Any,
    table: Table,
    op: str,
    indices: torch.Tensor,
    owners: Owners | None = None,
    absent: tuple[str, ...] = (),
) -> None:
    """Debug mode: ``op`` gathered rows ``indices`` of its fields (optional ones only
    where the latest write carried them; none under the optional parents ``absent``,
    which the batch lacked): checked fresh, then poisoned again."""
    debug: DebugChecks = m._debug
    columns = [
        c
        for c in table.columns
        if c.reader == op
        and c.target is not None
        and not c.placeholder
        and c.target.split(".")[0] not in absent
    ]
    buffers = {c.name: getattr(m, c.buf) for c in columns}
    carried = {c.name: getattr(m, f"_{c.name}_carried") for c in columns if c.optional}
    debug.read(op, indices, buffers, carried=carried, owners=owners)


#: Up to this many values, ``host_sum`` adds integers in Python; above it numpy does,
#: with no torch op dispatched.
HOST_SUM_IN_PYTHON_MAX = 64


def host_sum(values: torch.Tensor) -> int:
    """The sum of a host tensor as an ``int`` (a float sum is truncated)."""
    if values.is_floating_point() or values.is_complex():
        return int(values.sum())
    if values.numel() <= HOST_SUM_IN_PYTHON_MAX:
        return sum(values.tolist())
    return int(values.numpy().sum())


# Note [Guards in debug mode]
# Guards run in debug mode only: three device ops (compare, all, assert) per field per
# write, and no host sync. A guard on a floating field lets NaN through (it is not a
# value below the bound); only guard_finite refuses NaN and infinities. A Guard kind
# is its member in relay/schema.py, its rule in relay/codegen/validate.py and its
# ``guard_<value>`` here, which the generated table names.


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
