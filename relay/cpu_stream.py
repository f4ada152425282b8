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
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = [
    "CpuEvent",
    "Gate",
    "ScheduleDeadlock",
    "SeededSchedule",
    "StreamObserver",
    "ThreadStream",
    "active_schedule",
    "current_cpu_stream",
    "host_order_place",
    "schedule_seed_from_env",
    "seeded_schedule",
    "switch_point",
    "use_cpu_stream",
]


class _ThreadState(threading.local):
    """Per thread: its CPU stream and its place in a seeded schedule. Defaults on the
    class: a missing attribute of a ``threading.local`` costs a caught exception
    (about 300 ns), which every CPU record would pay."""

    stream: ThreadStream | None = None
    turn: _Turn | None = None


_local = _ThreadState()
#: Streams whose queued work a host wait must consider (Note [Host order of CPU records]).
#: A plain set: a stream's worker holds it until ``close``, which removes it, and a
#: set's emptiness is a C test where a ``WeakSet``'s is a Python ``__len__`` per wait.
_live_streams: set[ThreadStream] = set()
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
    return _local.stream


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


def host_order_place() -> int:
    """Where the calling thread's work sits in the host order of tasks: on a stream's
    worker, its running task's submission number (the task was placed when it was
    launched); elsewhere a fresh number, after every task submitted so far. Two places
    compare as their work's launches do (Note [Seeds] in relay/runtime.py)."""
    stream = current_cpu_stream()
    if stream is not None and stream.on_worker():
        return stream.running_order
    return _host_order()


# Note [Fence chaining in host order]
# A fence chains its records (Note [Fence chaining] in relay/device.py) in the order
# the host enqueues them, as on CUDA, where ``Fence.record`` runs on the host. Here it
# runs inside the worker's task, so two streams may reach their records in the reverse
# of host order: the task submitted second first. Deciding the chain in that order
# would model a fence CUDA never builds (the newest record in host order chained after
# nothing), and debug mode would report a race the host's wait does not have. So a
# fence's record on the CPU first waits for the newest record before its task in host
# order (a wait never waits on a later task): the records complete in host order, each
# covering the ones before it, and no record of a later task can be made before it.


# Note [Seeded schedules]
# A free-running worker and host interleave as the OS likes, so a test of an ordering
# bug sees one interleaving per run and may miss the one that shows the bug. Inside
# ``seeded_schedule(seed)`` the host thread that opened it and the workers of the
# ``ThreadStream``s it creates run one at a time: each holds a baton while it runs, and
# at every switch point (a submit, a task's start and end, an event record or wait, a
# report of a relay call to debug mode) a ``random.Random(seed)`` picks who runs next
# among the participants that can go on. So a seed names one interleaving, and running
# it again replays it exactly (the picks are in ``SeededSchedule.trace``).
#
# A participant that must wait (a host wait for a task or a record, a worker with no
# task, a ``Gate``) gives the baton away with the condition it waits for; the next
# pick takes only participants whose condition holds. It cannot deadlock silently: a
# waiter always hands the baton to a side that can make progress, and when no
# participant can, the schedule raises ``ScheduleDeadlock`` naming the seed and what
# each side waits for (a real deadlock of the code under test, found at once). Every
# wait between participants must therefore be one the schedule sees: these events and
# streams, or a ``Gate``; a plain ``threading`` wait inside a schedule blocks the baton
# holder for good. Streams made outside the schedule run free; a wait on their work is
# polled until it ends.


class ScheduleDeadlock(RuntimeError):
    """In a seeded schedule, every participant waits for another and none can go on."""


class _Turn:
    """One participant of a seeded schedule: a host thread or a stream's worker."""

    __slots__ = ("gone", "name", "number", "schedule", "until", "what")

    def __init__(self, schedule: SeededSchedule, number: int, name: str) -> None:
        self.schedule = schedule
        self.number = number
        self.name = name
        #: What the participant waits for before it can run again (``None``: nothing).
        self.until: Callable[[], bool] | None = None
        self.what = ""
        self.gone = False

    def can_run(self) -> bool:
        """Whether the schedule may pick this participant now."""
        return not self.gone and (self.until is None or self.until())


