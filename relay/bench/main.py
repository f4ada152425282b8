"""``relay bench``: the generated maps against a hand-written baseline, side by side.

Every figure is a ratio, generated / baseline, measured in the same process with
the two implementations interleaved, so machine speed, load and drift cancel out.
See docs/bench.md for the methodology and the figures measured on one machine.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from relay.bench.baseline import DecodeFutureMapBaseline, EagleFutureMapBaseline
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.eagle import EagleFutureMap, EaglePayload

__all__ = [
    "MAPS",
    "OPS",
    "SIZES",
    "Batch",
    "Config",
    "ConfigResult",
    "CudaTimer",
    "HostTimer",
    "OpResult",
    "Report",
    "Series",
    "SyncedHostTimer",
    "SpecInfo",
    "Timer",
    "Workload",
    "add_arguments",
    "bench",
    "bench_config",
    "build_sides",
    "compare_values",
    "configs_for",
    "device_bytes",
    "engine_section",
    "format_report",
    "run",
    "time_interleaved",
    "timer_for",
]

#: The relays benchmarked, named as their schemas are.
MAPS = ("decode", "eagle")
#: The timed operations; ``step`` is one whole relay step (see ``build_sides``).
OPS = ("stash", "publish", "invalidate", "resolve_future", "resolve_seq_lens_cpu", "step")

#: Size presets: pool sizes P, batch sizes B (kept <= P - 1), top-k K, hidden H (bf16).
SIZES: dict[str, dict[str, tuple[int, ...]]] = {
    "quick": {"pool": (257, 4097), "batch": (1, 64), "topk": (1,), "hidden": (4096,)},
    "default": {
        "pool": (257, 2049, 4097),
        "batch": (1, 8, 64, 256),
        "topk": (1, 8),
        "hidden": (4096,),
    },
    "full": {
        "pool": (257, 513, 2049, 4097),
        "batch": (1, 8, 32, 64, 256),
        "topk": (1, 4, 8),
        "hidden": (0, 4096, 7168),
    },
}


# ---------------------------------------------------------------------------
# Configurations and workloads


@dataclass(frozen=True)
class Config:
    """One benchmarked configuration. ``topk`` and ``hidden`` are 0 for decode;
    ``hidden`` 0 for EAGLE means the hidden state is not relayed (multi-layer draft)."""

    map: str
    pool: int
    batch: int
    topk: int = 0
    hidden: int = 0

    @property
    def label(self) -> str:
        """A short human-readable name."""
        text = f"{self.map} P={self.pool} B={self.batch}"
        if self.map == "eagle":
            text += f" K={self.topk} H={self.hidden}"
        return text


def configs_for(
    maps: Sequence[str],
    pools: Sequence[int],
    batches: Sequence[int],
    topks: Sequence[int],
    hiddens: Sequence[int],
) -> list[Config]:
    """The cross product of the sizes, dropping batches that do not fit the pool
    (row 0 is scratch, so at most P - 1 requests run at once)."""
    configs: list[Config] = []
    for name in maps:
        for pool in pools:
            for batch in batches:
                if batch > pool - 1:
                    continue
                if name == "decode":
                    configs.append(Config(name, pool, batch))
                    continue
                for topk in topks:
                    for hidden in hiddens:
                        configs.append(Config(name, pool, batch, topk, hidden))
    return configs


@dataclass
class SpecInfo:
    """The speculative-decoding part of a batch, as EAGLE resolves it."""

    topk_p: torch.Tensor
    topk_index: torch.Tensor
    hidden_states: torch.Tensor | None = None


@dataclass
class Batch:
    """A minimal scheduler batch with every attribute the maps read and write."""

    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    spec_info: SpecInfo


def _new_batch(indices: torch.Tensor) -> Batch:
    empty = indices.new_zeros((0,))
    return Batch(
        req_pool_indices=indices,
        input_ids=indices.new_zeros(indices.shape),
        seq_lens=empty,
        seq_lens_cpu=empty.cpu(),
        seq_lens_sum=0,
        spec_info=SpecInfo(topk_p=empty.float(), topk_index=empty),
    )


@dataclass
class Workload:
    """The tensors one step relays: what a forward pass produced for ``batch`` requests."""

    indices: torch.Tensor
    tokens: torch.Tensor
    new_seq_lens: torch.Tensor
    topk_p: torch.Tensor
    topk_index: torch.Tensor
    hidden_states: torch.Tensor | None

    @staticmethod
    def random(config: Config, device: torch.device, generator: torch.Generator) -> Workload:
        """Distinct slots in 1..P-1 (row 0 is scratch) and plausible values."""
        g = generator
        b, k = config.batch, max(config.topk, 1)
        indices = torch.randperm(config.pool - 1, generator=g)[:b] + 1
        hidden = None
        if config.hidden:
            hidden = torch.randn((b, config.hidden), generator=g).to(torch.bfloat16)
        return Workload(
            indices=indices.to(device),
            tokens=torch.randint(0, 150_000, (b,), generator=g).to(device),
            new_seq_lens=torch.randint(1, 32_768, (b,), generator=g).to(device),
            topk_p=torch.rand((b, k), generator=g).to(device),
            topk_index=torch.randint(0, 150_000, (b, k), generator=g).to(device),
            hidden_states=None if hidden is None else hidden.to(device),
        )


# ---------------------------------------------------------------------------
# The two (or three) implementations, behind the same six callables


@dataclass
class Side:
    """One implementation under test: its map, its batch and its timed operations."""

    name: str
    map: Any
    batch: Batch
    ops: dict[str, Callable[[], None]]


def build_sides(
    config: Config, device: torch.device, work: Workload, *, debug: bool = False
) -> tuple[Side, Side]:
    """The baseline and the generated map for ``config``, primed with one stash and
    one publish so lazy buffers exist and every resolve has fresh rows to read.

    ``step`` is one overlap iteration as an engine drives it: the scheduler writes
    placeholders (``invalidate``), the forward resolves them (``resolve_future``),
    publishes the new lengths mid-forward and stashes its outputs at the end, and
    the scheduler resolves the lengths to the host (``resolve_seq_lens_cpu``). Each
    resolve reads rows written since the last one, so ``step`` also runs in debug
    mode, where every value must be consumed exactly once. Building the payload is
    part of ``stash``: an engine builds one per forward.
    """
    w = work
    base_batch, gen_batch = _new_batch(w.indices), _new_batch(w.indices)
    base_ops: dict[str, Callable[[], None]]
    gen_ops: dict[str, Callable[[], None]]
    base_map: DecodeFutureMapBaseline | EagleFutureMapBaseline
    gen_map: DecodeFutureMap | EagleFutureMap
    if config.map == "decode":
        dbase = DecodeFutureMapBaseline(device, config.pool)
        dgen = DecodeFutureMap(device, config.pool, debug=debug)
        base_map, gen_map = dbase, dgen

        def base_stash() -> None:
            dbase.stash(w.indices, w.tokens)

        def gen_stash() -> None:
            dgen.stash(w.indices, DecodePayload(next_token_ids=w.tokens))

        base_ops = _ops(dbase, base_batch, w, base_stash)
        gen_ops = _ops(dgen, gen_batch, w, gen_stash)
    elif config.map == "eagle":
        ebase = EagleFutureMapBaseline(device, config.pool, topk=config.topk)
        egen = EagleFutureMap(device, config.pool, topk=config.topk, debug=debug)
        base_map, gen_map = ebase, egen

        def base_stash() -> None:
            ebase.stash(w.indices, w.tokens, w.topk_p, w.topk_index, w.hidden_states)

        def gen_stash() -> None:
            egen.stash(
                w.indices,
                EaglePayload(
                    bonus_tokens=w.tokens,
                    topk_p=w.topk_p,
                    topk_index=w.topk_index,
                    hidden_states=w.hidden_states,
                ),
            )

        base_ops = _ops(ebase, base_batch, w, base_stash)
        gen_ops = _ops(egen, gen_batch, w, gen_stash)
    else:
        raise ValueError(f"unknown map {config.map!r}; choose from {', '.join(MAPS)}")
    for ops in (base_ops, gen_ops):
        ops["stash"]()
        ops["publish"]()
    base = Side("baseline", base_map, base_batch, base_ops)
    gen = Side("generated+debug" if debug else "generated", gen_map, gen_batch, gen_ops)
    return base, gen


class _AnyMap(Protocol):
    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor) -> None: ...
    def invalidate(self, batch: Any, indices: torch.Tensor) -> None: ...
    def resolve_future(self, batch: Any) -> None: ...
    def resolve_seq_lens_cpu(self, batch: Any) -> None: ...


def _ops(
    relay_map: _AnyMap, batch: Batch, w: Workload, stash: Callable[[], None]
) -> dict[str, Callable[[], None]]:
    # The same closures for both implementations, so call overhead is identical.
    def publish() -> None:
        relay_map.publish(w.indices, w.new_seq_lens)

    def invalidate() -> None:
        relay_map.invalidate(batch, w.indices)

    def resolve_future() -> None:
        relay_map.resolve_future(batch)

    def resolve_seq_lens_cpu() -> None:
        relay_map.resolve_seq_lens_cpu(batch)

    def step() -> None:
        relay_map.invalidate(batch, w.indices)
        relay_map.resolve_future(batch)
        relay_map.publish(w.indices, w.new_seq_lens)
        stash()
        relay_map.resolve_seq_lens_cpu(batch)

    return {
        "stash": stash,
        "publish": publish,
        "invalidate": invalidate,
        "resolve_future": resolve_future,
        "resolve_seq_lens_cpu": resolve_seq_lens_cpu,
        "step": step,
    }


# ---------------------------------------------------------------------------
# Same values


def _batch_values(batch: Batch) -> dict[str, Any]:
    spec = batch.spec_info
    return {
        "input_ids": batch.input_ids,
        "seq_lens": batch.seq_lens,
        "seq_lens_cpu": batch.seq_lens_cpu,
        "seq_lens_sum": batch.seq_lens_sum,
        "spec_info.topk_p": spec.topk_p,
        "spec_info.topk_index": spec.topk_index,
        "spec_info.hidden_states": spec.hidden_states,
    }


def _buffers(relay_map: object) -> dict[str, torch.Tensor | None]:
    return {k: v for k, v in sorted(vars(relay_map).items()) if k.endswith("_buf")}


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.device == b.device
            and bool(torch.equal(a, b))
        )
    return type(a) is type(b) and a == b


def compare_values(
    config: Config, device: torch.device, *, steps: int = 4, seed: int = 0, debug: bool = False
) -> list[str]:
    """Drive the baseline and the generated map through ``steps`` relay steps with
    fresh random outputs each step and list every difference (empty: identical).

    The priming EAGLE payload omits the hidden state, so the lazy, per-stash
    allocation path is compared too; half of each batch holds real tokens instead
    of placeholders, as after a prefill. Buffers are compared only without debug
    mode, which poisons rows once they are consumed.
    """
    g = torch.Generator().manual_seed(seed)
    first = Workload.random(config, device, g)
    first.hidden_states = None  # the first stash allocates no hidden-state buffer
    base, gen = build_sides(config, device, first, debug=debug)
    problems: list[str] = []
    for step in range(steps):
        w = Workload.random(config, device, g)
        w.indices = first.indices  # the same requests, new outputs
        prefilled = torch.arange(config.batch, device=device) % 2 == 1
        for side in (base, gen):
            side_map = side.map
            side.map.invalidate(side.batch, w.indices)
            ids = side.batch.input_ids
            side.batch.input_ids = torch.where(prefilled, w.tokens, ids)
            side_map.resolve_future(side.batch)
            side_map.publish(w.indices, w.new_seq_lens)
            if isinstance(side_map, DecodeFutureMapBaseline):
                side_map.stash(w.indices, w.tokens)
            elif isinstance(side_map, EagleFutureMapBaseline):
                side_map.stash(w.indices, w.tokens, w.topk_p, w.topk_index, w.hidden_states)
            elif isinstance(side_map, DecodeFutureMap):
                side_map.stash(w.indices, DecodePayload(next_token_ids=w.tokens))
            else:
                side_map.stash(
                    w.indices,
                    EaglePayload(
                        bonus_tokens=w.tokens,
                        topk_p=w.topk_p,
                        topk_index=w.topk_index,
                        hidden_states=w.hidden_states,
                    ),
                )
            side_map.resolve_seq_lens_cpu(side.batch)
        for key, want in _batch_values(base.batch).items():
            got = _batch_values(gen.batch)[key]
            if not _same(want, got):
                problems.append(f"{config.label} step {step}: batch.{key} differs")
        if not debug:
            base_bufs, gen_bufs = _buffers(base.map), _buffers(gen.map)
            if list(base_bufs) != list(gen_bufs):
                problems.append(f"{config.label}: buffers {list(base_bufs)} != {list(gen_bufs)}")
            for key, want_buf in base_bufs.items():
                if key in gen_bufs and not _same(want_buf, gen_bufs[key]):
                    problems.append(f"{config.label} step {step}: {key} differs")
    return problems


# ---------------------------------------------------------------------------
# Memory


def device_bytes(relay_map: object, device: torch.device) -> int:
    """Bytes of the device tensors a map holds, its own and its helpers' (one level
    down: fences, host mirrors, debug bookkeeping), each storage counted once."""
    seen: set[int] = set()
    total = 0

    def visit(value: object) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            on_device = value.device.type == device.type and (
                device.index is None or value.device.index == device.index
            )  # "cuda" means any CUDA device; host mirrors (pinned CPU) never count
            if not on_device or value.untyped_storage().data_ptr() in seen:
                return
            seen.add(value.untyped_storage().data_ptr())
            total += value.untyped_storage().nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    for value in vars(relay_map).values():
        visit(value)
        if hasattr(value, "__dict__") and not isinstance(value, torch.Tensor):
            for inner in vars(value).values():
                visit(inner)
    return total


# ---------------------------------------------------------------------------
# Timing


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
    """CUDA: events around the calls, synchronized, so queued device work counts.

    The ops are launch-bound, so the events mostly measure the host's enqueue rate;
    the final synchronize makes sure the device work of the sample is inside it.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        cuda: Any = torch.cuda  # Event's constructor is untyped
        self.start: Any = cuda.Event(enable_timing=True)
        self.end: Any = cuda.Event(enable_timing=True)

    def measure(self, fn: Callable[[], None], inner: int) -> int:
        torch.cuda.synchronize(self.device)  # nothing earlier leaks into the sample
        self.start.record()  # on the current stream, where the ops enqueue
        for _ in range(inner):
            fn()
        self.end.record()
        self.end.synchronize()
        return int(self.start.elapsed_time(self.end) * 1e6)


