"""A CPU "stream": torch work run in order on a worker thread, with CUDA-like events.

On a GPU the host enqueues kernels and moves on; the scheduler's Python overlaps the
device. On the CPU, torch ops run synchronously in the calling thread, so the
reference engine submits each forward as a task to a ``ThreadStream`` and the
scheduler thread keeps going. ``CpuEvent`` gives that stream the semantics the
relay relies on (see Note [Host order of CPU records]).
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = [
    "CpuEvent",
    "StreamObserver",
    "ThreadStream",
    "current_cpu_stream",
    "use_cpu_stream",
]

_local = threading.local()
#: Streams whose queued work a host wait must consider (Note [Host order of CPU records]).
_live_streams: weakref.WeakSet[ThreadStream] = weakref.WeakSet()
#: Global submission numbers, across streams: the host order of tasks.
_submission_order = itertools.count(1)
_submission_lock = threading.Lock()
_serials = itertools.count(1)
#: Finished tasks per stream whose end a wait can still join exactly (a wait is
#: almost always on one of the newest few).
_DONE_TOKENS_KEPT = 256


class StreamObserver(Protocol):
    """What a happens-before checker hears from CPU streams and events (``relay.debug``
    installs one as ``observer`` when it is turned on; ``None`` costs one test)."""

    def submitted(self) -> Any:
        """On the submitting thread: a token the task joins when it starts."""

    def task_started(self, stream: ThreadStream, token: Any) -> None:
        """On the worker, before a task runs."""

    def task_finished(self, stream: ThreadStream) -> Any:
        """On the worker, after a task ran: a token a host joins once it saw the end."""

    def joined(self, token: Any) -> None:
        """The calling thread waited for a task's end (``token`` from ``task_finished``)."""

    def recorded(self, event: CpuEvent) -> Any:
        """``event`` was recorded on the calling thread's stream: a token a wait on
        this record joins."""

    def waited(self, event: CpuEvent, token: Any) -> None:
        """The calling thread's stream (or host thread) waited on ``event``'s record
        ``token`` (from ``recorded``; ``None``: no record, a wait on nothing)."""


#: The checker to report to, or ``None`` (the default: nothing is reported).
observer: StreamObserver | None = None


def current_cpu_stream() -> ThreadStream | None:
    """The stream the calling thread's work belongs to, or ``None`` (synchronous)."""
    stream: ThreadStream | None = getattr(_local, "stream", None)
    return stream


@contextmanager
def use_cpu_stream(stream: ThreadStream | None) -> Iterator[None]:
    """Make ``stream`` the calling thread's current CPU stream inside the block."""
    previous = current_cpu_stream()
    _local.stream = stream
    try:
        yield
    finally:
        _local.stream = previous


# Note [Host order of CPU records]
# On CUDA an event is recorded when the host *enqueues* the record, so a host wait
# issued after launching forward N always refers to N's record, even if the device
# has not reached it yet. Here the record is made by the worker while it runs task N,
# which may be after the scheduler already asked to wait (even before the very first
# record, when the event has never been recorded at all). So every record notes the
# ticket of the task that made it, and every task gets a global submission number. A
# wait looks at every live stream, since any of them may be about to record, and on
# each at the newest task submitted before the wait (before the waiting task, when
# a task waits): it blocks until a record from that task has completed, or the task
# has finished (then any record it made precedes the wait in host order and is
# done). Tasks submitted after a wait are never waited on, so waits between streams
# cannot form a cycle. A wait never under-waits; it over-waits for queued tasks that
# record nothing, so a queued task must not itself block on the host (by a lock or
# threading primitive outside these events), or the two wait for each other.
#
# What a wait orders the waiter after, for a happens-before checker, is the record it
# waited for alone, as on CUDA: not a later task's record of the same event (the
# worker may have recorded again by the time the waiter looks), nor a later task's
# end. Told more, the checker would see the waiter ordered after work it never waited
# for whenever the worker happened to be fast, and miss races on those runs only.


def _host_order() -> int:
    """A place in the host order of tasks, for work done now outside any stream."""
    with _submission_lock:
        return next(_submission_order)


