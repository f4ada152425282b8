"""The happens-before clocks of debug mode: one vector clock per stream, process-wide.

Installed explicitly, never by building a map (a debug map only reads them while they
are on): ``enable_happens_before()`` / ``disable_happens_before()``, or ``with
happens_before(): ...`` around a run. While they are off, the reports below cost one
test each and debug maps run every other check.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from relay import cpu_stream
from relay.cpu_stream import CpuEvent, ThreadStream, current_cpu_stream

__all__ = [
    "ALWAYS_SEEN",
    "Clock",
    "FenceRecord",
    "HappensBefore",
    "Tick",
    "clocks",
    "disable_happens_before",
    "enable_happens_before",
    "happens_before",
    "happens_before_enabled",
    "record_event",
    "synchronize_event",
    "synchronize_stream",
    "wait_event",
    "wait_stream",
]

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
#   clock the stream had there: at the end of that task, or at that record, never
#   later, however far the worker had got by the time the host looked (Note [Host
#   order of CPU records]). Each map's checks and stamps are atomic (Note [Checks and
#   stamps are atomic] in checks.py), so a race is reported whichever side runs first.
# The relay's fence is one of those events. On the CPU the checker sees the fence's
# CpuEvent records and waits themselves (CpuEvents report to it), so a fence that
# skips its chain wait or a resolve that skips its wait is caught. Elsewhere events are
# the device's own, and the fence is modelled from ``publishing``/``waited``: a record
# chained as Note [Fence chaining] prescribes, and a wait. Engines report their own
# waits with ``record_event``/``wait_event``/``synchronize_event``/``wait_stream``/
# ``synchronize_stream``. The model is strict: it assumes CUDA's semantics everywhere,
# so a CPU run catches what would race on a GPU.
#
# The clocks are process-wide, as streams are, and installed explicitly: reports made
# while they are off are lost, so an engine turns them on before its first step (the
# reference engine does when it runs with debug maps, the lockstep harness for each
# run in debug mode). Debug maps built while they are off stamp their writes with
# writer 0, "no writer", which every later read sees as ordered.

#: A vector clock: actor -> count of that actor's operations known to have happened.
Clock = dict[int, int]

#: The entry every vector holds at index 0 (writer 0: "no writer") and at the reading
#: stream's own index (program order): above every real count, so such a write is
#: always seen. State tables keep a larger value for rows no read may take.
ALWAYS_SEEN = 2**62


def _join(into: Clock, other: Clock) -> bool:
    """``into`` becomes the pointwise max of both; whether it changed."""
    changed = False
    for actor, count in other.items():
        if into.get(actor, 0) < count:
            into[actor] = count
            changed = True
    return changed


def vector(values: list[int], device: torch.device) -> torch.Tensor:
    """A host list as an int64 tensor on ``device``, copied without blocking the host
    (made on first use inside a step, which must not sync: tests/gpu/test_gpu_sync_free.py)."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class Tick(NamedTuple):
    """One operation of a stream, as the state table stamps and checks it."""

    #: The stream's writer id: its actor + 1 (0 is "no writer").
    writer: int
    #: The stream's count of its own operations, this one included.
    clock: int
    #: What the stream knows now, on the map's device, indexed by writer id: entry 0
    #: and the stream's own are ``ALWAYS_SEEN``.
    seen: torch.Tensor


class FenceRecord(NamedTuple):
    """A fence record modelled by the clocks (devices whose events they cannot see)."""

    writer: int
    clock: Clock