class SeededSchedule:
    """One interleaving of a host thread and its streams' workers, drawn from ``seed``
    (Note [Seeded schedules]). Made by ``seeded_schedule``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._turns: list[_Turn] = []
        self._holder: _Turn | None = None
        self._ended = False
        self._deadlock: str | None = None
        #: The participant picked at each switch point that offered a choice, by the
        #: number it joined under (0: the host): the schedule, for replay checks.
        self.trace: list[int] = []

    def __repr__(self) -> str:
        return f"SeededSchedule(seed={self.seed})"

    # -- membership ----------------------------------------------------------------
    def _admit(self, name: str) -> _Turn:
        """A new participant; joined by the baton holder, so numbers are deterministic."""
        with self._cond:
            turn = _Turn(self, len(self._turns), name)
            self._turns.append(turn)
            return turn

    def _enter(self, turn: _Turn) -> None:
        """On the participant's own thread: run once it holds the baton."""
        with self._cond:
            while self._holder is not turn and not self._ended:
                self._cond.wait()

    def _leave(self, turn: _Turn) -> None:
        """``turn``'s thread ends: hand the baton on for good."""
        with self._cond:
            turn.gone = True
            if self._ended or self._holder is not turn:
                return
            self._hand_on(turn)

    def _end(self) -> None:
        """Every participant runs free from now on."""
        with self._cond:
            self._ended = True
            self._holder = None
            self._cond.notify_all()

    # -- switch points -------------------------------------------------------------
    def _switch(self, turn: _Turn) -> None:
        with self._cond:
            if self._ended or self._holder is not turn:
                return
            turn.until = None
            self._hand_on(turn)

    def _wait_until(self, turn: _Turn, ready: Callable[[], bool], what: str) -> bool:
        """Give the baton away until ``ready()``; False if the schedule ended before
        it held (the caller then waits as it would outside a schedule)."""
        with self._cond:
            if self._ended or self._holder is not turn:
                return ready()
            turn.until, turn.what = ready, what
            self._hand_on(turn)
            return ready()

    def _hand_on(self, turn: _Turn) -> None:
        """``turn`` holds the baton: pick who runs next among the participants that can
        (``turn`` itself included), and return once ``turn`` holds it again; lock held."""
        try:
            while True:
                ready = [t for t in self._turns if t.can_run()]
                if ready:
                    break
                if _free_work(self):
                    self._cond.wait(_FREE_POLL_S)  # a stream outside the schedule
                    continue
                self._deadlock = self._stuck()
                self._ended = True
                self._holder = None
                self._cond.notify_all()
                if turn.gone:
                    return  # the waiters left run free (and block for good)
                raise ScheduleDeadlock(self._deadlock)
            if len(ready) == 1:
                chosen = ready[0]
            else:
                chosen = ready[self._rng.randrange(len(ready))]
                self.trace.append(chosen.number)
            self._holder = chosen
            if chosen is turn or turn.gone:
                self._cond.notify_all()
                return
            self._cond.notify_all()
            while self._holder is not turn and not self._ended:
                self._cond.wait()
        finally:
            turn.until = None

    def _stuck(self) -> str:
        waits = "; ".join(
            f"{t.name} waits for {t.what or 'its turn'}"
            for t in self._turns
            if not t.gone
        )
        return (
            f"seeded schedule {self.seed}: every thread waits and none can go on "
            f"({waits}); replay it with RELAY_SCHEDULE_SEED={self.seed}"
        )


#: Between two looks at a wait on a stream outside the seeded schedule.
_FREE_POLL_S = 0.005
#: The seeded schedule in force, or ``None`` (the default: threads run free).
_schedule: SeededSchedule | None = None


def _turn() -> _Turn | None:
    """The calling thread's place in the seeded schedule in force, if it has one."""
    turn = _local.turn
    if turn is None or turn.schedule is not _schedule:
        return None
    return turn


def _switch() -> None:
    """A switch point: in a seeded schedule, maybe let another participant run."""
    turn = _turn()
    if turn is not None:
        turn.schedule._switch(turn)


def _wait_until(ready: Callable[[], bool], what: str) -> bool:
    """In a seeded schedule, let the others run until ``ready()`` holds; False outside
    one (the caller waits its own way)."""
    turn = _turn()
    if turn is None:
        return False
    return turn.schedule._wait_until(turn, ready, what)


def _free_work(schedule: SeededSchedule) -> bool:
    """Whether a stream outside ``schedule`` has work left (it may yet satisfy a
    participant's wait)."""
    return any(
        (s._turn is None or s._turn.schedule is not schedule) and s.oldest_pending()
        for s in list(_live_streams)
    )


def switch_point() -> None:
    """A point where a seeded schedule may switch to another thread (debug mode calls
    it at every relay call); free outside one."""
    if _schedule is not None:
        _switch()


def active_schedule() -> SeededSchedule | None:
    """The seeded schedule in force (Note [Seeded schedules]), or ``None``."""
    return _schedule