class ThreadStream:
    """Runs submitted callables in order on one daemon worker thread."""

    def __init__(self, name: str = "relay-forward") -> None:
        self.name = name
        #: A number no other stream of this process has (ids of dead objects are reused).
        self.serial = next(_serials)
        self._tasks: queue.SimpleQueue[tuple[int, Callable[[], None], Any] | None] = (
            queue.SimpleQueue()
        )
        # Per finished task, what the checker knew at its end (only while one listens):
        # a wait joins the end of the task it waited for, not of a later one.
        self._done_tokens: dict[int, Any] = {}
        self._cond = threading.Condition()
        self._submitted = 0
        self._finished = 0
        self._running_ticket = 0
        self._running_order = 0
        # (submission number, ticket) of tasks not finished yet, oldest first.
        self._pending: collections.deque[tuple[int, int]] = collections.deque()
        self._error: BaseException | None = None
        self._busy_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _live_streams.add(self)

    def __repr__(self) -> str:
        return f"ThreadStream({self.name!r})"

    # -- host side -------------------------------------------------------------
    def submit(self, fn: Callable[[], None]) -> int:
        """Queue ``fn`` behind everything submitted before; returns its ticket."""
        self.raise_pending()
        token = observer.submitted() if observer is not None else None
        with _submission_lock, self._cond:
            self._submitted += 1
            ticket = self._submitted
            self._pending.append((next(_submission_order), ticket))
        self._tasks.put((ticket, fn, token))
        return ticket

    def newest_before(self, order: int | None) -> int:
        """Ticket of the newest unfinished task submitted before submission number
        ``order`` (``None``: before now); 0 when there is none."""
        with self._cond:
            newest = 0
            for submitted, ticket in self._pending:
                if order is not None and submitted >= order:
                    break
                newest = ticket
            return newest

    def oldest_pending(self) -> int:
        """Submission number of the oldest unfinished task; 0 when there is none."""
        with self._cond:
            return self._pending[0][0] if self._pending else 0

    @property
    def submitted(self) -> int:
        """Ticket of the newest submitted task (0 before any)."""
        with self._cond:
            return self._submitted

    def synchronize(self) -> None:
        """Block until every submitted task has finished; re-raise a task's error."""
        with self._cond:
            target = self._submitted
        self.wait_ticket(target, lambda: False)

    def wait_ticket(
        self, ticket: int, done: Callable[[], bool], *, join: bool = True
    ) -> None:
        """Block until ``done()`` holds or task ``ticket`` has finished. If the task
        finished and ``join``, the calling thread is ordered after that task's end for
        a happens-before checker; ``join=False`` is a wait the caller does not rely on
        for order (a scheduling courtesy, or one whose order comes from elsewhere)."""
        with self._cond:
            self._cond.wait_for(
                lambda: done() or self._finished >= ticket or self._error is not None
            )
            token = None
            if join and self._finished >= ticket:
                token = self._done_token_of(ticket)
        if observer is not None and token is not None:
            observer.joined(token)
        self.raise_pending()

    def _done_token_of(self, ticket: int) -> Any:
        """The checker's token of finished task ``ticket``'s end; lock held. One older
        than the tokens kept gets the oldest kept: ordered after a little more work
        than it waited for, never less (a false alarm would be worse)."""
        if not self._done_tokens:
            return None
        token = self._done_tokens.get(ticket)
        if token is None:
            token = self._done_tokens[min(self._done_tokens)]
        return token

    def raise_pending(self) -> None:
        """Re-raise, on the host, an exception a task raised on the worker."""
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"a task on CPU stream {self.name!r} failed") from error

    @property
    def busy_seconds(self) -> float:
        """Wall time the worker has spent running tasks (forward occupancy)."""
        with self._cond:
            return self._busy_seconds

    def close(self) -> None:
        """Finish queued work and stop the worker."""
        self._tasks.put(None)
        self._thread.join()
        _live_streams.discard(self)

    # -- worker side -----------------------------------------------------------
    @property
    def running_ticket(self) -> int:
        """Ticket of the task running now (valid on the worker thread)."""
        return self._running_ticket

    @property
    def running_order(self) -> int:
        """Submission number of the task running now (valid on the worker thread)."""
        return self._running_order

    def notify(self) -> None:
        """Wake host waiters (a record completed)."""
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        _local.stream = self
        while True:
            item = self._tasks.get()
            if item is None:
                return
            ticket, fn, token = item
            self._running_ticket = ticket
            with self._cond:
                self._running_order = self._pending[0][0]
            start = time.perf_counter()
            try:
                if self._error is None:
                    if observer is not None and token is not None:
                        observer.task_started(self, token)
                    fn()
            # Surfaced on the host by raise_pending, whatever it was.
            except BaseException as error:  # noqa: BLE001
                self._error = error
            finally:
                elapsed = time.perf_counter() - start
                done = observer.task_finished(self) if observer is not None else None
                with self._cond:
                    if done is not None:
                        self._done_tokens[ticket] = done
                        self._done_tokens.pop(ticket - _DONE_TOKENS_KEPT, None)
                    self._busy_seconds += elapsed
                    self._finished = ticket
                    self._pending.popleft()
                    self._cond.notify_all()