class HappensBefore:
    """Vector clocks per stream (Note [Happens-before in debug mode]). Thread-safe."""

    def __init__(self) -> None:
        self._installs = 0
        self._lock = threading.Lock()
        self._ids: dict[Hashable, int] = {}
        self._names: list[str] = []
        self._clocks: list[Clock] = []
        self._device_actor: list[bool] = []  # enqueued by a host thread (launch edges)
        # What an actor learned from others changes only at joins: the vectors reads
        # compare against are cached per (actor, device) until the next one.
        self._learned: list[int] = []
        self._vectors: dict[
            tuple[int, torch.device], tuple[int, int, torch.Tensor]
        ] = {}
        self._events: weakref.WeakKeyDictionary[Any, Clock] = (
            weakref.WeakKeyDictionary()
        )
        self._strong_events: dict[int, tuple[Any, Clock]] = {}

    # -- installation --------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Whether the clocks are installed (CPU streams and events report to them)."""
        return self._installs > 0

    def install(self) -> None:
        """One more holder wants the clocks on (``uninstall`` undoes it)."""
        with self._lock:
            self._installs += 1
            cpu_stream.observer = _STREAM_OBSERVER

    def uninstall(self, *, every: bool = False) -> None:
        """One holder (``every``: all of them) is done; off when none is left."""
        with self._lock:
            self._installs = 0 if every else max(0, self._installs - 1)
            if self._installs == 0:
                cpu_stream.observer = None

    # -- actors ----------------------------------------------------------------------
    def _actor(self, stream: Any) -> int:
        """The actor of ``stream`` (``None``: the calling host thread); lock held."""
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
        actor = self._ids.get(key)
        if actor is None:
            actor = self._new_actor(key, stream)
        if self._device_actor[actor]:
            # Launch edge: the work enqueued now follows what the enqueuing thread knows.
            self._merge(actor, self._clocks[self._actor(current_cpu_stream())])
        return actor

    def _new_actor(self, key: Hashable, stream: Any) -> int:
        # The name only now: the checks look actors up per operation.
        if stream is None:
            name = f"host thread {threading.current_thread().name!r}"
        elif isinstance(stream, ThreadStream):
            name = repr(stream)
        else:
            name = f"stream {stream!r}"
        actor = self._ids[key] = len(self._names)
        self._names.append(name)
        self._clocks.append({actor: 0})
        assert isinstance(key, tuple)
        self._device_actor.append(key[0] not in ("host", "thread-stream"))
        self._learned.append(0)
        return actor

    def _merge(self, actor: int, clock: Clock) -> None:
        """Join ``clock`` into ``actor``'s; lock held."""
        if _join(self._clocks[actor], clock):
            self._learned[actor] += 1

    def writer_name(self, writer: int) -> str:
        """The stream behind writer id ``writer`` (from a ``Tick``), for messages."""
        return self._names[writer - 1] if writer > 0 else "no stream"

    # -- operations ------------------------------------------------------------------
    def tick(self, stream: Any, device: torch.device) -> Tick:
        """An operation of ``stream`` on a map on ``device``."""
        with self._lock:
            actor = self._actor(stream)
            clock = self._clocks[actor]
            clock[actor] += 1
            key = (actor, device)
            cached = self._vectors.get(key)
            n = len(self._names)
            if cached is None or cached[0] != self._learned[actor] or cached[1] != n:
                values = [ALWAYS_SEEN, *(clock.get(a, 0) for a in range(n))]
                values[actor + 1] = ALWAYS_SEEN
                cached = (self._learned[actor], n, vector(values, device))
                self._vectors[key] = cached
            return Tick(actor + 1, clock[actor], cached[2])

    def snapshot(self, stream: Any) -> Clock:
        """What ``stream`` knows now."""
        with self._lock:
            return dict(self._clocks[self._actor(stream)])

    def join(self, stream: Any, clock: Clock) -> None:
        """``stream`` now follows everything ``clock`` knows."""
        with self._lock:
            self._merge(self._actor(stream), clock)

    def record(self, event: Any, stream: Any) -> Clock:
        """``event`` was recorded on ``stream``: a new record replaces the old one.
        Returns what the record knew."""
        with self._lock:
            snapshot = dict(self._clocks[self._actor(stream)])
            try:
                self._events[event] = snapshot
            except TypeError:  # not weak-referenceable: keep it alive with its clock
                self._strong_events[id(event)] = (event, snapshot)
            return snapshot

    def event_clock(self, event: Any) -> Clock:
        """What ``event``'s newest record knew (nothing before any record)."""
        with self._lock:
            try:
                found = self._events.get(event)
            except TypeError:
                found = None
            if found is None:
                entry = self._strong_events.get(id(event))
                found = entry[1] if entry is not None else {}
            return dict(found)

    def record_fence(self, stream: Any, previous: FenceRecord | None) -> FenceRecord:
        """A fence record on ``stream`` chained after ``previous`` (Note [Fence
        chaining]): a stream other than the previous recorder first waits on it."""
        with self._lock:
            actor = self._actor(stream)
            if previous is not None and previous.writer != actor + 1:
                self._merge(actor, previous.clock)
            return FenceRecord(actor + 1, dict(self._clocks[actor]))


