"""Debug mode of the generated maps: what each method reports to ``DebugChecks``, and the
happens-before checker behind it.

The contract
------------
The generator and the debug runtime meet here: the generated code calls exactly these
methods, and only when the map was built with ``debug=True`` (``self._debug`` is
``None`` otherwise, so debug off costs one attribute test per method). The bookkeeping
behind them is free to change.

Per method, in this order, one report of its lane work (not one per field), so that the
checks of a method are a fixed number of ops whatever its field count (Note [Debug state
table]):

- ``stash`` / ``publish``: ``check_slots`` (before anything is written), the writes, then
  one ``wrote(op, indices, fields, carried=...)`` naming every field written, ``carried``
  saying for each optional one whether this call carried it (one left out is marked
  omitted); ``publish`` calls ``publishing`` right before its fence record.
- ``invalidate``: ``check_slots(..., scratch_ok=False)`` before the placeholders.
- ``resolve_future``: ``check_slots``, the gathers, then one ``read(op, indices,
  buffers, carried=...)`` of every gathered field (``buffers``: field name -> buffer,
  whose rows read are poisoned; ``carried``: whether each optional one was read), and
  one ``read`` per placeholder field with its own rows and ``taken`` mask.
- schedule resolves: the fence wait, ``waited``, ``check_slots``, the gather, ``read``.
- ``release``: ``release``.

What debug mode checks (see docs/debugging.md for every message)
-----------------------------------------------------------------
- Slots: in range, row 0 only where padding may point at it, no slot twice in a batch.
- Freshness: each row of each field has a state kept apart from its values (never
  written, written, consumed, omitted), so every legal value is accepted, NaN and -1
  included, and each written value is read exactly once. Rows read are filled with
  ``poison(dtype)`` again, so a stray read outside the map still looks wrong.
- Release: ``release`` marks the slots' unread values stale; a value written for the
  slot's previous request is never handed to the next one.
- Fence freshness: each schedule-side resolve waits on a publish made since its last wait.
- Happens-before (Note [Happens-before in debug mode]): every write and read of a row is
  stamped with its stream and that stream's vector clock; a read not ordered after the
  write it reads, or two unordered writes of one row, is reported.

Checks run on the device where they can (``torch._assert_async``, no host sync). On the
CPU, where a check costs no sync, a failure raises ``DebugCheckFailed`` (a
``RelayDebugError``) naming the field, the slot and the operations; on other devices the
device-side assert carries the fields of the call, the operation and the streams.

Engines report their own stream waits and event synchronizes with ``record_event``,
``wait_event``, ``synchronize_event``, ``wait_stream`` and ``synchronize_stream``;
``check_resolved`` checks a placeholder target before a host consumer reads it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from relay import cpu_stream
from relay.cpu_stream import CpuEvent, ThreadStream, current_cpu_stream
from relay.device import CpuPolicy, policy_for
from relay.errors import RelayDebugError

__all__ = [
    "DebugCheckFailed",
    "DebugChecks",
    "check_resolved",
    "disable_happens_before",
    "enable_happens_before",
    "happens_before_enabled",
    "poison",
    "record_event",
    "synchronize_event",
    "synchronize_stream",
    "wait_event",
    "wait_stream",
]


class DebugCheckFailed(RelayDebugError, RuntimeError):
    """A debug check on slots or rows failed (on the CPU, where the check names the slot).

    Also a ``RuntimeError``: on other devices the same check is a device-side assert,
    which surfaces as a ``RuntimeError``, so one ``except`` covers both.
    """


def poison(dtype: torch.dtype) -> float | int | bool:
    """What unconsumed rows hold in debug mode, so a stray read still looks wrong.

    NaN for floats, -1 for signed ints, the largest value for unsigned ones, ``True``
    for bool. Only a visual aid: freshness is tracked apart from the values.
    """
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    if dtype.is_signed:
        return -1
    return int(torch.iinfo(dtype).max)


# --------------------------------------------------------------------------------------
# The happens-before checker
# --------------------------------------------------------------------------------------

# Note [Happens-before in debug mode]
# Each stream is an actor with a vector clock (actor -> count of its operations that
# this actor is known to follow). Actors: a CUDA (or other device) stream, a CPU
# ThreadStream, and a host thread (synchronous CPU work). Edges:
# - program order: an actor's own operations are ordered (forward-lane reads on the
#   writer's stream need nothing else);
# - launch: work a host thread enqueues on a device stream follows what that thread
#   knew when it enqueued; a ThreadStream task follows what its submitter knew;
# - events: a record snapshots the recording actor's clock (a new record replaces the
#   old one, as on CUDA); a wait joins that snapshot into the waiter;
# - joins: a host that waited for a ThreadStream task, a stream or an event joins the
#   clock the stream had there.
# The relay's fence is one of those events. On the CPU the checker sees the fence's
# CpuEvent records and waits themselves (CpuEvents report to it), so a fence that
# skips its chain wait or a resolve that skips its wait is caught. Elsewhere events are
# the device's own, and the fence is modelled from ``publishing``/``waited``: a record
# chained as Note [Fence chaining] prescribes, and a wait. Engines report their own
# waits with ``record_event``/``wait_event``/``synchronize_event``/``wait_stream``/
# ``synchronize_stream``. The model is strict: it assumes CUDA's semantics everywhere,
# so a CPU run catches what would race on a GPU.

_Clock = dict[int, int]


def _join(into: _Clock, other: _Clock) -> bool:
    """``into`` becomes the pointwise max of both; whether it changed."""
    changed = False
    for actor, count in other.items():
        if into.get(actor, 0) < count:
            into[actor] = count
            changed = True
    return changed


#: A stream's own entry in the vectors checks compare against: its own writes are
#: always ordered before its reads (program order). Entry 0 of every vector holds it
#: too: writer 0 is "no writer", always seen (Note [Debug state table]).
_OWN = 2**62


class _Checker:
    """The process-wide vector clocks. Every method takes the one lock."""

    def __init__(self) -> None:
        self.enabled = False
        self.refused = False  # disable_happens_before() was called
        self.lock = threading.Lock()
        self.ids: dict[Hashable, int] = {}
        self.names: list[str] = []
        self.clocks: list[_Clock] = []
        self.device_actor: list[bool] = []  # enqueued by a host thread (launch edges)
        # What an actor learned from others changes only at joins: the vector tensors
        # reads compare against are cached per (actor, device) until the next one.
        self.learned: list[int] = []
        self._vectors: dict[
            tuple[int, torch.device], tuple[int, int, torch.Tensor]
        ] = {}
        self._events: weakref.WeakKeyDictionary[Any, _Clock] = (
            weakref.WeakKeyDictionary()
        )
        self._strong_events: dict[int, tuple[Any, _Clock]] = {}

    # -- actors ----------------------------------------------------------------
    def _actor(self, stream: Any) -> int:
        """The actor id of ``stream`` (``None``: the calling host thread); lock held."""
        key: Hashable
        if stream is None:
            key = ("host", threading.get_ident())
        elif isinstance(stream, ThreadStream):
            key = ("thread-stream", stream.serial)
        else:
            stream_id = getattr(stream, "stream_id", None)
            key = (
                (
                    getattr(stream, "device_type", "?"),
                    getattr(stream, "device_index", -1),
                    stream_id,
                )
                if stream_id is not None
                else ("stream", id(stream))
            )
        actor = self.ids.get(key)
        if actor is None:
            # The name only now: the checks run this per operation.
            if stream is None:
                name = f"host thread {threading.current_thread().name!r}"
            elif isinstance(stream, ThreadStream):
                name = repr(stream)
            else:
                name = f"stream {stream!r}"
            actor = self.ids[key] = len(self.names)
            self.names.append(name)
            self.clocks.append({actor: 0})
            self.device_actor.append(key[0] not in ("host", "thread-stream"))
            self.learned.append(0)
        if self.device_actor[actor]:
            # Launch edge: the work enqueued now follows what the enqueuing thread knows.
            self.merge(actor, self.clocks[self._actor(current_cpu_stream())])
        return actor

    def merge(self, actor: int, clock: _Clock) -> None:
        """Join ``clock`` into ``actor``'s; lock held."""
        if _join(self.clocks[actor], clock):
            self.learned[actor] += 1

    def name(self, actor: int) -> str:
        return self.names[actor]

    # -- operations ------------------------------------------------------------
    def tick(self, stream: Any, device: torch.device) -> tuple[int, int, torch.Tensor]:
        """An operation of ``stream``: (actor, its clock now, its vector on ``device``,
        indexed by actor + 1, with entry 0 and its own entry ``_OWN``)."""
        with self.lock:
            actor = self._actor(stream)
            clock = self.clocks[actor]
            clock[actor] += 1
            key = (actor, device)
            cached = self._vectors.get(key)
            n = len(self.names)
            if cached is None or cached[0] != self.learned[actor] or cached[1] != n:
                values = [_OWN, *(clock.get(a, 0) for a in range(n))]
                values[actor + 1] = _OWN
                cached = self._vectors[key] = (
                    self.learned[actor],
                    n,
                    _vector(values, device),
                )
            return actor, clock[actor], cached[2]

    def snapshot(self, stream: Any) -> _Clock:
        with self.lock:
            return dict(self.clocks[self._actor(stream)])

    def join(self, stream: Any, clock: _Clock) -> None:
        with self.lock:
            self.merge(self._actor(stream), clock)

    def record(self, event: Any, stream: Any) -> None:
        with self.lock:
            snapshot = dict(self.clocks[self._actor(stream)])
            try:
                self._events[event] = snapshot
            except TypeError:  # not weak-referenceable: keep it alive with its clock
                self._strong_events[id(event)] = (event, snapshot)

    def event_clock(self, event: Any) -> _Clock:
        with self.lock:
            try:
                found = self._events.get(event)
            except TypeError:
                found = None
            if found is None:
                entry = self._strong_events.get(id(event))
                found = entry[1] if entry is not None else {}
            return dict(found)


