"""Helpers the generated maps call. Small, typed, and free of device work when debug is off.

Generated modules import this module as ``_rt`` and nothing else from relay, so the
names here are part of the contract between the generator and the runtime.
"""

from __future__ import annotations

import ctypes
from typing import Any, TypeVar

import numpy
import torch

from relay.debug import DebugChecks, poison
from relay.debug.messages import text
from relay.device import CpuFence, Fence, HostMirror, new_fence
from relay.errors import RelayError, SlotError
from relay.fused import gather_rows, gather_rows_optional

__all__ = [
    "NO_ROWS",
    "SLOT_DTYPES",
    "CpuFence",
    "DebugChecks",
    "Fence",
    "HostMirror",
    "SlotsToken",
    "check_dim",
    "check_host_slots",
    "check_rows",
    "debug_class",
    "gather_rows",
    "gather_rows_optional",
    "gathered_slots",
    "guard_finite",
    "guard_non_negative",
    "guard_positive",
    "host_sum",
    "lazy_buffer",
    "never_stashed",
    "new_buffer",
    "new_fence",
    "slots_vouched",
    "write_slots",
]


def check_dim(owner: str, name: str, value: int) -> int:
    """A symbolic dim given to a constructor must be a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"{owner}: dim {name!r} must be a positive int (got {value!r} that is a "
            f"{type(value).__name__})"
        )
    return value


def new_buffer(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, debug: bool
) -> torch.Tensor:
    """A relay buffer: zeros, or poison in debug mode so an unwritten row is visible."""
    if debug:
        return torch.full(shape, poison(dtype), dtype=dtype, device=device)
    return torch.zeros(shape, dtype=dtype, device=device)


# Note [Checked values]
# Every stash and publish passes each value through check_rows before anything is
# written; it returns the value in the buffer's dtype, so the generated write is one
# ``index_copy_`` and a value already in that dtype (the common case) costs no ``.to``
# call at all (about as much Python time as the write itself at batch 1).
# With debug off, the generated method first tests the common case inline, one line
# per field (``v.dtype is not torch.int64 or v.shape != index_shape``, the indices'
# shape read once, plus the buffer's row dims), and calls check_rows only when it
# fails: a value that is no tensor (tested first, ``type(v) is not torch.Tensor``, as
# a list has no ``.dtype``; a tensor subclass takes the slow path), of another dtype or
# shape, or indices that are no tensor (``index_shape`` is then ``NO_ROWS``, which no
# shape equals). check_rows
# stays the one place that accepts, casts or refuses, so every refusal and message is
# the same in both shapes; float and bool indices are refused by ``write_slots``
# with the first field's name, before any write.

#: The ``index_shape`` of indices that are no tensor: no value's shape equals it.
NO_ROWS = torch.Size((-1,))


def lazy_buffer(
    what: str,
    pool_size: int,
    declared_row: tuple[int | None, ...],
    dtype: torch.dtype | None,
    first: torch.Tensor,
    debug: bool,
) -> torch.Tensor:
    """Allocate a lazy field from its first non-empty payload ``first``.

    ``check_rows`` has already accepted ``first`` against ``declared_row`` (fixed
    dims, ``None`` for symbolic ones) and ``dtype`` (``None``: taken from the payload).
    """
    row = tuple(first.shape[1:])
    return new_buffer((pool_size, *row), dtype or first.dtype, first.device, debug)


def _kind(dtype: torch.dtype) -> int:
    """0 bool, 1 integer, 2 floating, 3 complex: a cast to a lower kind loses values."""
    if dtype == torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


def check_rows(
    what: str,
    value: torch.Tensor,
    indices: torch.Tensor,
    buf: torch.Tensor | None,
    declared_row: tuple[int | None, ...] = (),
    declared_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``value`` ready to write into ``buf`` at ``indices`` (Note [Checked values]).

    It must hold one row per index, shaped like the buffer's rows (while a lazy buffer
    does not exist yet: like ``declared_row``, ``None`` matching any positive size), of
    a dtype that casts to the buffer's (or ``declared_dtype``) without losing values;
    it is cast only when its dtype differs.

    Types, shapes and dtypes only, no values: it dispatches no torch op. Without it, an
    indexed write would broadcast a (n, 1) tensor into (n, topk) rows, truncate floats
    stored into an integer field, or truncate float indices to slots, without a word.
    """
    try:
        if (
            buf is not None
            and value.dtype is buf.dtype
            and value.shape[1:] == buf.shape[1:]
            and value.shape[:1] == indices.shape
            and indices.dtype in SLOT_DTYPES
        ):
            return value  # the common case, kept cheap: it runs on every field written
    except AttributeError:
        pass  # a value or indices that is no tensor: _refuse_rows names it
    _refuse_rows(what, value, indices, buf, declared_row, declared_dtype)
    want = buf.dtype if buf is not None else declared_dtype
    return value if want is None else value.to(want)