#: The process's clocks: streams are process-wide too.
clocks = HappensBefore()


class _StreamObserver:
    """What ``relay.cpu_stream`` reports while the clocks are installed."""

    def submitted(self) -> Any:
        return clocks.snapshot(current_cpu_stream())

    def task_started(self, stream: ThreadStream, token: Any) -> None:
        clocks.join(stream, token)

    def task_finished(self, stream: ThreadStream) -> Any:
        return clocks.snapshot(stream)

    def joined(self, token: Any) -> None:
        clocks.join(current_cpu_stream(), token)

    def recorded(self, event: CpuEvent) -> Any:
        return clocks.record(event, current_cpu_stream())

    def waited(self, event: CpuEvent, token: Any) -> None:
        if token is not None:
            clocks.join(current_cpu_stream(), token)


_STREAM_OBSERVER = _StreamObserver()


def enable_happens_before() -> None:
    """Install the happens-before clocks until ``disable_happens_before()``.

    From then on CPU streams and events report to them and debug maps check the order
    of every read and write; reports made before are lost, so call it before the first
    step (before creating the engine's ``ThreadStream``s is safest).
    """
    clocks.install()


def disable_happens_before() -> None:
    """Uninstall the clocks, whoever installed them: debug maps keep their other checks.
    ``relay bench`` and tests use it to measure or test debug mode without them."""
    clocks.uninstall(every=True)


@contextmanager
def happens_before() -> Iterator[None]:
    """The clocks installed inside the block (nested and concurrent blocks count: they
    stay on until the last one ends)::

        with relay.debug.happens_before():
            run_engine(debug=True)
    """
    clocks.install()
    try:
        yield
    finally:
        clocks.uninstall()


def happens_before_enabled() -> bool:
    """Whether the clocks are installed (reports cost one test each while they are not)."""
    return clocks.enabled


def record_event(event: Any, stream: Any = None) -> None:
    """Report: ``event`` was recorded on ``stream`` (``None``: the calling host thread).

    Call it next to ``event.record(stream)``. CpuEvents report themselves.
    """
    if clocks.enabled:
        clocks.record(event, stream)


def wait_event(stream: Any, event: Any) -> None:
    """Report: ``stream`` waits on ``event``'s newest record (``stream.wait_event(event)``)."""
    if clocks.enabled:
        clocks.join(stream, clocks.event_clock(event))


def synchronize_event(event: Any) -> None:
    """Report: the calling host thread blocked until ``event`` completed (``event.synchronize()``)."""
    if clocks.enabled:
        clocks.join(current_cpu_stream(), clocks.event_clock(event))


def wait_stream(stream: Any, other: Any) -> None:
    """Report: ``stream`` waits for everything enqueued on ``other`` so far
    (``stream.wait_stream(other)``)."""
    if clocks.enabled:
        clocks.join(stream, clocks.snapshot(other))


def synchronize_stream(stream: Any) -> None:
    """Report: the calling host thread blocked until ``stream`` drained
    (``stream.synchronize()``). ThreadStreams report their own."""
    if clocks.enabled:
        clocks.join(current_cpu_stream(), clocks.snapshot(stream))