_checker = _Checker()


class _StreamObserver:
    """What ``relay.cpu_stream`` reports once the checker is on (its ``observer``)."""

    def submitted(self) -> Any:
        return _checker.snapshot(current_cpu_stream())

    def task_started(self, stream: ThreadStream, token: Any) -> None:
        _checker.join(stream, token)

    def task_finished(self, stream: ThreadStream) -> Any:
        return _checker.snapshot(stream)

    def joined(self, token: Any) -> None:
        _checker.join(current_cpu_stream(), token)

    def recorded(self, event: CpuEvent) -> None:
        _checker.record(event, current_cpu_stream())

    def waited(self, event: CpuEvent) -> None:
        _checker.join(current_cpu_stream(), _checker.event_clock(event))


def enable_happens_before() -> None:
    """Turn the happens-before checker on (any map built with ``debug=True`` does,
    unless ``disable_happens_before`` was called).

    From then on CPU streams and events report to it; reports made before are lost,
    so turn it on before the first step.
    """
    _checker.refused = False
    if not _checker.enabled:
        _checker.enabled = True
        cpu_stream.observer = _StreamObserver()


def disable_happens_before() -> None:
    """Turn the checker off, and keep maps built with ``debug=True`` from turning it on:
    their other checks stay. For measuring what it costs (``relay bench``); call it
    before building the maps, as stamps made while it is off are not kept."""
    _checker.refused = True
    _checker.enabled = False
    cpu_stream.observer = None


