"""A ``relay bench`` run's results: JSON for machines, rich tables for people.

rich is imported only inside ``render``: nothing else in relay needs it.
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Sequence
from typing import IO, Any

import attrs

from relay.bench.codegen_speed import GenerationTime
from relay.bench.counts import StepCount
from relay.bench.measure import ConfigResult

__all__ = ["FLOOR_TARGET", "Report"]

#: Issue 17's target: relay's own Python within 1.3x of the bare torch calls.
FLOOR_TARGET = 1.30


@attrs.define
class Report:
    """Everything one run measured; ``to_json`` is what ``--json`` writes."""

    meta: dict[str, Any]
    #: (schema, what its baseline does) of each compared pair, in report order.
    pairs: list[tuple[str, str]]
    #: (schema, why) of each declared pair whose generated module is missing.
    skipped: list[tuple[str, str]]
    results: list[ConfigResult] = attrs.field(factory=list)
    #: The machine's copy bandwidth on the bench's device, bytes per second.
    copy_bandwidth: float | None = None
    #: Seconds of the first generation in the process (templates compiled).
    generation_first: float | None = None
    generation: list[GenerationTime] = attrs.field(factory=list)

    @property
    def failures(self) -> list[str]:
        """Every configuration whose sides raised or resolved different values."""
        out: list[str] = []
        for r in self.results:
            if r.error is not None:
                out.append(f"{r.schema} {r.shape.label}: {r.error}")
            out += list(r.problems)
        return out

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the whole run."""

        def count(c: StepCount | None) -> dict[str, Any] | None:
            if c is None:
                return None
            return {
                "ops": c.ops,
                "views": c.views,
                "bytes": c.bytes,
                "methods": {
                    m.method: {"ops": list(m.ops), "views": m.views, "bytes": m.bytes}
                    for m in c.methods
                },
            }

        return {
            "meta": self.meta,
            "pairs": [{"schema": s, "baseline": d} for s, d in self.pairs],
            "skipped": [{"schema": s, "reason": why} for s, why in self.skipped],
            "copy_bandwidth_bytes_per_s": self.copy_bandwidth,
            "configs": [
                {
                    "schema": r.schema,
                    **attrs.asdict(r.shape),
                    "label": r.shape.label,
                    "ok": r.ok,
                    "error": r.error,
                    "problems": list(r.problems),
                    "baseline": count(r.baseline),
                    "generated": count(r.generated),
                    "debug_ops": r.debug_ops,
                    "baseline_ns": r.baseline_ns,
                    "generated_ns": r.generated_ns,
                    "debug_ns": r.debug_ns,
                    "ratio": r.ratio,
                    "ratio_p25": r.ratio_p25,
                    "ratio_p75": r.ratio_p75,
                    "control": r.control,
                    "debug_ratio": r.debug_ratio,
                    "floor": count(r.floor),
                    "floor_ns": r.floor_ns,
                    "floor_ratio": r.floor_ratio,
                    "floor_ratio_p25": r.floor_p25,
                    "floor_ratio_p75": r.floor_p75,
                    "floor_ops_match": r.floor_ops_match,
                    "launches_baseline": r.launches_baseline,
                    "launches_generated": r.launches_generated,
                    "meets_target": r.meets_target(),
                    "inner": r.inner,
                    "repeat": r.repeat,
                    "seconds": r.seconds,
                }
                for r in self.results
            ],
            "generation": {
                "first_seconds": self.generation_first,
                "sizes": [attrs.asdict(t) for t in self.generation],
            },
        }

    # -----------------------------------------------------------------------
    # Tables

    def render(self, file: IO[str], *, terminal: bool) -> None:
        """Print the tables to ``file``: styled for a terminal, plain (Markdown tables,
        no colour, no wrapping) otherwise."""
        from rich import box
        from rich.console import Console
        from rich.table import Table

        if terminal:
            console = Console(file=file, highlight=False)
            # Below ~120 columns the tables would fold their numbers: let the terminal
            # wrap long lines instead.
            console.width = max(console.width, 120)
            self._print(console, box.SIMPLE_HEAD, Table)
            return
        # Plain: Markdown tables without colour or wrapping, trailing blanks trimmed.
        console = Console(
            file=io.StringIO(),
            no_color=True,
            highlight=False,
            width=240,
            soft_wrap=True,
            record=True,
        )
        self._print(console, box.MARKDOWN, Table)
        lines = [line.rstrip() for line in console.export_text().splitlines()]
        text = "\n".join(lines)
        while "\n\n\n" in text:
            text = text.replace("\n\n\n", "\n\n")
        file.write(text.strip("\n") + "\n")

    def _print(self, console: Any, style: Any, table_cls: Any) -> None:
        def table(title: str, *columns: str) -> Any:
            t = table_cls(title=title, box=style, title_justify="left")
            for i, name in enumerate(columns):
                # Narrow terminals fold cells rather than cut them off.
                t.add_column(
                    name, justify="left" if i == 0 else "right", overflow="fold"
                )
            return t

        meta = self.meta
        console.print(
            f"relay bench: {meta.get('device')}, torch {meta.get('torch')}, "
            f"{meta.get('torch_threads')} thread(s), {meta.get('repeat')} repeats "
            f"of ~{meta.get('sample_ms')} ms, {meta.get('date')}"
        )
        for schema, design in self.pairs:
            console.print(f"  {schema}: baseline = {design}")
        for schema, why in self.skipped:
            console.print(f"  {schema}: skipped ({why})")
        console.print()

        ops = self._ops_table(table)
        if ops is not None:
            console.print(ops)
            console.print()

        if self.results:
            self._print_steps(console, table)
            console.print()
            console.print(self._summary_table(table))
            console.print()

        if self.generation:
            gen = table(
                "Generator speed (relay.codegen plan: load, validate, render)",
                "fields",
                "seconds",
                "ms / field",
                "lines",
            )
            for t in self.generation:
                gen.add_row(
                    str(t.fields),
                    f"{t.seconds:.3f}",
                    f"{t.seconds * 1e3 / t.fields:.2f}",
                    str(t.lines),
                )
            console.print(gen)
            if self.generation_first is not None:
                console.print(
                    f"first generation in the process (templates compiled, one "
                    f"field): {self.generation_first:.3f} s"
                )
            console.print()

        failures = self.failures
        if failures:
            console.print(f"FAILED: {len(failures)} problem(s)")
            for line in failures:
                console.print(f"  {line}")
        elif self.results:
            console.print(
                "values: generated == baseline (debug off and on) in every "
                "configuration"
            )

    def _print_steps(self, console: Any, table: Any) -> None:
        """The per-shape tables: time and ops, then memory traffic (and launches)."""
        console.print(self._steps_table(table))
        console.print(
            "base us: the baseline's time per step, for scale. A/A: how far a second "
            "baseline timed like the first strays from 1.00x (the noise). debug/off: the "
            "generated map built with debug=True against itself with debug off. target: no "
            "more ops than the baseline and gen/base <= 1.00x within the A/A noise. "
            "floor: the generated map's torch calls written bare (relay/bench/floor.py), "
            "timed interleaved with the others; gen/floor is relay's own Python on top "
            "of them (issue 17's target: <= 1.30x)."
        )
        console.print()
        console.print(self._traffic_table(table))
        console.print(
            "KB: the bytes each side's ops must move per step (indexed rows and indices, "
            "inputs and outputs of the other ops); GB/s: that over the step's time."
        )
        if self.copy_bandwidth:
            console.print(
                f"copy bandwidth of this {self.meta.get('device')}: "
                f"{self.copy_bandwidth / 1e9:.2f} GB/s (read + write of one large copy)"
            )

    def _steps_table(self, table: Any) -> Any:
        """Per shape: time against the baseline and the floor, ops, the target."""
        steps = table(
            "One step, generated / baseline (median of per-repeat ratios)",
            *_SHAPE_COLUMNS,
            "base us",
            "gen/base",
            "A/A",
            "floor us",
            "gen/floor",
            "debug/off",
            "ops gen/base",
            "target",
        )
        for r in self.results:
            shape = _shape_cells(r)
            if r.error is not None or r.baseline is None or r.generated is None:
                steps.add_row(*shape, "FAILED", "", "", "", "", "", "", "")
                continue
            target = {True: "yes", False: "no", None: ""}[r.meets_target()]
            steps.add_row(
                *shape,
                f"{r.baseline_ns / 1000:.1f}",
                f"{r.ratio:.2f}x",
                "" if r.noise is None else f"±{r.noise:.0%}",
                "" if r.floor_ns is None else f"{r.floor_ns / 1000:.1f}",
                _floor_cell(r),
                "" if r.debug_ratio is None else f"{r.debug_ratio:.2f}x",
                f"{r.generated.ops} / {r.baseline.ops}",
                target if r.ok else "VALUES DIFFER",
            )
        return steps

    def _traffic_table(self, table: Any) -> Any:
        """Per shape: the bytes a step moves, as a rate and a share of the machine's
        copy bandwidth; kernel launches on CUDA."""
        cuda = any(r.launches_baseline is not None for r in self.results)
        traffic = table(
            "Memory traffic of one step (and kernel launches on CUDA)",
            *_SHAPE_COLUMNS,
            "KB base",
            "KB gen",
            "GB/s base",
            "GB/s gen",
            "of copy bw base",
            "of copy bw gen",
            *(("launches gen/base",) if cuda else ()),
        )
        bandwidth = self.copy_bandwidth

        def rate(nbytes: int, ns: float) -> tuple[str, str]:
            gbps = nbytes / ns if ns else 0.0
            return f"{gbps:.3g}", f"{gbps * 1e9 / bandwidth:.0%}" if bandwidth else ""

        for r in self.results:
            if r.error is not None or r.baseline is None or r.generated is None:
                continue
            base_rate, gen_rate = (
                rate(r.baseline.bytes, r.baseline_ns),
                rate(r.generated.bytes, r.generated_ns),
            )
            launches = (
                f"{r.launches_generated or 0:.1f} / {r.launches_baseline or 0:.1f}",
            )
            traffic.add_row(
                *_shape_cells(r),
                f"{r.baseline.bytes / 1024:.1f}",
                f"{r.generated.bytes / 1024:.1f}",
                base_rate[0],
                gen_rate[0],
                base_rate[1],
                gen_rate[1],
                *(launches if cuda else ()),
            )
        return traffic

    def _ops_table(self, table: Any) -> Any:
        """Per method, the ops one step dispatches on each side, at one shape per schema
        (the first with B >= 2: at B = 1 indexing adds a ``view`` to each write)."""
        chosen: dict[str, ConfigResult] = {}
        for r in self.results:
            if r.baseline is None or r.generated is None:
                continue
            if r.schema not in chosen or (
                chosen[r.schema].shape.batch < 2 <= r.shape.batch
            ):
                chosen[r.schema] = r
        if not chosen:
            return None
        t = table(
            "Dispatched aten ops per method, one step (debug off)",
            "schema / method",
            "baseline",
            "generated",
        )
        for schema, r in chosen.items():
            assert r.baseline is not None and r.generated is not None
            t.add_row(
                f"{schema} {r.shape.label}", str(r.baseline.ops), str(r.generated.ops)
            )
            base, gen = r.baseline.by_method(), r.generated.by_method()
            # Step order (Side's docstring), whichever side has the method.
            first = ("invalidate", "resolve_future", "publish", "stash")
            seen = [*gen, *(m for m in base if m not in gen)]
            for method in sorted(
                seen, key=lambda m: first.index(m) if m in first else 9
            ):
                b, g = base.get(method), gen.get(method)
                t.add_row(
                    f"  {method}",
                    "-"
                    if b is None
                    else f"{len(b.ops)}: {b.summary()}"
                    if b.ops
                    else "0",
                    "-"
                    if g is None
                    else f"{len(g.ops)}: {g.summary()}"
                    if g.ops
                    else "0",
                )
        return t

    def _summary_table(self, table: Any) -> Any:
        t = table(
            "Summary per schema over shapes",
            "schema",
            "gen/base geomean",
            "min",
            "max",
            "A/A range",
            "gen/floor geomean",
            "gen/floor max",
            "<= 1.30x floor",
            "debug/off geomean",
            "ops gen/base",
            "targets met",
        )
        for schema, _ in self.pairs:
            rows = [r for r in self.results if r.schema == schema and r.ok and r.repeat]
            if not rows:
                continue
            ratios = [r.ratio for r in rows]
            controls = [r.control for r in rows if r.control is not None]
            debugs = [r.debug_ratio for r in rows if r.debug_ratio is not None]
            ops = sorted(
                {
                    (r.generated.ops, r.baseline.ops)
                    for r in rows
                    if r.generated is not None and r.baseline is not None
                }
            )
            met = sum(1 for r in rows if r.meets_target())
            floors = [
                r.floor_ratio
                for r in rows
                if r.floor_ratio is not None and r.floor_ops_match
            ]
            t.add_row(
                schema,
                f"{_geomean(ratios):.2f}x",
                f"{min(ratios):.2f}x",
                f"{max(ratios):.2f}x",
                f"{min(controls):.2f}x..{max(controls):.2f}x" if controls else "",
                f"{_geomean(floors):.2f}x" if floors else "",
                f"{max(floors):.2f}x" if floors else "",
                f"{sum(1 for f in floors if f <= FLOOR_TARGET)} of {len(floors)}"
                if floors
                else "",
                f"{_geomean(debugs):.2f}x" if debugs else "",
                ", ".join(f"{g}/{b}" for g, b in ops),
                f"{met} of {len(rows)}",
            )
        return t


_SHAPE_COLUMNS = ("schema", "P", "B", "K", "H")


def _shape_cells(r: ConfigResult) -> list[str]:
    """A result's shape as the tables' first five cells."""
    s = r.shape
    return [
        r.schema,
        str(s.pool),
        str(s.batch),
        str(s.topk) if s.topk else "-",
        str(s.hidden) if s.topk else "-",
    ]


def _floor_cell(r: ConfigResult) -> str:
    """gen/floor, or why it is missing: no floor here, or a floor whose ops differ
    from the generated map's (then the ratio compares different work)."""
    if r.floor_ratio is None:
        return "-"
    if not r.floor_ops_match:
        return f"{r.floor_ratio:.2f}x (ops differ)"
    return f"{r.floor_ratio:.2f}x"


def _geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))