@contextmanager
def seeded_schedule(seed: int) -> Iterator[SeededSchedule]:
    """Run the calling thread and the workers of the ``ThreadStream``s made inside the
    block in the interleaving ``seed`` draws (Note [Seeded schedules])::

        with seeded_schedule(7):
            run_workload(config)  # the same interleaving every time
    """
    global _schedule
    if _schedule is not None:
        raise RuntimeError(f"{_schedule!r} is already in force; one at a time")
    schedule = SeededSchedule(seed)
    host = schedule._admit(f"host thread {threading.current_thread().name!r}")
    schedule._holder = host
    previous = _local.turn
    _local.turn = host
    _schedule = schedule
    try:
        yield schedule
    finally:
        _schedule = None
        _local.turn = previous
        schedule._end()


def schedule_seed_from_env() -> int | None:
    """The seed ``RELAY_SCHEDULE_SEED`` names (to replay a schedule), or ``None``."""
    value = os.environ.get("RELAY_SCHEDULE_SEED", "").strip()
    return int(value) if value else None


class Gate:
    """A flag one thread sets and another waits for, which a seeded schedule sees (a
    plain ``threading.Event`` wait would hold the baton: Note [Seeded schedules])."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        """Open the gate."""
        self._event.set()

    def is_set(self) -> bool:
        """Whether the gate is open."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the gate opens (``timeout``: a guard outside a schedule)."""
        if _wait_until(self._event.is_set, "a gate"):
            return True
        return self._event.wait(timeout)


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
        # Tasks up to this ticket were queued behind a failed task before the host saw
        # the failure: they are skipped, as work behind a failed device assert is.
        self._skip_through = 0
        self._busy_seconds = 0.0
        self._exited = False
        # Made by a participant of a seeded schedule: the worker joins it (Note
        # [Seeded schedules]); otherwise it runs free.
        creator = _turn() if _schedule is not None else None
        self._turn = (
            creator.schedule._admit(repr(self)) if creator is not None else None
        )
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
        if _schedule is not None:
            _switch()
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

        def ready() -> bool:
            return done() or self._finished >= ticket or self._error is not None

        if _schedule is None or not _wait_until(ready, f"{self!r}'s task {ticket}"):
            with self._cond:
                self._cond.wait_for(ready)
        with self._cond:
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
        """Re-raise, on the host, an exception a task raised on the worker. The tasks
        queued behind it by then are skipped (the first failure is the one to report);
        tasks submitted later run."""
        if self._error is not None:
            with self._cond:
                self._skip_through = self._submitted
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
        if _schedule is not None:
            _wait_until(lambda: self._exited, f"{self!r} to stop")
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

    def on_worker(self) -> bool:
        """Whether the calling thread is this stream's worker."""
        return threading.current_thread() is self._thread

    def notify(self) -> None:
        """Wake host waiters (a record completed)."""
        with self._cond:
            self._cond.notify_all()

    def _run(self) -> None:
        _local.stream = self
        turn = self._turn
        if turn is not None:
            _local.turn = turn
            turn.schedule._enter(turn)
        try:
            self._serve(turn)
        finally:
            self._exited = True
            if turn is not None:
                turn.schedule._leave(turn)

    def _serve(self, turn: _Turn | None) -> None:
        tasks = self._tasks
        while True:
            if turn is not None:
                turn.schedule._wait_until(turn, lambda: not tasks.empty(), "a task")
            item = tasks.get()
            if item is None:
                return
            ticket, fn, token = item
            if turn is not None:
                turn.schedule._switch(turn)
            self._running_ticket = ticket
            with self._cond:
                self._running_order = self._pending[0][0]
            start = time.perf_counter()
            try:
                if self._error is None and ticket > self._skip_through:
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
                if turn is not None:
                    turn.schedule._switch(turn)


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
        if _schedule is not None:
            _switch()
        stream = current_cpu_stream()
        if observer is not None:
            # A task's record sits at its submission in host order; a host's, now.
            order = stream.running_order if stream is not None else _host_order()
            token = observer.recorded(self)
            self._history.append((order, token))
            self._forget_unreachable()
        if stream is not None:
            self._records[stream] = stream.running_ticket
            stream.notify()

    def record_chained(self) -> None:
        """Record as a chained fence does (Note [Fence chaining] in relay/device.py),
        in host order (Note [Fence chaining in host order]): after the newest record
        made before this task in host order, whichever stream and whenever it ran."""
        self.wait()
        self.record()

    def synchronize(self) -> None:
        """Block the calling thread until the newest record has completed."""
        if _schedule is not None:
            _switch()
        if not _live_streams and observer is None:
            return  # no stream can hold pending work and nothing to report: synchronous
        current = current_cpu_stream()
        # See Note [Host order of CPU records].
        before = current.running_order if current is not None else None
        horizon = before if before is not None else _host_order()
        streams = list(_live_streams)
        if _schedule is not None:
            streams.sort(key=lambda s: s.serial)  # the same waits on every replay
        for stream in streams:
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