def happens_before_enabled() -> bool:
    """Whether the checker is on (reports are ignored, at the cost of one test, when off)."""
    return _checker.enabled


def record_event(event: Any, stream: Any = None) -> None:
    """Report: ``event`` was recorded on ``stream`` (``None``: the calling host thread).

    Call it next to ``event.record(stream)``. CpuEvents report themselves.
    """
    if _checker.enabled:
        _checker.record(event, stream)


def wait_event(stream: Any, event: Any) -> None:
    """Report: ``stream`` waits on ``event``'s newest record (``stream.wait_event(event)``)."""
    if _checker.enabled:
        _checker.join(stream, _checker.event_clock(event))


def synchronize_event(event: Any) -> None:
    """Report: the calling host thread blocked until ``event`` completed (``event.synchronize()``)."""
    if _checker.enabled:
        _checker.join(current_cpu_stream(), _checker.event_clock(event))


def wait_stream(stream: Any, other: Any) -> None:
    """Report: ``stream`` waits for everything enqueued on ``other`` so far
    (``stream.wait_stream(other)``)."""
    if _checker.enabled:
        _checker.join(stream, _checker.snapshot(other))


def synchronize_stream(stream: Any) -> None:
    """Report: the calling host thread blocked until ``stream`` drained
    (``stream.synchronize()``). ThreadStreams report their own."""
    if _checker.enabled:
        _checker.join(current_cpu_stream(), _checker.snapshot(stream))


