"""Named ranges of each step's work, and a Chrome trace of them (``relay demo --trace``).

The engine opens a range around each piece of a step's work, named ``"<what> <step>"``
(``"forward 12"``), on the thread that does it. ``record`` writes them as a Chrome
trace, threads named after their role, and on CUDA each kernel on its stream; ``load``
reads such a file back as ``Span``s, for tests and ``relay demo --plot``.

Note [Ranges that cost nothing when off]
A run chooses its ``Ranges`` once, when it starts (``ranges_for``): with tracing
off every call site gets ``no_ranges``, which returns one shared, reusable
``nullcontext`` and formats no name, so the hot loop pays one call and an empty
``with`` per range and tests no flag. Ranges wrap the engine's calls into the
generated maps, never code inside them: the maps stay as generated.

Note [Ranges kept by relay, kernels by the profiler]
A traced range is two clock readings appended to a list, the whole trace's memory is
a tuple per range. ``torch.profiler`` is used for one thing only, the CUDA kernels
and copies with their streams: asked for the CPU too, it records every torch
operator on every thread (dozens per forward) and its export holds them all in
memory at once, several times what the traced runs themselves need. Both
clocks are the wall clock (the profiler's trace states its base in
``baseTimeNanoseconds``), so kernels line up with the ranges that launched them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import attrs
import torch

__all__ = ["BUILD", "FENCE_WAIT", "FORWARD", "FORWARD_THREAD", "HOST_SEQ_LENS"]
__all__ += ["HOST_WAIT", "KEPT_CATEGORIES", "PROCESS", "PUBLISH", "RELEASE"]
__all__ += ["RESOLVE_FUTURE", "RESOLVE_SEQ_LENS", "RUN", "SCHEDULER_THREAD", "STASH"]
__all__ += ["Ranges", "Span", "Trace", "load", "no_ranges", "ranges_for", "record"]

# What each range names (its step number follows, after a space).
#: Scheduler: admit, filter and merge the running batch, pick the rows of step N.
BUILD = "build batch"
#: Scheduler: the schedule lane's resolve (``resolve_seq_lens_cpu``), and inside it
#: the wait on the map's fence (the publish of the forward before).
RESOLVE_SEQ_LENS = "resolve_seq_lens_cpu"
FENCE_WAIT = "fence wait"
#: Scheduler: lengths from the host (plain decoding), or read from the finished
#: previous step (the synchronous loop).
HOST_SEQ_LENS = "seq_lens on host"
#: Scheduler: the host blocked until forward N (and its host copies) finished.
HOST_WAIT = "host wait"
#: Scheduler: step N's tokens appended, detokenized, requests finished.
PROCESS = "process"
#: The whole forward of step N, and the relay calls inside it.
FORWARD = "forward"
RESOLVE_FUTURE = "resolve_future"
PUBLISH = "publish"
STASH = "stash"
RELEASE = "release"
#: Scheduler thread: one whole run, named ``"run <mode> <loop>"`` with step 0.
RUN = "run"

#: Row names of the two threads (``record`` names the trace's threads with them).
SCHEDULER_THREAD = "scheduler thread"
FORWARD_THREAD = "forward worker"

_NAME = re.compile(r"^(?P<what>[a-z_ ]+?) (?P<step>\d+)$")


class Ranges(Protocol):
    """Opens the range ``"<what> <step>"`` on the calling thread."""

    def __call__(self, what: str, step: int) -> AbstractContextManager[object]: ...


_OFF = contextlib.nullcontext()


def no_ranges(what: str, step: int) -> AbstractContextManager[object]:
    """Tracing off: the shared empty context (Note [Ranges that cost nothing when off])."""
    return _OFF


#: The role of each thread that opened a range, to name it in the trace.
_THREADS: dict[int, str] = {}
#: The ranges of the recording in progress (``record``): ``(name, thread, start ns,
#: end ns)``; None when nothing records. ``list.append`` is atomic, so the scheduler
#: thread and the forward worker append without a lock.
_RECORDED: list[tuple[str, int, int, int]] | None = None


class _Range:
    """One traced range: the wall clock at its start and its end (Note [Ranges kept
    by relay, kernels by the profiler])."""

    __slots__ = ("name", "start")

    def __init__(self, name: str) -> None:
        self.name = name
        self.start = 0

    def __enter__(self) -> None:
        self.start = time.time_ns()

    def __exit__(self, *exc: object) -> None:
        end = time.time_ns()
        recorded = _RECORDED
        if recorded is not None:
            recorded.append((self.name, threading.get_native_id(), self.start, end))


def _traced_ranges(what: str, step: int) -> AbstractContextManager[object]:
    """Tracing on: a range on the calling thread, kept while ``record`` runs."""
    tid = threading.get_native_id()
    if tid not in _THREADS:
        main = threading.current_thread() is threading.main_thread()
        _THREADS[tid] = SCHEDULER_THREAD if main else FORWARD_THREAD
    return _Range(f"{what} {step}")


def ranges_for(tracing: bool) -> Ranges:
    """The ranges of a run, chosen once when it starts."""
    return _traced_ranges if tracing else no_ranges


#: Trace event categories of the device work ``record`` keeps from the profiler.
KEPT_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence the profiler's own start and stop lines (written by C++ to fd 2)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def record(path: Path, device: torch.device | str = "cpu") -> Iterator[None]:
    """Record the block's ranges (runs inside it trace only with
    ``EngineConfig(trace=True)``) and, on CUDA, its kernels; write them to ``path`` as
    a Chrome trace, threads named by role."""
    global _RECORDED
    ranges: list[tuple[str, int, int, int]] = []
    profiler = None
    if torch.device(device).type == "cuda":
        # Note [Ranges kept by relay, kernels by the profiler]
        activities = [torch.profiler.ProfilerActivity.CUDA]
        profiler = torch.profiler.profile(activities=activities)
        with _quiet_stderr():
            profiler.start()
    _RECORDED = ranges
    try:
        yield
    finally:
        _RECORDED = None
        if profiler is not None:
            with _quiet_stderr():
                profiler.stop()
    pid = os.getpid()
    base = min((start for _, _, start, _ in ranges), default=time.time_ns())
    events: list[dict[str, Any]] = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": (start - base) / 1000,
            "dur": (end - start) / 1000,
        }
        for name, tid, start, end in ranges
    ]
    for tid in sorted({tid for _, tid, _, _ in ranges}):
        role = _THREADS.get(tid)
        name = f"{role} ({tid})" if role is not None else f"thread {tid}"
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": tid,
                "args": {"name": name},
            }
        )
    if profiler is not None:
        events += _device_events(profiler, path, base)
    data = {"traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": base}
    Path(path).write_text(json.dumps(data), encoding="utf-8")


def _device_events(
    profiler: torch.profiler.profile, path: Path, base: int
) -> list[dict[str, Any]]:
    """The profiler's kernels and copies, their times moved onto the ranges' clock
    (microseconds from ``base`` ns). The profiler writes its own trace to ``path``
    first; ``record`` then writes the whole trace over it."""
    profiler.export_chrome_trace(str(path))
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    shift = (int(data.get("baseTimeNanoseconds", 0)) - base) / 1000
    kept = []
    for event in data.get("traceEvents", []):
        if event.get("ph") == "X" and event.get("cat") in KEPT_CATEGORIES:
            event["ts"] = float(event["ts"]) + shift
            kept.append(event)
    return kept


@attrs.frozen
class Span:
    """One range of a trace: ``what`` of step ``step`` on thread (or stream) ``row``."""

    what: str
    step: int
    row: str
    #: Microseconds, on the trace's clock.
    start: float
    end: float

    def overlaps(self, other: Span) -> bool:
        """Whether the two ranges were open at the same time."""
        return self.start < other.end and other.start < self.end

    def holds(self, other: Span) -> bool:
        """Whether ``other`` was open only while this range was."""
        return self.start <= other.start and other.end <= self.end


@attrs.frozen
class Trace:
    """The engine's ranges in a trace file, and the device kernels if any."""

    spans: tuple[Span, ...]
    #: CUDA kernels, ``what`` = the kernel name, ``row`` = its stream, ``step`` = 0.
    kernels: tuple[Span, ...]

    def runs(self) -> dict[str, Trace]:
        """The trace of each run (``"decode sync"``, ``"eagle overlap"``, ...)."""
        found: dict[str, Trace] = {}
        for run in (s for s in self.spans if s.what.startswith(f"{RUN} ")):
            spans = [s for s in self.spans if run.holds(s) and s is not run]
            kernels = [k for k in self.kernels if run.holds(k)]
            found[run.what.removeprefix(f"{RUN} ")] = Trace(
                tuple(spans), tuple(kernels)
            )
        return found

    def named(self, what: str) -> dict[int, Span]:
        """The ``what`` range of each step (the last one, if a step has several)."""
        return {s.step: s for s in self.spans if s.what == what}


def load(path: Path) -> Trace:
    """The engine's ranges (and kernels) of the Chrome trace at ``path``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    events = data["traceEvents"] if isinstance(data, dict) else data
    threads = {
        (e.get("pid"), e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    spans: list[Span] = []
    kernels: list[Span] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        start, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        row = threads.get((e.get("pid"), e.get("tid")), str(e.get("tid")))
        name, ours = str(e["name"]), e.get("cat") == "user_annotation"
        match = _NAME.match(name)
        if e.get("cat") == "kernel":
            kernels.append(Span(name, 0, f"stream {e.get('tid')}", start, end))
        elif ours and name.startswith(f"{RUN} "):
            spans.append(Span(name.rsplit(" ", 1)[0], 0, row, start, end))
        elif ours and match is not None:
            spans.append(Span(match["what"], int(match["step"]), row, start, end))
    spans.sort(key=lambda s: (s.start, -s.end))
    kernels.sort(key=lambda s: s.start)
    return Trace(tuple(spans), tuple(kernels))
