"""Timing: per-device timers, interleaved sampling, and the machine's copy bandwidth.

Every figure ``relay bench`` reports is a ratio of two sides measured in the same
process, interleaved, so machine speed, load and drift cancel out; a second baseline
timed like the first (the A/A control) shows how far pure noise moves a ratio.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import attrs
import torch

__all__ = [
    "CudaTimer",
    "HostTimer",
    "Series",
    "SyncedHostTimer",
    "Timer",
    "balanced_orders",
    "copy_bandwidth",
    "quantile",
    "ratio",
    "time_interleaved",
    "timer_for",
]


class Timer(Protocol):
    """Measures ``inner`` back-to-back calls of a function, in nanoseconds."""

    def measure(self, fn: Callable[[], None], inner: int) -> int: ...


class HostTimer:
    """CPU: ops are synchronous, so host wall time is the cost."""

    def measure(self, fn: Callable[[], None], inner: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        return time.perf_counter_ns() - start


class CudaTimer:
    """CUDA: events on the current stream around the calls, then a synchronize, so the
    queued device work is inside the sample."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        cuda: Any = torch.cuda  # Event's constructor is untyped
        self.start: Any = cuda.Event(enable_timing=True)
        self.end: Any = cuda.Event(enable_timing=True)

    def measure(self, fn: Callable[[], None], inner: int) -> int:
        torch.cuda.synchronize(self.device)  # nothing earlier leaks into the sample
        self.start.record()
        for _ in range(inner):
            fn()
        self.end.record()
        self.end.synchronize()
        return int(self.start.elapsed_time(self.end) * 1e6)


class SyncedHostTimer:
    """Other accelerators (xpu, mps, ...): host clocks around a device synchronize."""

    def __init__(self, device: torch.device) -> None:
        self.module: Any = torch.get_device_module(device.type)

    def measure(self, fn: Callable[[], None], inner: int) -> int:
        self.module.synchronize()
        start = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        self.module.synchronize()
        return time.perf_counter_ns() - start


def timer_for(device: torch.device) -> Timer:
    """CUDA events on CUDA, host clocks on the CPU, synchronized host clocks elsewhere."""
    if device.type == "cuda":
        return CudaTimer(device)
    if device.type == "cpu":
        return HostTimer()
    return SyncedHostTimer(device)


@attrs.define
class Series:
    """Per-call times (ns) of one side, one sample per repeat."""

    name: str
    samples: list[float] = attrs.field(factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` of ``values``."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def ratio(num: Series, den: Series) -> float:
    """Median over repeats of ``num / den`` within a repeat: drift between repeats
    hits both sides alike and cancels."""
    return statistics.median(n / d for n, d in zip(num.samples, den.samples))


# Note [Balanced order]
# A sample's time depends on what ran just before it: the sides share the caches, and
# one that follows a side which evicted them (the baseline's step allocates more, its
# buffers are other memory) starts colder. Rotating a fixed order keeps every side's
# predecessor the same in every repeat (generated always after the baseline, the floor
# always after generated), which biases each ratio the same way in every repeat, so
# the median keeps it: on the development machine EAGLE at batch 1 read gen/floor
# 1.31x-1.38x rotated and 1.21x-1.24x in shuffled orders, where an identical copy of
# the generated map read 1.01x against it. The orders are rows of a Williams design
# (the crossover trials' answer to carryover): each side follows each other side
# equally often, so what comes before weighs on every side alike.


def balanced_orders(count: int, repeat: int) -> Iterator[list[int]]:
    """``repeat`` orders of ``range(count)`` from a Williams design (Note [Balanced
    order]): over every ``count`` repeats (``2 * count`` for an odd count) each side
    comes right after each other side exactly as often, and first as often as any."""
    first = [0]
    for k in range(1, count):
        first.append((k + 1) // 2 if k % 2 else count - k // 2)
    rows = [[(i + r) % count for i in first] for r in range(count)]
    if count % 2:
        rows += [row[::-1] for row in rows]
    for r in range(repeat):
        yield rows[r % len(rows)]


def time_interleaved(
    fns: Sequence[tuple[str, Callable[[], None]]],
    timer: Timer,
    *,
    repeat: int,
    warmup: int,
    target_ns: int,
) -> tuple[list[Series], int]:
    """Time each function ``repeat`` times, interleaved; return per-call samples and
    the calls per sample.

    Warmup first (lazy allocation, allocator caches, first dispatch). One sample is
    ``inner`` back-to-back calls, ``inner`` calibrated on the first function so a
    sample lasts about ``target_ns``. Within a repeat each function runs once, the
    orders balanced over repeats (Note [Balanced order]). The garbage collector is off
    while timing.
    """
    for _, fn in fns:
        for _ in range(warmup):
            fn()
    # Median of a few single calls: one descheduled probe must not set inner to 1.
    probe = int(statistics.median(timer.measure(fns[0][1], 1) for _ in range(5)))
    inner = max(1, min(10_000, target_ns // max(probe, 1)))
    series = [Series(name) for name, _ in fns]
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for order in balanced_orders(len(fns), repeat):
            for i in order:
                series[i].samples.append(timer.measure(fns[i][1], inner) / inner)
    finally:
        if was_enabled:
            gc.enable()
    return series, inner


def copy_bandwidth(device: torch.device, megabytes: int, *, repeat: int = 5) -> float:
    """The machine's copy bandwidth on ``device`` in bytes per second: the best of
    ``repeat`` copies of a ``megabytes`` tensor, counting the read and the write."""
    n = megabytes * 2**20
    src = torch.ones((n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer = timer_for(device)

    def copy() -> None:
        dst.copy_(src)

    copy()  # first touch of the pages stays out of the figure
    best = min(timer.measure(copy, 1) for _ in range(repeat))
    return 2 * n / (max(best, 1) * 1e-9)