def check_resolved(value: torch.Tensor, consumer: str) -> None:
    """Debug aid for an engine's host consumers of a placeholder target (``input_ids``
    read by a repetition penalty, say): ``value`` must hold no placeholder ``-slot``.

    A placeholder is replaced on the forward stream by the resolve; host code that reads
    the target between ``invalidate`` and that resolve sees ``-slot`` instead of a token
    (vLLM #27878). Call it where the host reads the target, in debug runs.
    """
    if value.numel() == 0:
        return
    pending = value.reshape(-1) < 0
    if value.device.type != "cpu":
        torch._assert_async(
            ~pending.any(), f"{consumer}: read a placeholder (-slot) not resolved yet"
        )
        return
    if bool(pending.any()):
        position = int(pending.nonzero()[0, 0])
        placeholder = int(value.reshape(-1)[position])
        raise RelayDebugError(
            f"{consumer}: position {position} holds the placeholder {placeholder} (slot "
            f"{-placeholder}), not a value: the host read the target after invalidate and "
            "before the resolve replaced it. Read it after resolve_future (on the forward "
            "stream, then a host copy), or read the value the relay hands over instead."
        )


# --------------------------------------------------------------------------------------
# Per-map checks
# --------------------------------------------------------------------------------------


def _vector(values: list[int], device: torch.device) -> torch.Tensor:
    """A host list as an int64 tensor on ``device``, copied without blocking the host
    (made on first use inside a step, which must not sync: tests/gpu/test_gpu_sync_free.py)."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


# Note [Debug state table]
# A map's debug state is one int64 table, [F, P + 1, C]: a plane per field (ids given
# at construction; a field first named later gets its plane on first use), a row per
# slot, and the columns below. A method's check is then a fixed number of ops whatever
# its field count: one gather of the [k, B, C] block of its k fields, the compares, and
# one index_put_ of a stamp broadcast over the rows (a write) or of the consumed mark
# (a read). What stays per field is inherent: the poison fill of each buffer read.
# - READY is the clock of the row's write while the row may be read, and _BLOCKED
#   (above every vector entry) once it may not: never written, consumed, omitted or
#   released. So one compare, ``vector[WRITER] >= READY``, checks freshness and
#   happens-before together; with the checker off, ``READY < _BLOCKED``. STATE (never
#   written, written, consumed, omitted) and OP (the writing method) only name the
#   cause when a check fails; WRITTEN with READY _BLOCKED means released.
# - WRITER is the writing actor + 1, and 0 for "no writer": every vector holds _OWN at
#   index 0, so an unwritten row needs no clamp and no compare of its own. CLOCK keeps
#   the write's clock after a read blocks READY: two unordered writes race even when a
#   read came between them.
# - Row 0 is the scratch row padded batches point at: its checks must always pass. It
#   keeps WRITER 0 and READY 0 for ever, because every stamp goes through ``_sink``,
#   which sends row 0 to the spare row P; the gathers read row 0 itself.
# - One reduction per call: on the CPU a failure is read back and named (field, slot,
#   operations, streams); elsewhere one device-side assert covers the call, so its
#   summary names every field of the call, not the failing one.

# Per-row state of one field (column STATE), kept apart from the values.
_EMPTY = 0  # never written
_WRITTEN = 1  # written and not read yet
_CONSUMED = 2  # read since its last write
_OMITTED = 3  # the latest stash left this optional field out

# The columns of the state table.
_STATE, _WRITER, _CLOCK, _READY, _OP = range(5)
_COLUMNS = 5
#: READY of a row that no read may take: above every entry of every vector.
_BLOCKED = _OWN + 1


class _Plan:
    """The constants of one method's check of one set of fields, made on first use."""

    __slots__ = ("fields", "names", "planes", "stamps", "tick")

    def __init__(self, names: tuple[str, ...], planes: torch.Tensor) -> None:
        self.names = names
        #: The fields' planes in the state table, as a column ``[k, 1]``.
        self.planes = planes
        #: The same as ``[k, 1, 1]``, to index single columns.
        self.fields = planes.unsqueeze(2)
        #: A write's stamp ``[k, 1, C]`` per writing actor (-1: the checker off), with
        #: CLOCK and READY 0; the write adds ``tick`` times its clock.
        self.stamps: dict[int, torch.Tensor] = {}
        self.tick: torch.Tensor | None = None