class CpuEvent:
    """An event for CPU work: synchronous code or ``ThreadStream``s.

    ``record`` marks the point reached by the calling thread's stream; ``wait`` and
    ``synchronize`` block until the newest record in host order has completed.
    """

    def __init__(self) -> None:
        # Per stream, the ticket of the newest task that recorded this event.
        self._records: dict[ThreadStream, int] = {}
        # While a checker listens: (host order, checker token) of the records a wait
        # may still pick (Note [Host order of CPU records]).
        self._history: list[tuple[int, Any]] = []

    def record(self) -> None:
        """Record on the calling thread's stream. CPU ops are synchronous, so the work
        before this point has already run: the record completes at once."""
        stream = current_cpu_stream()
        if observer is not None:
            # A task's record sits at its submission in host order; a host's, now.
            order = stream.running_order if stream is not None else _host_order()
            self._history.append((order, observer.recorded(self)))
            self._forget_unreachable()
        if stream is not None:
            self._records[stream] = stream.running_ticket
            stream.notify()

    def synchronize(self) -> None:
        """Block the calling thread until the newest record has completed."""
        if not _live_streams and observer is None:
            return  # no stream can hold pending work and nothing to report: synchronous
        current = current_cpu_stream()
        # See Note [Host order of CPU records].
        before = current.running_order if current is not None else None
        horizon = before if before is not None else _host_order()
        for stream in list(_live_streams):
            if stream is current:
                continue  # already in stream order
            newest = stream.newest_before(before)
            stream.raise_pending()  # a failed task surfaces at the next wait, as on CUDA
            if newest:
                # Called at once, inside this iteration: the closure sees this stream.
                stream.wait_ticket(
                    newest,
                    lambda: self._records.get(stream, 0) >= newest,  # noqa: B023
                    join=False,  # ordered after the record alone, below
                )
        if observer is not None:
            observer.waited(self, self._record_before(horizon))

    def _forget_unreachable(self) -> None:
        """Drop records no wait can pick any more: a wait is placed at or after the
        oldest unfinished task, so of the records before it only the newest counts."""
        pending = [order for s in list(_live_streams) if (order := s.oldest_pending())]
        floor = min(pending) if pending else None
        history = self._history
        before = [i for i, r in enumerate(history) if floor is None or r[0] < floor]
        if len(before) > 1:
            newest = max(before, key=lambda i: (history[i][0], i))
            self._history = [history[newest]] + [
                r for r in history if floor is not None and r[0] >= floor
            ]

    def _record_before(self, horizon: int) -> Any:
        """The checker's token of the newest record before ``horizon`` in host order
        (``None``: none; records made since by later tasks do not count)."""
        chosen: tuple[int, Any] | None = None
        for order, token in list(self._history):
            if order < horizon and (chosen is None or order >= chosen[0]):
                chosen = (order, token)
        return chosen[1] if chosen is not None else None

    def wait(self) -> None:
        """Order the calling thread's stream after the newest record."""
        self.synchronize()