#: Index dtypes a write takes as slots (``.long()`` keeps every value of them); a float
#: or bool index would be truncated to a slot, a complex one lose its imaginary part.
SLOT_DTYPES = frozenset(
    {
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    }
)


def _refuse_types(what: str, value: object, indices: object) -> None:
    """Raise unless ``value`` is a tensor and ``indices`` a tensor of integer slots."""
    if not isinstance(value, torch.Tensor):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise RelayError(
            f"{what}: got {shown} of type {type(value).__name__}, not a tensor; "
            "payload values and publish arguments are torch.Tensors with one row per "
            "slot (e.g. torch.as_tensor(values, device=...)). Nothing was written"
        )
    _refuse_indices(what, indices)


def _refuse_indices(what: str, indices: object) -> None:
    """Raise unless ``indices`` is a tensor of integer slots."""
    if not isinstance(indices, torch.Tensor):
        raise RelayError(
            f"{what}: indices must be a tensor of request-pool slots (got a "
            f"{type(indices).__name__}), e.g. torch.tensor(slots, device=...). Nothing "
            "was written"
        )
    if indices.dtype not in SLOT_DTYPES:
        raise RelayError(
            f"{what}: indices must be integer slots, got a {indices.dtype} tensor, which "
            "a write would truncate to slots (bool ones to slots 0 and 1); pass "
            "request-pool slots as int64 or int32. Nothing was written"
        )


def _refuse_dims(what: str, indices: torch.Tensor) -> None:
    """Raise unless ``indices`` is one slot per row."""
    if indices.dim() != 1:
        raise RelayError(
            f"{what}: indices must be one slot per row, a 1-D tensor (got shape "
            f"{tuple(indices.shape)})"
        )


def _refuse_rows(
    what: str,
    value: torch.Tensor,
    indices: torch.Tensor,
    buf: torch.Tensor | None,
    declared_row: tuple[int | None, ...],
    declared_dtype: torch.dtype | None,
) -> None:
    """The slow path of ``check_rows``: raise unless ``value`` is acceptable."""
    _refuse_types(what, value, indices)
    got = tuple(value.shape)
    slots = indices.numel()
    _refuse_dims(what, indices)
    if buf is not None:
        expected: tuple[int | str, ...] = (slots, *buf.shape[1:])
        ok = got == expected
    else:
        expected = (slots, *("?" if d is None else d for d in declared_row))
        ok = (
            len(got) == len(expected)
            and got[0] == slots
            and all(
                want is None or want == size
                for want, size in zip(declared_row, got[1:])
            )
        )
        if ok and slots > 0 and 0 in got[1:]:
            raise RelayError(
                f"{what}: the first payload has rows of shape {got[1:]}, with a zero-width "
                "dim; a lazy buffer takes its row shape from its first payload, so it would "
                "stay empty. Leave the field out (None) until its rows have a width"
            )
    if not ok:
        raise RelayError(
            f"{what}: got a tensor of shape {got} for {slots} slot(s); expected "
            f"{expected} (one row per index, rows as declared; '?' is any size)"
        )
    want = buf.dtype if buf is not None else declared_dtype
    if want is not None and _kind(value.dtype) > _kind(want):
        raise RelayError(
            f"{what}: got {value.dtype} values for a {want} field; the cast would drop "
            f"their fractional or imaginary part. Convert them first (e.g. .round().to({want}))"
        )


def never_stashed(owner: str, field: str) -> RelayError:
    """The error for resolving a required lazy field before its first stash."""
    return RelayError(
        f"{owner}.{field}: resolved before any stash allocated its buffer; "
        "stash a payload carrying it (the forward that produced the rows) first"
    )


# Note [Slots on the host]
# On the CPU an indexed write checks each index as it goes, so a slot outside the pool
# would leave the rows before it written and the fields after it not: a half-written
# stash. With debug off, the generated writes of a CPU map first read the slots on the
# host, where they already are, without dispatching an op (``Tensor.numpy()`` would
# dispatch a ``detach``): up to ``HOST_SLOTS_IN_PYTHON_MAX`` slots as a list (about
# 1 us), above it a numpy view of the index memory read as unsigned, so that a
# negative slot is a huge one and one ``argmax`` catches both ends (about 2.5 us at
# any batch size). A write skips it for the very tensor the map's latest
# ``resolve_future`` gathered with, unchanged since (Note [Vouched slots]): that
# ``index_select`` already refused any slot outside the pool (on the CPU it checks
# every index before it writes its output), and an engine stashes and publishes with
# the batch's slots tensor it resolved, so a steady overlap loop pays nothing.
# Inference tensors keep no version counter, so for them the check always runs; so
# does it after a change torch cannot see (through ``.numpy()`` or a raw pointer),
# which is the one way left to slip a bad slot past it. On CUDA a bad slot
# is a device-side assert, which ends the process's CUDA context; checking first would
# need a host sync, so there only debug mode checks (``DebugChecks.check_slots``, on
# the device).