class DebugChecks:
    """Debug-mode bookkeeping of one map (Note [Debug state table]).

    ``forward`` and ``schedule`` name the fields of each lane; ``consumers`` the
    schedule-side resolves, each of which must follow a fresh publish.
    """

    def __init__(
        self,
        device: torch.device,
        pool_size: int,
        owner: str,
        *,
        forward: tuple[str, ...] = (),
        schedule: tuple[str, ...] = (),
        consumers: tuple[str, ...] = (),
    ) -> None:
        self.device = torch.device(device)
        self.pool_size = pool_size
        self.owner = owner
        self._policy = policy_for(self.device)
        self._consumers = consumers
        self._fresh: set[str] = set()
        self._ids = {
            field: i for i, field in enumerate(dict.fromkeys(forward + schedule))
        }
        self._table = self._planes(len(self._ids))
        self._create = threading.Lock()
        self._ops: list[str] = ["?"]
        self._writes: dict[Hashable, _Plan] = {}
        self._reads: dict[Hashable, _Plan] = {}
        self._all: tuple[int, torch.Tensor] | None = None
        device = self.device
        self._sink = torch.arange(pool_size, dtype=torch.int64, device=device)
        self._sink[0] = pool_size
        # check_slots: sorted slots between these two must rise strictly.
        self._edges = {
            scratch_ok: (
                torch.tensor([-1 if scratch_ok else 0], device=device),
                torch.tensor([pool_size], device=device),
            )
            for scratch_ok in (True, False)
        }
        self._consumed_columns = torch.tensor([_STATE, _READY], device=device)
        self._consumed = torch.tensor([_CONSUMED, _BLOCKED], device=device)
        self._ready_column = torch.tensor(_READY, device=device)
        self._row0 = torch.tensor(0, device=device)
        self._blocked = torch.tensor(_BLOCKED, device=device)
        # Note [Happens-before in debug mode]: CpuEvents report themselves.
        self._model_fence = not isinstance(self._policy, CpuPolicy)
        self._fence_clock: _Clock | None = None
        self._fence_actor: int | None = None
        if not _checker.refused:
            enable_happens_before()

    # -- helpers -------------------------------------------------------------------
    def _planes(self, count: int) -> torch.Tensor:
        """``count`` fresh planes of the state table: nothing written; row 0 readable."""
        planes = torch.zeros(
            (count, self.pool_size + 1, _COLUMNS), dtype=torch.int64, device=self.device
        )
        planes[:, 1:, _READY] = _BLOCKED
        return planes

    def _field(self, field: str) -> int:
        """The plane of ``field``; a field the constructor did not name gets one now."""
        plane = self._ids.get(field)
        if plane is None:
            with self._create:
                plane = self._ids.get(field)
                if plane is None:
                    self._table = torch.cat((self._table, self._planes(1)))
                    plane = self._ids[field] = len(self._ids)
        return plane

    def _plan(self, names: tuple[str, ...]) -> _Plan:
        planes = [self._field(name) for name in names]
        return _Plan(names, _vector(planes, self.device).unsqueeze(1))

    def _op(self, op: str) -> int:
        try:
            return self._ops.index(op)
        except ValueError:
            self._ops.append(op)
            return len(self._ops) - 1

    def _slots(self, what: str, indices: torch.Tensor) -> torch.Tensor:
        if (
            indices.dtype == torch.bool
            or indices.dtype.is_floating_point
            or indices.dtype.is_complex
        ):
            raise RelayDebugError(
                f"{self.owner}.{what}: indices must be integer slots, got a {indices.dtype} "
                "tensor; pass request-pool slots as int64 or int32"
            )
        return indices.reshape(-1).long()

    def _require(
        self, ok: torch.Tensor, summary: Callable[[], str], detail: Callable[[int], str]
    ) -> None:
        """Every element of ``ok`` must hold. On the CPU (no sync to pay) name the first
        failing element (its flat index) with ``detail``; elsewhere assert on the device
        with ``summary``."""
        if ok.is_cpu:
            if not ok.all().item():
                first = int((~ok).reshape(-1).nonzero()[0, 0])
                raise DebugCheckFailed(f"{self.owner}.{detail(first)}")
        else:
            torch._assert_async(ok.all(), f"{self.owner}.{summary()}")

    def _stream(self) -> Any:
        return self._policy.current_stream()

    # -- the contract --------------------------------------------------------------
    def check_slots(
        self, op: str, indices: torch.Tensor, *, scratch_ok: bool = True
    ) -> None:
        """Before anything is written: every slot in range (row 0 only if ``scratch_ok``),
        and no slot twice (row 0 may repeat where it is allowed: padding)."""
        rows = self._slots(op, indices)
        if rows.numel() == 0:
            return
        # Sorted between the edges (low - 1 and pool_size) the slots rise strictly: in
        # range and no repeat, in one compare; padding may repeat row 0.
        below, above = self._edges[scratch_ok]
        edges = torch.cat((below, rows.sort().values, above))
        after = edges[1:]
        ok = after > edges[:-1]
        if scratch_ok:
            ok |= after == 0
        low = 0 if scratch_ok else 1
        scratch = (
            ""
            if scratch_ok
            else " (row 0 is the scratch row: placeholder 0 would read as token 0)"
        )

        def summary() -> str:
            repeat = ", row 0 excepted (padding)" if scratch_ok else ""
            return (
                f"{op}: slots must be in [{low}, {self.pool_size}){scratch}, and no slot "
                f"may appear twice in one batch{repeat}"
            )

        def problem(_: int) -> str:
            outside = ((rows < low) | (rows >= self.pool_size)).nonzero()
            if outside.numel():
                i = int(outside[0, 0])
                return (
                    f"{op}: slots must be in [{low}, {self.pool_size}){scratch}; slot "
                    f"{int(rows[i])} at position {i} is not (slots are request-pool "
                    f"indices of this map, which has {self.pool_size} rows; a negative "
                    "slot would wrap around)"
                )
            ordered = rows.sort().values
            repeated = (ordered[1:] == ordered[:-1]) & (ordered[1:] != 0)
            slot = int(ordered[1:][repeated][0])
            return (
                f"{op}: slot {slot} appears twice in one batch; each request holds one "
                "slot, so a repeat means two requests share it (a stash would keep one "
                "value, a resolve would consume one value twice)"
            )

        self._require(ok, summary, problem)

    def wrote(
        self,
        op: str,
        indices: torch.Tensor,
        fields: tuple[str, ...],
        *,
        carried: Mapping[str, bool] | None = None,
    ) -> None:
        """``op`` wrote rows ``indices`` of ``fields`` on the current stream. ``carried``
        says, for each optional field among them, whether this call carried it: one left
        out is marked omitted (Note [Optional fields]). Two unordered writes of one row
        are reported."""
        rows = self._slots(op, indices)
        if rows.numel() == 0:
            return
        key = (op, fields) if carried is None else (op, fields, *carried.values())
        plan = self._writes.get(key)
        if plan is None:
            plan = self._writes[key] = self._write_plan(op, fields, carried)
        table = self._table
        if not _checker.enabled:
            table.index_put_((plan.planes, self._sink[rows]), self._stamp(plan, -1))
            return
        actor, clock, vector = _checker.tick(self._stream(), self.device)
        # Two writes of one row must be ordered, or which one a read sees is timing.
        block = table[plan.planes, rows]
        ok = vector.take(block[..., _WRITER]) >= block[..., _CLOCK]

        def summary() -> str:
            return (
                f"{', '.join(fields)}: {op} on {_checker.name(actor)} overwrites a row "
                "written on another stream with no order between the writes"
            )

        def unordered(first: int) -> str:
            j, i = divmod(first, rows.numel())
            return (
                f"{fields[j]}: slot {int(rows[i])}: {op} on {_checker.name(actor)} "
                f"overwrites the value {self._ops[int(block[j, i, _OP])]} wrote on "
                f"{_checker.name(int(block[j, i, _WRITER]) - 1)}, and nothing orders the "
                "two writes (no stream wait or event between them): which value the next "
                "read sees depends on timing. Write from one stream, or order the streams."
            )

        self._require(ok, summary, unordered)
        assert plan.tick is not None
        stamp = torch.add(self._stamp(plan, actor), plan.tick, alpha=clock)
        table.index_put_((plan.planes, self._sink[rows]), stamp)

    def _write_plan(
        self, op: str, fields: tuple[str, ...], carried: Mapping[str, bool] | None
    ) -> _Plan:
        plan = self._plan(fields)
        written = [carried is None or carried.get(f, True) for f in fields]
        shape = (len(fields), 1, _COLUMNS)
        ticks = [[0, 0, 1, int(w), 0] for w in written]
        plan.tick = _vector([v for t in ticks for v in t], self.device).reshape(shape)
        # The stamp of the checker off (writer 0); _stamp derives each actor's from it.
        op_id = self._op(op)
        stamps = [
            [_WRITTEN, 0, 0, 0, op_id] if w else [_OMITTED, 0, 0, _BLOCKED, op_id]
            for w in written
        ]
        plan.stamps[-1] = _vector([v for t in stamps for v in t], self.device).reshape(
            shape
        )
        return plan

    def _stamp(self, plan: _Plan, actor: int) -> torch.Tensor:
        """The stamp of a write by ``actor`` (-1: the checker is off), CLOCK and READY
        still 0 (for an omitted field READY is _BLOCKED)."""
        stamp = plan.stamps.get(actor)
        if stamp is None:
            stamp = plan.stamps[-1].clone()
            stamp[:, :, _WRITER] = actor + 1
            plan.stamps[actor] = stamp
        return stamp

    def read(
        self,
        op: str,
        rows: torch.Tensor,
        buffers: Mapping[str, torch.Tensor | None],
        *,
        carried: Mapping[str, bool] | None = None,
        taken: torch.Tensor | None = None,
    ) -> None:
        """``op`` gathered rows ``rows`` of the fields in ``buffers`` (field name ->
        buffer); ``carried`` says, for optional ones among them, whether the call read
        them (it did not where the latest write left the field out); ``taken`` masks
        the positions really read. Check each row was written for this request, not
        read since, and that the read is ordered after its write; then mark them
        consumed and poison them."""
        rows = self._slots(op, rows)
        if rows.numel() == 0:
            return
        fields = tuple(buffers)
        key = (op, fields) if carried is None else (op, fields, *carried.values())
        plan = self._reads.get(key)
        if plan is None:
            read = tuple(f for f in fields if carried is None or carried.get(f, True))
            plan = self._reads[key] = self._plan(read)
        names = plan.names
        if not names:
            return
        if taken is not None:
            # Positions not read go to row 0, whose checks pass (no host sync to drop them).
            rows = torch.where(taken.reshape(-1), rows, self._row0)
        table = self._table
        block = table[plan.planes, rows]
        hb = _checker.enabled
        if hb:
            actor, _, vector = _checker.tick(self._stream(), self.device)
            ok = vector.take(block[..., _WRITER]) >= block[..., _READY]
        else:
            actor = -1
            ok = block[..., _READY] < _BLOCKED

        def summary() -> str:
            return (
                f"{', '.join(names)}: {op} on {_checker.name(actor) if hb else 'its stream'} "
                "read a row that was not written for this request since it was last "
                "consumed, was left out, or whose write is not ordered before the read"
            )

        def problem(first: int) -> str:
            j, i = divmod(first, rows.numel())
            field, slot = names[j], int(rows[i])
            state, writer, _, ready, written_by = (int(v) for v in block[j, i])
            where = f"{field}: slot {slot}: {op}"
            if state == _EMPTY:
                return (
                    f"{where} reads a row that was never written: no stash or publish "
                    "wrote this slot before the read"
                )
            if state == _CONSUMED:
                return (
                    f"{where} reads a row that was not written since it was last consumed "
                    "(a stash or publish is missing, or the slot is read twice)"
                )
            if state == _OMITTED:
                return (
                    f"{where} reads the optional field, but the latest stash of this slot "
                    f"left it out ({field}=None), so there is no value to hand over"
                )
            if ready == _BLOCKED:
                return (
                    f"{where}: the slot was released and reused between its write "
                    f"({self._ops[written_by]}) and this read; the value belongs to the "
                    "slot's previous request"
                )
            return (
                f"{where} on {_checker.name(actor)} reads the value "
                f"{self._ops[written_by]} wrote on {_checker.name(writer - 1)}, but nothing "
                "orders the read after that write (no fence wait, stream wait or event "
                "synchronize between them that the checker was told of): the read may see "
                "the old value. Resolve through the map on the stream that wrote, wait on "
                "its fence, or report the engine's own waits (relay.debug.wait_event, "
                "synchronize_event, ...)"
            )

        self._require(ok, summary, problem)
        table.index_put_(
            (plan.fields, self._sink[rows].unsqueeze(1), self._consumed_columns),
            self._consumed,
        )
        for name in names:
            buf = buffers[name]
            if buf is not None:
                buf.index_fill_(0, rows, poison(buf.dtype))

    def publishing(self) -> None:
        """``publish`` is about to record the fence (before: the record may wake a waiter)."""
        self._fresh = set(self._consumers)
        if self._model_fence and _checker.enabled:
            stream = self._stream()
            with _checker.lock:
                actor = _checker._actor(stream)
                if self._fence_clock is not None and self._fence_actor != actor:
                    _checker.merge(actor, self._fence_clock)  # Note [Fence chaining]
                self._fence_clock = dict(_checker.clocks[actor])
                self._fence_actor = actor

    def waited(self, consumer: str) -> None:
        """``consumer`` waited on the fence: a publish must have come since its last wait."""
        if consumer not in self._fresh:
            raise RelayDebugError(
                f"{self.owner}.{consumer}: fence waited on with no publish since the "
                "last wait; the rows it would read are stale. Call publish(...) for "
                "this step before resolving."
            )
        self._fresh.discard(consumer)
        if self._model_fence and _checker.enabled and self._fence_clock is not None:
            _checker.join(self._stream(), self._fence_clock)

    def release(self, indices: torch.Tensor) -> None:
        """The requests in slots ``indices`` ended: their unread values are stale (READY
        blocked, STATE kept: Note [Debug state table])."""
        rows = self._slots("release", indices)
        if rows.numel() == 0:
            return
        everything = self._all
        if everything is None or everything[0] != len(self._ids):
            planes = torch.arange(len(self._ids), device=self.device).unsqueeze(1)
            everything = self._all = (len(self._ids), planes)
        self._table.index_put_(
            (everything[1], self._sink[rows], self._ready_column), self._blocked
        )
