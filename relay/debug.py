"""Debug mode of the generated maps: what each method reports to ``DebugChecks``, and the
happens-before checker behind it.

The contract
------------
The generator and the debug runtime meet here: the generated code calls exactly these
methods, and only when the map was built with ``debug=True`` (``self._debug`` is
``None`` otherwise, so debug off costs one attribute test per method). The bookkeeping
behind them is free to change.

Per method, in this order:

- ``stash`` / ``publish``: ``check_slots`` (before anything is written), the writes,
  then ``wrote`` for each field written and ``omitted`` for each optional field the
  payload left out; ``publish`` calls ``publishing`` right before its fence record.
- ``invalidate``: ``check_slots(..., scratch_ok=False)`` before the placeholders.
- ``resolve_future``: ``check_slots``, then per field the gather and ``read``.
- schedule resolves: the fence wait, ``waited``, ``check_slots``, the gather, ``read``.
- ``release``: ``release``.

What debug mode checks (see docs/debugging.md for every message)
-----------------------------------------------------------------
- Slots: in range, row 0 only where padding may point at it, no slot twice in a batch.
- Freshness: each row of each field has a state kept apart from its values (never
  written, written, consumed, omitted), so every legal value is accepted, NaN and -1
  included, and each written value is read exactly once. Rows read are filled with
  ``poison(dtype)`` again, so a stray read outside the map still looks wrong.
- Generations: ``release`` bumps a slot's generation; a value written for the slot's
  previous request is never handed to the next one.
- Fence freshness: each schedule-side resolve waits on a publish made since its last wait.
- Happens-before (Note [Happens-before in debug mode]): every write and read of a row is
  stamped with its stream and that stream's vector clock; a read not ordered after the
  write it reads, or two unordered writes of one row, is reported.

Checks run on the device where they can (``torch._assert_async``, no host sync). On the
CPU, where a check costs no sync, a failure raises ``DebugCheckFailed`` (a
``RelayDebugError``) naming the field, the slot and the operations; on other devices the
device-side assert carries the field, the operation and the streams involved.

Engines report their own stream waits and event synchronizes with ``record_event``,
``wait_event``, ``synchronize_event``, ``wait_stream`` and ``synchronize_stream``;
``check_resolved`` checks a placeholder target before a host consumer reads it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
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


# Per-row state of one field, kept apart from the values.
_EMPTY = 0  # never written
_WRITTEN = 1  # written and not read yet
_CONSUMED = 2  # read since its last write
_OMITTED = 3  # the latest stash left this optional field out


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


#: A stream's own entry in the vectors reads compare against: its own writes are
#: always ordered before its reads (program order).
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
            thread = threading.current_thread()
            key = ("host", threading.get_ident())
            name = f"host thread {thread.name!r}"
            device = False
        elif isinstance(stream, ThreadStream):
            key = ("thread-stream", stream.serial)
            name = repr(stream)
            device = False
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
            name = f"stream {stream!r}"
            device = True
        actor = self.ids.get(key)
        if actor is None:
            actor = self.ids[key] = len(self.names)
            self.names.append(name)
            self.clocks.append({actor: 0})
            self.device_actor.append(device)
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
        indexed by actor, its own entry ``_OWN``)."""
        with self.lock:
            actor = self._actor(stream)
            clock = self.clocks[actor]
            clock[actor] += 1
            key = (actor, device)
            cached = self._vectors.get(key)
            n = len(self.names)
            if cached is None or cached[0] != self.learned[actor] or cached[1] != n:
                values = [clock.get(a, 0) for a in range(n)]
                values[actor] = _OWN
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
    """A host list as an int64 tensor on ``device``, copied without blocking the host."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class _FieldRows:
    """Per-row debug state of one field, kept apart from its values."""

    def __init__(self, pool_size: int, device: torch.device) -> None:
        self.state = torch.zeros(pool_size, dtype=torch.int8, device=device)
        self.generation = torch.zeros(pool_size, dtype=torch.int64, device=device)
        # Happens-before stamps of the newest write: actor (-1: none), its clock, op.
        self.actor = torch.full((pool_size,), -1, dtype=torch.int64, device=device)
        self.clock = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self.op = torch.zeros(pool_size, dtype=torch.int64, device=device)


class DebugChecks:
    """Debug-mode bookkeeping of one map.

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
        self._lane = {
            **{f: "forward" for f in forward},
            **{f: "schedule" for f in schedule},
        }
        self._consumers = consumers
        self._fresh: set[str] = set()
        self._generation = torch.zeros(pool_size, dtype=torch.int64, device=self.device)
        self._rows: dict[str, _FieldRows] = {
            f: _FieldRows(pool_size, self.device) for f in self._lane
        }
        self._create = threading.Lock()
        self._ops: list[str] = ["?"]
        # Note [Happens-before in debug mode]: CpuEvents report themselves.
        self._model_fence = not isinstance(self._policy, CpuPolicy)
        self._fence_clock: _Clock | None = None
        self._fence_actor: int | None = None
        if not _checker.refused:
            enable_happens_before()

    # -- helpers -------------------------------------------------------------------
    def _field(self, field: str) -> _FieldRows:
        rows = self._rows.get(field)
        if rows is None:  # a field the constructor did not name: made on first use
            with self._create:
                rows = self._rows.setdefault(
                    field, _FieldRows(self.pool_size, self.device)
                )
        return rows

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
        failing position with ``detail``; elsewhere assert on the device with ``summary``."""
        if ok.device.type == "cpu":
            if not bool(ok.all()):
                first = int((~ok).nonzero()[0, 0])
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
        low = 0 if scratch_ok else 1
        in_range = (rows >= low) & (rows < self.pool_size)
        ordered, _ = rows.sort()
        repeated = (
            (ordered[1:] == ordered[:-1]) & (ordered[1:] >= low) & (ordered[1:] != 0)
        )
        scratch = (
            ""
            if scratch_ok
            else " (row 0 is the scratch row: placeholder 0 would read as token 0)"
        )

        def out_of_range(i: int) -> str:
            return (
                f"{op}: slots must be in [{low}, {self.pool_size}){scratch}; slot "
                f"{int(rows[i])} at position {i} is not (slots are request-pool indices of "
                f"this map, which has {self.pool_size} rows; a negative slot would wrap around)"
            )

        def twice(i: int) -> str:
            return (
                f"{op}: slot {int(ordered[i + 1])} appears twice in one batch; each request "
                "holds one slot, so a repeat means two requests share it (a stash would "
                "keep one value, a resolve would consume one value twice)"
            )

        self._require(
            in_range,
            lambda: f"{op}: slots must be in [{low}, {self.pool_size}){scratch}",
            out_of_range,
        )
        if repeated.numel():
            self._require(
                ~repeated, lambda: f"{op}: a slot appears twice in one batch", twice
            )

    def wrote(
        self, op: str, field: str, buf: torch.Tensor, indices: torch.Tensor
    ) -> None:
        """Rows ``indices`` of ``field`` were written by ``op`` on the current stream."""
        self._mark(op, field, self._slots(op, indices), _WRITTEN)

    def omitted(self, op: str, field: str, indices: torch.Tensor) -> None:
        """``op`` stashed rows ``indices`` without the optional ``field``."""
        self._mark(op, field, self._slots(op, indices), _OMITTED)

    def _mark(self, op: str, field: str, rows: torch.Tensor, state: int) -> None:
        if rows.numel() == 0:
            return
        f = self._field(field)
        f.state.index_fill_(0, rows, state)
        f.generation[rows] = self._generation[rows]
        if not _checker.enabled:
            return
        actor, clock, vector = _checker.tick(self._stream(), rows.device)
        # Two writes of one row must be ordered, or which one a read sees is timing.
        previous = f.actor[rows]
        seen = vector[previous.clamp(min=0)]
        ordered = (previous < 0) | (seen >= f.clock[rows]) | (rows == 0)

        def unordered(i: int) -> str:
            return (
                f"{field}: slot {int(rows[i])}: {op} on {_checker.name(actor)} overwrites "
                f"the value {self._ops[int(f.op[rows[i]])]} wrote on "
                f"{_checker.name(int(previous[i]))}, and nothing orders the two writes (no "
                "stream wait or event between them): which value the next read sees depends "
                "on timing. Write from one stream, or order the streams."
            )

        self._require(
            ordered,
            lambda: (
                f"{field}: {op} on {_checker.name(actor)} overwrites a row written on "
                "another stream with no order between the writes"
            ),
            unordered,
        )
        f.actor.index_fill_(0, rows, actor)
        f.clock.index_fill_(0, rows, clock)
        f.op.index_fill_(0, rows, self._op(op))

    def read(
        self,
        op: str,
        field: str,
        buf: torch.Tensor,
        rows: torch.Tensor,
        taken: torch.Tensor | None = None,
    ) -> None:
        """``op`` gathered rows ``rows`` of ``field`` (``taken`` masks the rows really
        read); check each was written for this request, not read since, and that the
        read is ordered after its write; then mark them consumed and poison them."""
        rows = self._slots(op, rows)
        if rows.numel() == 0:
            return
        f = self._field(field)
        hb = _checker.enabled
        actor, _, vector = (
            _checker.tick(self._stream(), rows.device) if hb else (-1, 0, rows)
        )
        checked = rows != 0  # row 0 is scratch: padded positions read it harmlessly
        if taken is not None:
            checked = checked & taken.reshape(-1)
        state = f.state[rows]
        fresh = state == _WRITTEN
        current = f.generation[rows] == self._generation[rows]
        writer = f.actor[rows]
        ok = fresh & current
        if hb:
            ok = ok & (vector[writer.clamp(min=0)] >= f.clock[rows])
        ok = ~checked | ok

        def problem(i: int) -> str:
            slot = int(rows[i])
            where = f"{field}: slot {slot}: {op}"
            s = int(state[i])
            if s == _EMPTY:
                return (
                    f"{where} reads a row that was never written: no stash or publish "
                    "wrote this slot before the read"
                )
            if s == _CONSUMED:
                return (
                    f"{where} reads a row that was not written since it was last consumed "
                    "(a stash or publish is missing, or the slot is read twice)"
                )
            if s == _OMITTED:
                return (
                    f"{where} reads the optional field, but the latest stash of this slot "
                    f"left it out ({field}=None), so there is no value to hand over"
                )
            written_by = self._ops[int(f.op[slot])]
            if not bool(current[i]):
                return (
                    f"{where}: the slot was released and reused between its write "
                    f"({written_by}) and this read; the value belongs to the slot's "
                    "previous request"
                )
            return (
                f"{where} on {_checker.name(actor)} reads the value {written_by} wrote on "
                f"{_checker.name(int(writer[i]))}, but nothing orders the read after that "
                "write (no fence wait, stream wait or event synchronize between them that "
                "the checker was told of): the read may see the old value. Resolve through "
                "the map on the stream that wrote, wait on its fence, or report the "
                "engine's own waits (relay.debug.wait_event, synchronize_event, ...)"
            )

        self._require(
            ok,
            lambda: (
                f"{field}: {op} on {_checker.name(actor) if hb else 'its stream'} read a "
                "row that was not written for this request since it was last consumed, was left "
                "out, or whose write is not ordered before the read"
            ),
            problem,
        )
        # Positions not checked go to row 0, so no host sync is needed to drop them.
        consumed = torch.where(checked, rows, 0)
        f.state.index_fill_(0, consumed, _CONSUMED)
        buf.index_fill_(0, consumed, poison(buf.dtype))

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
        """The requests in slots ``indices`` ended: their unread values are stale."""
        rows = self._slots("release", indices)
        self._generation.index_add_(0, rows, torch.ones_like(rows))
