"""Forward executors: where a step's forward runs, how the host waits for it, busy time.

(Not to be confused with a relay field's ``Lane``, the schema word for the forward
and schedule halves of a map.)

- ``InlineExecutor``: CPU, synchronous: the forward runs in the scheduler's thread.
- ``WorkerExecutor``: CPU, overlap: forwards run in order on a ``ThreadStream``
  worker, so the scheduler's Python really runs while the forward's torch ops do; with
  a schedule seed (or ``RELAY_SCHEDULE_SEED``), the worker and the scheduler take turns
  in the interleaving the seed draws (Note [Seeded schedules] in relay/cpu_stream.py).
- ``CudaStreamExecutor``: a private CUDA forward stream; synchronous mode waits after
  each launch, overlap mode does not.

Each executor's own waits reach debug mode's happens-before checker: ThreadStreams
report theirs, and ``CudaStreamExecutor`` reports its stream wait, records and
synchronizes through ``relay.debug`` (free when the checker is off).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from relay import debug
from relay.cpu_stream import (
    ThreadStream,
    active_schedule,
    schedule_seed_from_env,
    seeded_schedule,
)

__all__ = [
    "CudaStreamExecutor",
    "ForwardExecutor",
    "InlineExecutor",
    "WorkerExecutor",
    "make_executor",
]


# Note [Host turns on the CPU worker]
# A CPU forward has a host-side part, in Python (relay resolve and publish, the
# collective, the host copies), and its kernels, which run without the GIL (Note
# [Forwards without the GIL] in relay/engine/model.py). While both threads run
# Python, each torch op of the forward waits up to a switch interval for the GIL.
# The moment that collides is the start of step N+1, which the worker begins as
# soon as N ends, just when the scheduler wakes to process N. So ``wait(N)`` also
# waits until N+1 has called ``kernels_started`` (or finished): the forward's
# prologue gets the host alone, and the scheduler's Python runs beside its kernels,
# as a GPU's kernels run beside the host. On CUDA launches are asynchronous and
# there is nothing to wait for.

#: ``torch.cuda``'s stream and event constructors are untyped; reach them through Any.
_cuda: Any = torch.cuda


class ForwardExecutor(Protocol):
    """Runs forwards in launch order."""

    def launch(self, fn: Callable[[], None]) -> Any:
        """Start ``fn`` behind every earlier launch; returns a handle for ``wait``."""

    def wait(self, handle: Any) -> None:
        """Block the host until the launch ``handle`` has finished (its host copies too)."""

    def kernels_started(self) -> None:
        """Called by a forward, on the executor, when the host-side work before its kernels
        is done (Note [Host turns on the CPU worker])."""

    def busy_seconds(self) -> float:
        """Time the executor spent running forwards so far (waits for in-flight ones)."""

    def close(self) -> None:
        """Finish queued work and release threads or streams."""


class InlineExecutor:
    """Synchronous CPU: ``launch`` runs the forward before it returns."""

    def __init__(self) -> None:
        self._busy = 0.0

    def launch(self, fn: Callable[[], None]) -> Any:
        start = time.perf_counter()
        fn()
        self._busy += time.perf_counter() - start
        return None

    def wait(self, handle: Any) -> None:
        pass

    def kernels_started(self) -> None:
        pass

    def busy_seconds(self) -> float:
        return self._busy

    def close(self) -> None:
        pass


class WorkerExecutor:
    """Overlap on the CPU: forwards run on a ``ThreadStream`` worker thread.

    ``schedule_seed``: the worker and the calling thread (the scheduler) run in the
    seeded schedule of that seed until ``close`` (unless one is in force already), so
    a run's interleaving replays exactly."""

    def __init__(
        self, threads: int | None = None, *, schedule_seed: int | None = None
    ) -> None:
        self._schedule = contextlib.ExitStack()
        if schedule_seed is not None and active_schedule() is None:
            self._schedule.enter_context(seeded_schedule(schedule_seed))
        self.stream = ThreadStream("relay-forward")
        self._started = 0  # ticket of the newest forward whose kernels started
        if threads is not None:
            # OpenMP's thread count is per calling thread: set it on the worker too,
            # or the forward would use more cores than in the synchronous run.
            self.stream.submit(lambda: torch.set_num_threads(threads))

    def launch(self, fn: Callable[[], None]) -> Any:
        return self.stream.submit(fn)

    def wait(self, handle: Any) -> None:
        # Not a CpuEvent: an event wait also covers every later launch (Note [Host
        # order of CPU records]), and the next step is already queued behind this one.
        ticket = int(handle)
        self.stream.wait_ticket(ticket, lambda: False)
        following = ticket + 1  # Note [Host turns on the CPU worker]
        if self.stream.submitted >= following:
            # A courtesy to the worker, not an order the engine relies on: a GPU has
            # no such wait, so debug mode must not see the host after N+1 (join=False).
            self.stream.wait_ticket(
                following, lambda: self._started >= following, join=False
            )

    def kernels_started(self) -> None:
        self._started = self.stream.running_ticket
        self.stream.notify()

    def busy_seconds(self) -> float:
        self.stream.synchronize()
        return self.stream.busy_seconds

    def close(self) -> None:
        try:
            self.stream.synchronize()
            self.stream.close()
        finally:
            self._schedule.close()


class CudaStreamExecutor:
    """A private CUDA forward stream; ``sync`` waits for each forward at launch."""

    def __init__(self, device: torch.device, *, sync: bool) -> None:
        self.device = device
        self.sync = sync
        self.stream = _cuda.Stream(device)
        self._timings: list[tuple[Any, Any]] = []

    def launch(self, fn: Callable[[], None]) -> Any:
        # The batch's tensors were made on the scheduler's stream.
        scheduler = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(scheduler)
        debug.wait_stream(self.stream, scheduler)
        start = _cuda.Event(enable_timing=True)
        done = _cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record()
            fn()
            done.record()
            debug.record_event(done, self.stream)
        self._timings.append((start, done))
        if self.sync:
            self.wait(done)
        return done

    def wait(self, handle: Any) -> None:
        handle.synchronize()
        debug.synchronize_event(handle)

    def kernels_started(self) -> None:
        pass

    def busy_seconds(self) -> float:
        self.stream.synchronize()
        debug.synchronize_stream(self.stream)
        return float(sum(s.elapsed_time(e) for s, e in self._timings)) / 1000.0

    def close(self) -> None:
        self.stream.synchronize()
        debug.synchronize_stream(self.stream)


def make_executor(
    device: torch.device,
    *,
    overlap: bool,
    cpu_threads: int | None = None,
    schedule_seed: int | None = None,
) -> ForwardExecutor:
    """The executor for ``device`` and loop mode; ``cpu_threads`` for the CPU worker;
    ``schedule_seed`` (default: ``RELAY_SCHEDULE_SEED``, if set) runs the CPU worker
    in that seeded schedule (Note [Seeded schedules] in relay/cpu_stream.py)."""
    if device.type == "cuda":
        return CudaStreamExecutor(device, sync=not overlap)
    if device.type != "cpu":
        raise ValueError(
            f"the reference engine runs on cpu or cuda, not {device.type!r}"
        )
    if not overlap:
        return InlineExecutor()
    if schedule_seed is None:
        schedule_seed = schedule_seed_from_env()
    return WorkerExecutor(cpu_threads, schedule_seed=schedule_seed)