# Per index dtype: the unsigned C and numpy types to read it as, and the numpy type it is.
_UNSIGNED: dict[
    torch.dtype, tuple[type[ctypes._SimpleCData[int]], type[Any], type[Any]]
] = {
    torch.int64: (ctypes.c_uint64, numpy.uint64, numpy.int64),
    torch.int32: (ctypes.c_uint32, numpy.uint32, numpy.int32),
    torch.int16: (ctypes.c_uint16, numpy.uint16, numpy.int16),
    torch.int8: (ctypes.c_uint8, numpy.uint8, numpy.int8),
    torch.uint8: (ctypes.c_uint8, numpy.uint8, numpy.uint8),
}


SlotsToken = tuple[torch.Tensor, int]


# Note [Vouched slots]
# With debug off, ``resolve_future`` remembers the vector of slots it gathered with
# and its version (``_gathered``, ``_gathered_version``): its ``index_select`` refused
# any slot outside the pool, and the tensor held at least one slot. A write given that
# very tensor, unchanged since, indexes with it as is (one identity and one version
# test; the checked path also tests for int64, where the fast path of Note [Fast
# writes] leaves another index dtype to ``index_copy_``, which refuses it before
# writing); any other goes through ``write_slots``, which does everything the vouched
# tensor is known to pass. An inference tensor keeps no version counter (reading it
# raises RuntimeError), so it is never vouched for and always checked. A 0-dim slots
# tensor is not vouched for either: the fast path's tests take a vector of slots.


# Note [Fast writes]
# With debug off, a write given the slots ``resolve_future`` vouched for (Note [Vouched
# slots]) first tries a fast path: the tests that let its writes run as they are, the
# writes, return. Its first write (a required eager field) is tested for its number of
# dims only: ``index_copy_`` itself refuses another dtype or shape before it writes
# anything, and the dims test refuses the one shape it would take that the checked path
# does not (a 0-dim value for one slot). Every later field is tested whole (dtype and
# shape), so once a write has run, none after it can be refused. Anything else, a
# failed test or an error (a value that is no tensor, a dtype to cast: the
# AttributeError, TypeError, IndexError or RuntimeError that torch raises before it
# writes), goes on to the checked path (Note [Checked values]), which refuses it with
# relay's message or casts and writes every field again: writing the same rows twice
# leaves what one write would. The fast path saves the index shape read and row test of the first field and
# the no-tensor tests, about 0.5 us of a 2-3 us write at batch 1.


def write_slots(
    what: str, first: str, indices: torch.Tensor, pool_size: int
) -> torch.Tensor | None:
    """The slots a write indexes with, for indices ``resolve_future`` did not vouch
    for (Note [Vouched slots]): ``None`` for zero slots (nothing to write), else int64
    slots, checked on the host on the CPU (Note [Slots on the host]). Refuses
    indices that are no tensor of integers, named as the field ``first``'s, before any
    write."""
    if type(indices) is not torch.Tensor or indices.dtype not in SLOT_DTYPES:
        _refuse_indices(first, indices)
    if indices.numel() == 0:
        return None
    if indices.is_cpu:
        check_host_slots(what, indices, pool_size)
    return indices if indices.dtype is torch.int64 else indices.long()


# ``gathered_slots`` and ``slots_vouched`` are what modules generated by an earlier relay
# call (before Note [Vouched slots]); kept so such a module still runs until it is
# regenerated.


def gathered_slots(indices: torch.Tensor) -> SlotsToken | None:
    """What ``resolve_future`` remembers of the slots it gathered with, for
    ``slots_vouched`` (Note [Slots on the host]); ``None`` off the CPU, where no write
    checks its slots, and for an inference tensor, which keeps no version counter."""
    if not indices.is_cpu or indices.is_inference():
        return None
    return indices, indices._version


def slots_vouched(token: SlotsToken | None, indices: torch.Tensor) -> bool:
    """Whether ``indices`` is the tensor ``token`` remembers, unchanged since."""
    return token is not None and token[0] is indices and token[1] == indices._version


#: Up to this many slots, ``check_host_slots`` reads them as a list: half the time of
#: the numpy view at batch 1, the latency case overlap scheduling exists for.
HOST_SLOTS_IN_PYTHON_MAX = 16


