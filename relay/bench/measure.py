"""One configuration (a pair at a shape) measured: values, counts, then interleaved time.

Everything of one configuration is measured in one place and in this order, so the
time series of its five sides (baseline, generated, the floor, the A/A baseline,
generated in debug mode) are interleaved with each other and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import torch

from relay import debug
from relay.bench.counts import StepCount, count_launches, count_step
from relay.bench.floor import compare_floor, floor_side, has_floor
from relay.bench.sides import (
    Generated,
    Pair,
    Side,
    Workload,
    baseline_side,
    compare_values,
    generated_side,
    sides_for,
)
from relay.bench.sizes import Defaults, Shape
from relay.bench.timing import Series, quantile, ratio, time_interleaved, timer_for

__all__ = ["ConfigResult", "measure"]


def _with_clocks(side: Side) -> Side:
    """``side`` with the happens-before clocks installed around each call, as an engine
    in debug mode runs: the other sides' fences report to no clocks."""

    def wrap(call: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with debug.happens_before():
                call()

        return run

    calls = tuple((name, wrap(call)) for name, call in side.calls)
    return attrs.evolve(side, calls=calls)


@attrs.frozen
class ConfigResult:
    """Everything measured for one pair at one shape. Times are per step, in ns.

    ``ratio`` is generated / baseline (median of per-repeat ratios, ``ratio_p25`` and
    ``ratio_p75`` its spread); ``control`` the same for a second baseline against
    the first (A/A: 1.00x up to noise); ``debug_ratio`` the generated map in debug
    mode against itself with debug off; ``floor_ratio`` generated / the floor (its
    bare torch calls, ``relay.bench.floor``), ``floor_p25`` and ``floor_p75`` its
    spread. ``error`` is set when a side raised.
    """

    schema: str
    shape: Shape
    problems: tuple[str, ...]
    baseline: StepCount | None = None
    generated: StepCount | None = None
    debug_ops: int | None = None
    baseline_ns: float = 0.0
    generated_ns: float = 0.0
    debug_ns: float | None = None
    ratio: float = 0.0
    ratio_p25: float = 0.0
    ratio_p75: float = 0.0
    control: float | None = None
    debug_ratio: float | None = None
    floor: StepCount | None = None
    floor_ns: float | None = None
    floor_ratio: float | None = None
    floor_p25: float | None = None
    floor_p75: float | None = None
    launches_baseline: float | None = None
    launches_generated: float | None = None
    inner: int = 0
    repeat: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def noise(self) -> float | None:
        """How far the A/A control strayed from 1.00x."""
        return None if self.control is None else abs(self.control - 1)

    @property
    def ok(self) -> bool:
        """Both sides ran and resolved the same values."""
        return self.error is None and not self.problems

    def meets_target(self) -> bool | None:
        """Issue 7's target: no more ops than the baseline, and no slower within the A/A
        noise. None when it was not measured."""
        if (
            not self.ok
            or self.baseline is None
            or self.generated is None
            or not self.repeat
        ):
            return None
        within = self.ratio <= 1 + (self.noise or 0.0)
        return within and self.generated.ops <= self.baseline.ops

    @property
    def floor_ops_match(self) -> bool | None:
        """Whether the floor dispatched exactly the generated map's ops, method by
        method (data ops in order, and view counts): if not, ``floor_ratio`` compares
        different work. None when the floor was not run."""
        if self.floor is None or self.generated is None:
            return None
        return _op_lists(self.floor) == _op_lists(self.generated)


def _op_lists(count: StepCount) -> list[tuple[str, tuple[str, ...], int]]:
    return [(m.method, m.ops, m.views) for m in count.methods]


def _check_values(
    pair: Pair,
    generated: Generated,
    shape: Shape,
    device: torch.device,
    defaults: Defaults,
    *,
    debug: bool,
    with_floor: bool,
) -> list[str]:
    """Every difference from the baseline (debug off, and on) and from the floor."""
    steps, seed = defaults.check_steps, defaults.seed
    problems = compare_values(pair, generated, shape, device, steps=steps, seed=seed)
    if debug:
        problems += compare_values(
            pair, generated, shape, device, steps=steps, seed=seed, debug=True
        )
    if with_floor:
        problems += compare_floor(
            pair.schema, generated, shape, device, steps=steps, seed=seed
        )
    return problems


@attrs.define
class _Timed:
    """What one configuration times, and what was counted on the way."""

    fns: list[tuple[str, Callable[[], None]]]
    base: Side
    gen: Side
    floor_count: StepCount | None = None
    debug_ops: int | None = None


def _sides(
    pair: Pair,
    generated: Generated,
    shape: Shape,
    device: torch.device,
    defaults: Defaults,
    *,
    debug: bool,
    control: bool,
    with_floor: bool,
) -> _Timed:
    """The sides to time, each primed and stepped once; the floor and debug mode
    counted."""
    work = Workload.random(
        shape, device, torch.Generator().manual_seed(defaults.seed), spec=pair.spec
    )
    base, gen = sides_for(pair, generated, shape, device, work)
    timed = _Timed([(base.name, base.step), (gen.name, gen.step)], base, gen)
    if with_floor:
        bare = floor_side(pair.schema, shape, device, work)
        bare.step()
        timed.floor_count = count_step(bare)
        timed.fns.append((bare.name, bare.step))
    if control:
        twin = baseline_side(pair, shape, device, work)
        timed.fns.append(("baseline (A/A)", twin.step))
    if debug:
        dbg = _with_clocks(generated_side(generated, shape, device, work, debug=True))
        dbg.step()
        timed.debug_ops = count_step(dbg).ops
        timed.fns.append((dbg.name, dbg.step))
    base.step()
    gen.step()
    return timed


def measure(
    pair: Pair,
    generated: Generated,
    shape: Shape,
    device: torch.device,
    defaults: Defaults,
    *,
    debug: bool = True,
    control: bool = True,
    floor: bool = True,
) -> ConfigResult:
    """Check values (debug off and on, and the floor's), count one step of each side,
    then time them. The floor runs where ``relay.bench.floor`` has one (the CPU).

    A side that raises is reported in ``error`` instead of ending the run.
    """
    start = time.perf_counter()
    with_floor = floor and has_floor(pair.schema, device)
    try:
        problems = _check_values(
            pair,
            generated,
            shape,
            device,
            defaults,
            debug=debug,
            with_floor=with_floor,
        )
        timed = _sides(
            pair,
            generated,
            shape,
            device,
            defaults,
            debug=debug,
            control=control,
            with_floor=with_floor,
        )
        base_count, gen_count = count_step(timed.base), count_step(timed.gen)
        launches: tuple[float | None, float | None] = (None, None)
        if device.type == "cuda":
            launches = (
                count_launches(timed.base.step, device),
                count_launches(timed.gen.step, device),
            )
        series, inner = time_interleaved(
            timed.fns,
            timer_for(device),
            repeat=defaults.repeat,
            warmup=defaults.warmup,
            target_ns=int(defaults.sample_ms * 1e6),
        )
    except Exception as error:  # noqa: BLE001 - reported per configuration, exit 1
        return ConfigResult(
            pair.schema,
            shape,
            (),
            error=f"{type(error).__name__}: {error}",
            seconds=time.perf_counter() - start,
        )
    return _result(
        pair.schema,
        shape,
        problems,
        {s.name: s for s in series},
        (base_count, gen_count, timed.floor_count, timed.debug_ops),
        launches,
        inner=inner,
        repeat=defaults.repeat,
        seconds=time.perf_counter() - start,
    )


def _result(
    schema: str,
    shape: Shape,
    problems: list[str],
    by_name: dict[str, Series],
    counts: tuple[StepCount, StepCount, StepCount | None, int | None],
    launches: tuple[float | None, float | None],
    *,
    inner: int,
    repeat: int,
    seconds: float,
) -> ConfigResult:
    """The ratios of the timed series, with the counts, as one ``ConfigResult``."""
    base_count, gen_count, floor_count, dbg_ops = counts
    b, g = by_name["baseline"], by_name["generated"]
    per_repeat = [gs / bs for gs, bs in zip(g.samples, b.samples)]
    twin_series = by_name.get("baseline (A/A)")
    dbg_series = by_name.get("generated+debug")
    floor_series = by_name.get("floor")
    per_floor = (
        []
        if floor_series is None
        else [gs / fs for gs, fs in zip(g.samples, floor_series.samples)]
    )
    return ConfigResult(
        schema=schema,
        shape=shape,
        problems=tuple(problems),
        baseline=base_count,
        generated=gen_count,
        debug_ops=dbg_ops,
        baseline_ns=b.median,
        generated_ns=g.median,
        debug_ns=None if dbg_series is None else dbg_series.median,
        ratio=quantile(per_repeat, 0.5),
        ratio_p25=quantile(per_repeat, 0.25),
        ratio_p75=quantile(per_repeat, 0.75),
        control=None if twin_series is None else ratio(twin_series, b),
        debug_ratio=None if dbg_series is None else ratio(dbg_series, g),
        floor=floor_count,
        floor_ns=None if floor_series is None else floor_series.median,
        floor_ratio=quantile(per_floor, 0.5) if per_floor else None,
        floor_p25=quantile(per_floor, 0.25) if per_floor else None,
        floor_p75=quantile(per_floor, 0.75) if per_floor else None,
        launches_baseline=launches[0],
        launches_generated=launches[1],
        inner=inner,
        repeat=repeat,
        seconds=seconds,
    )