class SyncedHostTimer:
    """Other accelerators (xpu, mps, ...): host clocks around a device synchronize,
    so queued work is inside the sample."""

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
    """The timer for ``device``: CUDA events on CUDA, host clocks elsewhere."""
    if device.type == "cuda":
        return CudaTimer(device)
    if device.type == "cpu":
        return HostTimer()
    return SyncedHostTimer(device)


@dataclass
class Series:
    """Per-call times (ns) of one implementation, one sample per repeat."""

    name: str
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)



def time_interleaved(
    fns: Sequence[tuple[str, Callable[[], None]]],
    timer: Timer,
    *,
    repeat: int,
    warmup: int,
    target_ns: int,
) -> tuple[list[Series], int]:
    """Time each function ``repeat`` times, interleaved, and return per-call samples
    and the number of calls per sample.

    Warmup first (lazy allocation, allocator caches, first-call dispatch). One
    sample is ``inner`` back-to-back calls, ``inner`` calibrated on the first
    function so a sample lasts about ``target_ns``, well above clock resolution.
    Within a repeat every function runs once, the order rotating between repeats,
    so slow drift (thermal, other load) hits all of them alike and the
    per-repeat ratios cancel it. The garbage collector is off while timing.
    """
    for _, fn in fns:
        for _ in range(warmup):
            fn()
    # Median of a few single calls: one descheduled probe must not set inner to 1.
    probe = int(statistics.median(timer.measure(fns[0][1], 1) for _ in range(5)))
    inner = max(1, min(10_000, target_ns // max(probe, 1)))
    series = [Series(name) for name, _ in fns]
    order = list(range(len(fns)))
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeat):
            turn = order[r % len(order):] + order[: r % len(order)]
            for i in turn:
                series[i].samples.append(timer.measure(fns[i][1], inner) / inner)
    finally:
        if was_enabled:
            gc.enable()
    return series, inner


@dataclass
class OpResult:
    """One timed operation: per-call medians and ratios against the baseline.

    ``ratio`` is the median over repeats of generated/baseline within a repeat;
    ``ratio_p25`` and ``ratio_p75`` show its spread. ``control_ratio`` is the same
    statistic for a second baseline instance against the first (an A/A test): how
    far from 1.00x pure noise moves a ratio on this machine, in this run.
    """

    op: str
    baseline_ns: float
    generated_ns: float
    ratio: float
    ratio_p25: float
    ratio_p75: float
    inner: int
    repeat: int
    control_ratio: float | None = None
    debug_ns: float | None = None
    debug_ratio: float | None = None


@dataclass
class ConfigResult:
    """Everything measured for one configuration."""

    config: Config
    identical: bool
    problems: list[str]
    baseline_bytes: int
    generated_bytes: int
    ops: dict[str, OpResult]
    seconds: float

    @property
    def memory_ratio(self) -> float:
        return self.generated_bytes / self.baseline_bytes if self.baseline_bytes else 1.0


@dataclass
class Report:
    """A whole ``relay bench`` run; ``to_json`` is what ``--json`` writes."""

    meta: dict[str, Any]
    results: list[ConfigResult]
    engine: dict[str, Any] | None = None

    def summary(self) -> dict[str, dict[str, float]]:
        """Per row (each op, ``step+debug``, ``memory``): geometric mean, min and max
        of the ratios over configurations, and for ops the A/A control's min and max."""
        columns: dict[str, list[float]] = {}
        controls: dict[str, list[float]] = {}
        for result in self.results:
            for op, r in result.ops.items():
                columns.setdefault(op, []).append(r.ratio)
                if r.control_ratio is not None:
                    controls.setdefault(op, []).append(r.control_ratio)
            step = result.ops.get("step")
            if step is not None and step.debug_ratio is not None:
                columns.setdefault("step+debug", []).append(step.debug_ratio)
        for result in self.results:
            columns.setdefault("memory", []).append(result.memory_ratio)
        out: dict[str, dict[str, float]] = {}
        for name, values in columns.items():
            row = {
                "geomean": math.exp(statistics.fmean(math.log(v) for v in values)),
                "min": min(values),
                "max": max(values),
                "n": len(values),
            }
            if name in controls:
                row["control_min"] = min(controls[name])
                row["control_max"] = max(controls[name])
            out[name] = row
        return out

    def noise(self, result: ConfigResult) -> float | None:
        """The widest A/A deviation from 1.00x among ``result``'s ops, or None."""
        devs = [abs(r.control_ratio - 1) for r in result.ops.values() if r.control_ratio]
        return max(devs) if devs else None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: meta, one entry per configuration, summary, engine."""
        return {
            "meta": self.meta,
            "configs": [
                {
                    **asdict(r.config),
                    "label": r.config.label,
                    "identical": r.identical,
                    "problems": r.problems,
                    "memory": {
                        "baseline_bytes": r.baseline_bytes,
                        "generated_bytes": r.generated_bytes,
                        "ratio": r.memory_ratio,
                    },
                    "ops": {op: asdict(o) for op, o in r.ops.items()},
                    "seconds": r.seconds,
                }
                for r in self.results
            ],
            "summary": self.summary(),
            "engine": self.engine,
        }


def bench_config(
    config: Config,
    device: torch.device,
    *,
    ops: Sequence[str] = OPS,
    repeat: int = 15,
    warmup: int = 3,
    target_ns: int = 1_000_000,
    debug: bool = True,
    control: bool = True,
    seed: int = 0,
) -> ConfigResult:
    """Check the values agree, measure memory, then time each op for ``config``.

    With ``control``, a second baseline instance runs alongside (the A/A
    noise floor). With ``debug``, ``step`` also times the generated map built with
    ``debug=True`` (its own ratio against the baseline); single ops are not timed
    in debug mode, since repeating one resolve would read consumed rows.
    """
    start = time.perf_counter()
    problems = compare_values(config, device, seed=seed)
    problems += compare_values(config, device, seed=seed, debug=True)
    work = Workload.random(config, device, torch.Generator().manual_seed(seed))
    base, gen = build_sides(config, device, work)
    twin, _ = build_sides(config, device, work)
    baseline_bytes = device_bytes(base.map, device)
    generated_bytes = device_bytes(gen.map, device)
    timer = timer_for(device)
    results: dict[str, OpResult] = {}
    for op in ops:
        fns = [(base.name, base.ops[op]), (gen.name, gen.ops[op])]
        if control:
            fns.append(("baseline (A/A)", twin.ops[op]))
        if op == "step" and debug:
            _, dbg = build_sides(config, device, work, debug=True)
            fns.append((dbg.name, dbg.ops[op]))
        series, inner = time_interleaved(
            fns, timer, repeat=repeat, warmup=warmup, target_ns=target_ns
        )
        by_name = {s.name: s for s in series}
        b, g = by_name[base.name], by_name[gen.name]

        def ratio_to_base(other: Series) -> float:
            return statistics.median(o / r for o, r in zip(other.samples, b.samples))

        ratios = [gs / bs for gs, bs in zip(g.samples, b.samples)]
        result = OpResult(
            op=op,
            baseline_ns=b.median,
            generated_ns=g.median,
            ratio=statistics.median(ratios),
            ratio_p25=_quantile(ratios, 0.25),
            ratio_p75=_quantile(ratios, 0.75),
            inner=inner,
            repeat=repeat,
        )
        if "baseline (A/A)" in by_name:
            result.control_ratio = ratio_to_base(by_name["baseline (A/A)"])
        if "generated+debug" in by_name:
            result.debug_ns = by_name["generated+debug"].median
            result.debug_ratio = ratio_to_base(by_name["generated+debug"])
        results[op] = result
    return ConfigResult(
        config=config,
        identical=not problems,
        problems=problems,
        baseline_bytes=baseline_bytes,
        generated_bytes=generated_bytes,
        ops=results,
        seconds=time.perf_counter() - start,
    )


def bench(
    configs: Sequence[Config],
    device: torch.device,
    *,
    ops: Sequence[str] = OPS,
    repeat: int = 15,
    warmup: int = 3,
    target_ns: int = 1_000_000,
    debug: bool = True,
    control: bool = True,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    meta: dict[str, Any] | None = None,
) -> Report:
    """Benchmark every configuration and return the report (no printing but
    ``progress`` lines)."""
    results: list[ConfigResult] = []
    width = len(str(len(configs)))
    for n, config in enumerate(configs, 1):
        result = bench_config(
            config, device, ops=ops, repeat=repeat, warmup=warmup,
            target_ns=target_ns, debug=debug, control=control, seed=seed,
        )
        results.append(result)
        if progress is not None:
            parts = [f"[{n:>{width}}/{len(configs)}] {config.label}:"]
            if "step" in result.ops:
                step = result.ops["step"]
                parts.append(f"step {step.ratio:.2f}x")
                if step.debug_ratio is not None:
                    parts.append(f"debug {step.debug_ratio:.2f}x")
            parts.append("values identical" if result.identical else "VALUES DIFFER")
            parts.append(f"({result.seconds:.1f}s)")
            progress(" ".join(parts))
    return Report(meta=dict(meta or {}), results=results)


# ---------------------------------------------------------------------------
# Printing


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(widths[i]) if i >= right_from else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


_SHORT = {
    "stash": "stash",
    "publish": "publish",
    "invalidate": "invalid.",
    "resolve_future": "res_fut",
    "resolve_seq_lens_cpu": "res_seq",
    "step": "step",
}


def format_report(report: Report) -> str:
    """The aligned tables ``relay bench`` prints: ratios per configuration, then a
    summary, then the engine table when there is one."""
    ops = [op for op in OPS if any(op in r.ops for r in report.results)]
    debug = any(r.ops.get("step") and r.ops["step"].debug_ratio is not None
                for r in report.results)
    header = ["map", "P", "B", "K", "H", *(_SHORT[op] for op in ops)]
    if "step" in ops:
        header.append("step us")
    if debug:
        header.append("debug")
    control = any(report.noise(r) is not None for r in report.results)
    if control:
        header.append("A/A")
    header += ["mem", "same"]
    rows: list[list[str]] = []
    for r in report.results:
        c = r.config
        eagle = c.map == "eagle"
        row = [c.map, str(c.pool), str(c.batch), str(c.topk) if eagle else "-",
               str(c.hidden) if eagle else "-"]
        row += [f"{r.ops[op].ratio:.2f}x" if op in r.ops else "" for op in ops]
        if "step" in ops:
            row.append(f"{r.ops['step'].baseline_ns / 1000:.1f}" if "step" in r.ops else "")
        if debug:
            dr = r.ops["step"].debug_ratio if "step" in r.ops else None
            row.append("" if dr is None else f"{dr:.2f}x")
        if control:
            noise = report.noise(r)
            row.append("" if noise is None else f"±{noise:.0%}")
        row.append(f"{r.memory_ratio:.2f}x")
        row.append("yes" if r.identical else "NO")
        rows.append(row)
    lines = [
        "generated / baseline, median of per-repeat ratios (1.00x = same cost)",
        "step us: baseline time of one step, for scale; debug: generated with debug=True "
        "/ baseline, step only;",
        "A/A: widest deviation of baseline against a second baseline over the ops (noise)",
        "",
        *_table(header, rows, right_from=1),
    ]
    summary = report.summary()
    srows = [
        [name, f"{s['geomean']:.2f}x", f"{s['min']:.2f}x", f"{s['max']:.2f}x",
         f"{s['control_min']:.2f}x..{s['control_max']:.2f}x" if "control_min" in s else "",
         str(int(s["n"]))]
        for name, s in summary.items()
    ]
    lines += ["", "summary over configurations (A/A: baseline against itself, the noise floor)",
              "", *_table(["ratio", "geomean", "min", "max", "A/A range", "n"], srows,
                          right_from=1)]
    mem = [r for r in report.results if r.baseline_bytes != r.generated_bytes]
    lines.append("")
    lines.append(
        "device buffers: generated == baseline in every configuration"
        if not mem else f"device buffers DIFFER in {len(mem)} configuration(s)"
    )
    bad = [p for r in report.results for p in r.problems]
    lines.append(
        "values: generated == baseline (debug off and on) in every configuration"
        if not bad else "values DIFFER:\n  " + "\n  ".join(bad)
    )
    if report.engine is not None:
        lines += ["", *_engine_lines(report.engine)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# End-to-end engine throughput (optional)


def _engine_lines(engine: dict[str, Any]) -> list[str]:
    if not engine.get("available"):
        return [f"engine: {engine.get('reason', 'unavailable')}"]
    rows = [
        [str(row["mode"]), f"{row['ratio']:.2f}x", f"{row['sync_occupancy']:.1%}",
         f"{row['overlap_occupancy']:.1%}", f"{row['sync_tokens_per_s']:.0f}",
         f"{row['overlap_tokens_per_s']:.0f}", f"{row['accept_length']:.2f}",
         "yes" if row["outputs_identical"] else "NO"]
        for row in engine["rows"]
    ]
    header = ["mode", "overlap/sync", "occ. sync", "occ. overlap", "sync tok/s",
              "overlap tok/s", "accept", "same"]
    return [f"end to end: reference engine, {engine['requests']} requests per run, "
            "throughput ratio overlap / sync and forward occupancy", "",
            *_table(header, rows, right_from=1)]


def engine_section(
    device: torch.device, *, requests: int, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Sync against overlap throughput from ``relay.engine.run_workload``, or a
    record saying why it is unavailable (the engine is built separately and may
    be missing or changed; the bench reports that instead of failing)."""
    try:
        # Imported by name: the engine is optional here and typed on its own.
        engine: Any = importlib.import_module("relay.engine")
        run_workload = engine.run_workload
        EngineConfig, SpecConfig, WorkloadConfig = (
            engine.EngineConfig, engine.SpecConfig, engine.WorkloadConfig
        )
    except (ImportError, AttributeError) as error:
        return {"available": False,
                "reason": f"relay.engine has no usable workload API (run_workload, "
                f"EngineConfig, SpecConfig, WorkloadConfig): {error}; skipped"}
    rows: list[dict[str, Any]] = []
    try:
        for mode, spec in (("decode", None), ("eagle", SpecConfig())):
            # Untimed warm-up: a process's first run of a mode is slower (its memory
            # grows), which would flatter the run that follows it.
            run_workload(EngineConfig(spec=spec, overlap=False, device=str(device),
                                      workload=WorkloadConfig(requests=requests)))
            runs: dict[bool, Any] = {}
            for overlap in (False, True):
                config = EngineConfig(spec=spec, overlap=overlap, device=str(device),
                                      workload=WorkloadConfig(requests=requests))
                runs[overlap] = run_workload(config)
                if progress is not None:
                    progress(f"  engine {mode} {'overlap' if overlap else 'sync'}: "
                             f"{runs[overlap].tokens_per_second:.0f} tok/s")
            sync, over = runs[False], runs[True]
            rows.append({
                "mode": mode,
                "sync_tokens_per_s": float(sync.tokens_per_second),
                "overlap_tokens_per_s": float(over.tokens_per_second),
                "ratio": float(over.tokens_per_second) / float(sync.tokens_per_second),
                "sync_occupancy": float(sync.occupancy),
                "overlap_occupancy": float(over.occupancy),
                "accept_length": float(over.accept_length),
                "outputs_identical": sync.outputs == over.outputs,
            })
    except Exception as error:  # reported, not raised: the engine is not ours
        return {"available": False, "reason": f"relay.engine.run_workload failed: {error!r}"}
    return {"available": True, "requests": requests, "rows": rows}


# ---------------------------------------------------------------------------
# Command line


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative ints, got {text!r}")
    return values


def _name_list(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(part.strip() for part in text.split(",") if part.strip())
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(choices)}"
            )
        return names

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``relay bench`` flags."""
    parser.add_argument("--quick", action="store_true",
                        help="small size preset and fewer repeats (a few seconds)")
    parser.add_argument("--sizes", choices=sorted(SIZES), default=None,
                        help="size preset (default: 'default', or 'quick' with --quick)")
    parser.add_argument("--map", type=_name_list(MAPS), default=MAPS, metavar="NAMES",
                        help=f"maps to run, comma-separated (default: {','.join(MAPS)})")
    parser.add_argument("--op", type=_name_list(OPS), default=OPS, metavar="NAMES",
                        help=f"operations to time (default: all of {','.join(OPS)})")
    parser.add_argument("--pool", type=_int_list, metavar="P,...",
                        help="pool sizes P, overriding the preset")
    parser.add_argument("--batch", type=_int_list, metavar="B,...",
                        help="batch sizes B (those > P-1 are skipped), overriding the preset")
    parser.add_argument("--topk", type=_int_list, metavar="K,...",
                        help="EAGLE top-k values, overriding the preset")
    parser.add_argument("--hidden", type=_int_list, metavar="H,...",
                        help="EAGLE hidden sizes (bf16; 0 = not relayed), overriding the preset")
    parser.add_argument("--device", default="cpu",
                        help="torch device to run on, e.g. cpu or cuda:0 (default: cpu)")
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="samples per implementation and op (default 31, 11 with --quick)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N",
                        help="untimed calls before timing (default 3)")
    parser.add_argument("--sample-ms", type=float, default=None, metavar="MS",
                        help="target length of one sample (default 0.25, 0.2 with --quick); short "
                        "samples keep a context switch inside one sample, which the median drops")
    parser.add_argument("--no-debug", action="store_true",
                        help="skip timing the generated map with debug=True")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the A/A control (a second baseline timed like the first)")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="torch intra-op threads while timing (default 1: the ops are "
                        "tiny, and on a shared machine extra threads add only noise; 0 keeps "
                        "torch's setting)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random workloads")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write machine-readable results to PATH")
    parser.add_argument("--engine", action="store_true",
                        help="also run the reference engine: overlap / sync throughput and "
                        "forward occupancy (needs relay.engine's workload API)")
    parser.add_argument("--engine-requests", type=int, default=None, metavar="N",
                        help="requests per engine run (default 48, 16 with --quick)")


def _meta(args: argparse.Namespace, device: torch.device, repeat: int, sample_ms: float,
          sizes: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "relay bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"]
        else "relay bench",
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "sizes": sizes,
        "repeat": repeat,
        "warmup": args.warmup,
        "sample_ms": sample_ms,
        "timer": "cuda events" if device.type == "cuda" else "time.perf_counter_ns",
    }
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    return meta


def run(args: argparse.Namespace) -> int:
    """Run ``relay bench``; returns the exit status (0 ok, 1 values or memory
    differ, 2 bad usage)."""
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        print(f"relay bench: bad --device {args.device!r}: {error}", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print("relay bench: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    sizes = args.sizes or ("quick" if args.quick else "default")
    preset = SIZES[sizes]
    repeat = args.repeat if args.repeat is not None else (11 if args.quick else 31)
    sample_ms = args.sample_ms if args.sample_ms is not None else (0.2 if args.quick else 0.25)
    if repeat < 1 or sample_ms <= 0 or args.warmup < 0:
        print("relay bench: --repeat must be >= 1, --sample-ms > 0, --warmup >= 0",
              file=sys.stderr)
        return 2
    configs = configs_for(
        args.map,
        args.pool or preset["pool"],
        args.batch or preset["batch"],
        args.topk or preset["topk"],
        args.hidden if args.hidden is not None else preset["hidden"],
    )
    bad = [c for c in configs if c.pool < 2 or c.batch < 1 or (c.map == "eagle" and c.topk < 1)]
    if bad:
        print(f"relay bench: invalid sizes: {bad[0].label} (need P >= 2, B >= 1, K >= 1)",
              file=sys.stderr)
        return 2
    if not configs:
        print("relay bench: no configuration left (every batch is larger than P - 1)",
              file=sys.stderr)
        return 2

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    saved_threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, device, configs, repeat, sample_ms, sizes, progress)
    finally:
        torch.set_num_threads(saved_threads)


def _run(
    args: argparse.Namespace,
    device: torch.device,
    configs: Sequence[Config],
    repeat: int,
    sample_ms: float,
    sizes: str,
    progress: Callable[[str], None],
) -> int:
    start = time.perf_counter()
    progress(f"relay bench: {len(configs)} configuration(s) on {device}, "
             f"{repeat} repeats of ~{sample_ms} ms per implementation and op")
    report = bench(
        configs, device, ops=args.op, repeat=repeat, warmup=args.warmup,
        target_ns=int(sample_ms * 1e6), debug=not args.no_debug,
        control=not args.no_control, seed=args.seed,
        progress=progress, meta=_meta(args, device, repeat, sample_ms, sizes),
    )
    if args.engine:
        progress("relay bench: running the reference engine (sync, then overlap)")
        report.engine = engine_section(
            device, requests=args.engine_requests or (16 if args.quick else 48),
            progress=progress,
        )
    report.meta["seconds"] = round(time.perf_counter() - start, 2)
    print(format_report(report))
    print(f"\n{len(configs)} configuration(s)"
          f"{' and the engine' if report.engine is not None else ''}"
          f" in {report.meta['seconds']:.1f}s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    ok = all(r.identical and r.baseline_bytes == r.generated_bytes for r in report.results)
    return 0 if ok else 1