def check_host_slots(what: str, indices: torch.Tensor, pool_size: int) -> None:
    """Refuse a slot outside ``[0, pool_size)`` in host ``indices`` before any write
    (Note [Slots on the host]). Other index dtypes are left to torch, which refuses
    them before it writes anything."""
    if indices.dim() != 1:
        return  # one 0-dim slot is written whole or refused; torch refuses more dims
    n = indices.numel()
    if n <= HOST_SLOTS_IN_PYTHON_MAX:
        values = indices.tolist()
        if not values or (min(values) >= 0 and max(values) < pool_size):
            return
    kinds = _UNSIGNED.get(indices.dtype)
    if kinds is None:
        return
    c_type, np_type, own_type = kinds
    if indices.is_contiguous():
        # A buffer numpy reads without a copy (typed Any: numpy's stubs omit ctypes).
        memory: Any = (c_type * n).from_address(indices.data_ptr())
        wide = numpy.frombuffer(memory, dtype=np_type)
    else:
        wide = indices.numpy().view(np_type)
    at = int(wide.argmax())
    if int(wide[at]) >= pool_size:
        raise SlotError(
            f"{what}: slot {int(wide.view(own_type)[at])} at position {at} is outside "
            f"the pool [0, {pool_size}); slots are request-pool indices of this map (a "
            "negative slot would wrap around). Nothing was written"
        )


#: Up to this many values, ``host_sum`` adds integers in Python, a fifth of the time of
#: ``int(values.sum())`` at batch 1; above it numpy adds them, in about the time of
#: torch's ``sum`` and its ``item`` (0.25 us more at batch 256 on the development
#: machine) but with no op dispatched: the sum of a host mirror is host arithmetic, and
#: a step dispatches no more ops than the hand-written map's (issue 17).
HOST_SUM_IN_PYTHON_MAX = 64


def host_sum(values: torch.Tensor) -> int:
    """The sum of a host tensor of integers as an ``int`` (a float sum is truncated)."""
    if values.is_floating_point() or values.is_complex():
        return int(values.sum())
    if values.numel() <= HOST_SUM_IN_PYTHON_MAX:
        return sum(values.tolist())
    return int(values.numpy().sum())


# Note [Guards in debug mode]
# A guard is three device ops (compare, all, assert) per field per write; sglang runs
# such checks only in its CI mode. Generated maps call these helpers only when built
# with debug=True, so a map with debug off dispatches only the ops its work needs.


# Note [Two shapes]
# A generated map is two classes: the public one runs its work alone (debug off); a
# private subclass runs the same work inside debug mode's checks. A map built with
# debug=True becomes an instance of the subclass in its constructor, so no method
# runs a debug branch with debug off (relay/codegen/methods.py builds both bodies).

_DEBUG_CLASSES: dict[tuple[type, type], type] = {}

_MapT = TypeVar("_MapT")


def debug_class(cls: type[_MapT], debug: type[_MapT]) -> type[_MapT]:
    """The class a map of class ``cls`` built with ``debug=True`` becomes: the generated
    ``debug`` subclass, or, for an engine's own subclass of the map, one class deriving
    from both (its overrides run around the debug-mode methods), made once."""
    if issubclass(cls, debug):
        return cls
    if debug.__bases__ == (cls,):
        return debug
    key = (cls, debug)
    both = _DEBUG_CLASSES.get(key)
    if both is None:
        attributes = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        both = _DEBUG_CLASSES[key] = type(cls.__name__, (cls, debug), attributes)
    return both


# A guard on a floating field lets NaN through: it is not a value below the bound, and
# a written value is handed over as written; only Guard.FINITE refuses NaN and inf.
def guard_non_negative(value: torch.Tensor, what: str) -> None:
    """Assert ``value >= 0`` on the device, without a host sync (debug mode); NaN passes."""
    ok = (value < 0).logical_not_() if value.dtype.is_floating_point else value >= 0
    torch._assert_async(ok.all(), text("guard_non_negative_summary", what=what))


def guard_positive(value: torch.Tensor, what: str) -> None:
    """Assert ``value > 0`` on the device, without a host sync (debug mode); NaN passes."""
    ok = (value <= 0).logical_not_() if value.dtype.is_floating_point else value > 0
    torch._assert_async(ok.all(), text("guard_positive_summary", what=what))


def guard_finite(value: torch.Tensor, what: str) -> None:
    """Assert no NaN or infinity in ``value`` on the device, without a host sync (debug
    mode)."""
    torch._assert_async(
        torch.isfinite(value).all(), text("guard_finite_summary", what=what)
    )
