"""Timing: per-device timers, interleaved samples in balanced orders (docs/bench.md)."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

__all__ = ["balanced_orders", "figures", "per_method", "quartiles", "time_interleaved"]
__all__ += ["timer_for"]

Timer = Callable[[Callable[[], None], int], int]


def timer_for(device: torch.device) -> Timer:
    """A timer of ``inner`` calls in ns: CUDA events on CUDA, else host clocks."""
    if device.type == "cuda":
        cuda: Any = torch.cuda  # Event's constructor is untyped
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)

        def events(fn: Callable[[], None], inner: int) -> int:
            torch.cuda.synchronize(device)  # nothing earlier leaks into the sample
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return int(start.elapsed_time(end) * 1e6)

        return events
    sync = torch.get_device_module(device.type).synchronize  # torch.cpu's: a no-op

    def host(fn: Callable[[], None], inner: int) -> int:
        sync()
        begin = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        sync()
        return time.perf_counter_ns() - begin

    return host


def quartiles(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
    """Quartiles of the per-repeat ratios ``num / den``: drift between repeats cancels."""
    per = [n / d for n, d in zip(num, den)]
    q = statistics.quantiles(per * (2 if len(per) == 1 else 1), n=4, method="inclusive")
    return {"p25": q[0], "median": q[1], "p75": q[2]}


def figures(
    steps: Mapping[str, Callable[[], None]], device: torch.device, flags: Any
) -> dict[str, Any]:
    """``steps`` timed as the flags say: median ns of each, generated / the others."""
    fns, target = list(steps.values()), int(flags.sample_ms * 1e6)
    kw = {"repeat": flags.repeat, "warmup": flags.warmup, "target_ns": target}
    samples = time_interleaved(fns, timer_for(device), **kw)
    times = dict(zip(steps, samples))
    out: dict[str, Any] = {"ns": {k: statistics.median(t) for k, t in times.items()}}
    for k, t in times.items():
        if k != "generated":
            out[f"generated/{k}"] = quartiles(times["generated"], t)
    return out


# Note [Balanced order]
# A sample's time depends on what ran just before it (the sides share the caches), so
# a fixed rotation biases every repeat of a ratio the same way and the median keeps
# the bias. The orders are rows of a Williams design, the crossover trials' answer to
# carryover: each side follows each other side equally often.


def balanced_orders(count: int, repeat: int) -> Iterator[list[int]]:
    """``repeat`` orders of ``range(count)``, rows of a Williams design."""
    first = [0]
    for k in range(1, count):
        first.append((k + 1) // 2 if k % 2 else count - k // 2)
    rows = [[(i + r) % count for i in first] for r in range(count)]
    if count % 2:
        rows += [row[::-1] for row in rows]
    for r in range(repeat):
        yield rows[r % len(rows)]


def time_interleaved(fns: Sequence[Callable[[], None]], timer: Timer, *, repeat: int,
                     warmup: int, target_ns: int) -> list[list[float]]:  # fmt: skip
    """Per-call ns of each function, one sample of about ``target_ns`` per repeat."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    probe = statistics.median(timer(fns[0], 1) for _ in range(5))
    inner = max(1, min(10_000, int(target_ns // max(probe, 1))))
    samples: list[list[float]] = [[] for _ in fns]
    with _no_gc():
        for order in balanced_orders(len(fns), repeat):
            for i in order:
                samples[i].append(timer(fns[i], inner) / inner)
    return samples


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def per_method(sides: Sequence[Sequence[tuple[str, Callable[[], None]]]], device: torch.device,
               *, repeat: int, inner: int) -> list[dict[str, float]]:  # fmt: skip
    """Per side, the host ns per step of each method, ``device sync`` off the CPU and
    ``step``, each the quietest sample's (docs/bench.md, host time per method)."""
    sync, clock = torch.get_device_module(device.type).synchronize, time.perf_counter_ns
    samples: list[list[list[int]]] = [[] for _ in sides]
    with _no_gc():
        for _ in range(repeat):
            for calls, kept in zip(sides, samples):
                fns = [fn for _, fn in calls]
                parts = [0] * (len(fns) + 2)
                sync()
                begin = clock()
                for _ in range(inner):
                    for k, fn in enumerate(fns):
                        t = clock()
                        fn()
                        parts[k] += clock() - t
                t = clock()
                sync()
                parts[-2] = clock() - t
                parts[-1] = clock() - begin
                kept.append(parts)
    out = []
    for calls, kept in zip(sides, samples):
        names = [name for name, _ in calls] + (["device sync"] * (device.type != "cpu"))
        quietest = [min(column) / inner for column in zip(*kept)]
        out.append({**dict(zip(names, quietest)), "step": quietest[-1]})
    return out
