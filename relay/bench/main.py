"""``relay bench``'s command line: flags, progress, the run, the exit status.

Exit status: 0 every side ran and resolved the same values, 1 a side raised or the
values differ, 2 bad usage or an unusable device. Timings never fail a run: they
depend on the machine and its load.

torch and rich are imported by ``run`` only, so building the flags (``relay --help``)
stays fast.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from relay.bench.sizes import BREAKDOWN, DEFAULTS, PRESETS, Defaults
from relay.cli.status import Exit

__all__ = ["add_arguments", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = Exit.OK, Exit.FAILED, Exit.USAGE


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ints, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative ints, got {text!r}")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated schema names")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``relay bench`` flags, in three groups of its help."""
    _size_arguments(parser.add_argument_group("what to compare"))
    _timing_arguments(parser.add_argument_group("timing"))
    _report_arguments(parser.add_argument_group("sides and report"))


def _size_arguments(group: argparse._ArgumentGroup) -> None:
    """Maps, sizes and device."""
    default, quick = DEFAULTS["default"], DEFAULTS["quick"]
    group.add_argument(
        "--quick",
        action="store_true",
        help=f"the '{quick.preset}' sizes, {quick.repeat} repeats, a short "
        "generator table: seconds, for tests and a first look",
    )
    group.add_argument(
        "--sizes",
        choices=sorted(PRESETS),
        default=None,
        help=f"size preset (default: '{default.preset}', or "
        f"'{quick.preset}' with --quick)",
    )
    group.add_argument(
        "--schema",
        type=_name_list,
        default=None,
        metavar="NAMES",
        help="bundled schemas to compare, comma-separated (default: every "
        "one with a declared baseline)",
    )
    group.add_argument("--pool", type=_int_list, metavar="P,...", help="pool sizes P")
    group.add_argument(
        "--batch",
        type=_int_list,
        metavar="B,...",
        help="batch sizes B (those > P - 1 are skipped)",
    )
    group.add_argument(
        "--topk", type=_int_list, metavar="K,...", help="top-k (EAGLE maps)"
    )
    group.add_argument(
        "--hidden",
        type=_int_list,
        metavar="H,...",
        help="hidden sizes, bf16 (EAGLE maps; 0 = not relayed)",
    )
    group.add_argument(
        "--device",
        default="cpu",
        help="torch device, e.g. cpu or cuda:0 (default: cpu); on CUDA the "
        "report adds kernel launches per step",
    )
    group.add_argument(
        "--fields",
        type=_int_list,
        default=None,
        metavar="N,...",
        help="field counts of the generator-speed table (default: the "
        "preset's; 0 skips the table)",
    )


def _timing_arguments(group: argparse._ArgumentGroup) -> None:
    """How each side is timed."""
    default, quick = DEFAULTS["default"], DEFAULTS["quick"]
    group.add_argument(
        "--repeat",
        type=int,
        default=None,
        metavar="N",
        help=f"timed samples per side (default {default.repeat}, "
        f"{quick.repeat} with --quick)",
    )
    group.add_argument(
        "--warmup",
        type=int,
        default=None,
        metavar="N",
        help=f"untimed steps per side first (default {default.warmup})",
    )
    group.add_argument(
        "--sample-ms",
        type=float,
        default=None,
        metavar="MS",
        help=f"target length of one sample (default {default.sample_ms})",
    )
    group.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help=f"torch intra-op threads while timing (default {default.threads}; "
        "0 keeps torch's setting)",
    )
    group.add_argument("--seed", type=int, default=None, help="seed of the workloads")


def _report_arguments(group: argparse._ArgumentGroup) -> None:
    """Which sides run, and what is reported where."""
    group.add_argument(
        "--no-debug", action="store_true", help="skip the generated map in debug mode"
    )
    group.add_argument(
        "--no-control",
        action="store_true",
        help="skip the A/A control (a second baseline timed like the first)",
    )
    group.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the floor (the generated map's torch calls written bare; CPU only)",
    )
    group.add_argument(
        "--breakdown",
        action="store_true",
        help="instead of the comparison: where each generated method's time goes "
        "against its floor, statement by statement (CPU, debug off; default "
        f"{', '.join(BREAKDOWN.schemas)} at P={BREAKDOWN.preset.pool[0]} "
        f"B={BREAKDOWN.preset.batch[0]} K={BREAKDOWN.preset.topk[0]} "
        f"H={BREAKDOWN.preset.hidden[0]}, {BREAKDOWN.repeat} repeats)",
    )
    group.add_argument(
        "--quantile",
        type=float,
        default=None,
        metavar="Q",
        help=f"with --breakdown: the quantile of each row's samples (default "
        f"{BREAKDOWN.quantile}: a low one, as other processes only add time; 0.5 "
        "on an idle machine)",
    )
    group.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="also write every figure to PATH as JSON",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress on stderr; the report only",
    )


def _usage(message: str) -> int:
    print(f"relay bench: {message}", file=sys.stderr)
    return EXIT_USAGE


def _defaults(args: argparse.Namespace) -> Defaults:
    base = DEFAULTS["quick" if args.quick else "default"]
    given = {
        "preset": args.sizes,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "sample_ms": args.sample_ms,
        "threads": args.threads,
        "seed": args.seed,
    }
    return attrs.evolve(base, **{k: v for k, v in given.items() if v is not None})


@contextmanager
def _progress(total: int, *, quiet: bool) -> Iterator[Callable[[str], None]]:
    """A callback to call after each configuration: a live bar with an ETA on a
    terminal, one plain line per configuration otherwise, nothing with ``quiet``."""
    if quiet:
        yield lambda line: None
        return
    if not sys.stderr.isatty():
        done = 0

        def plain(line: str) -> None:
            nonlocal done
            done += 1
            print(f"[{done}/{total}] {line}", file=sys.stderr, flush=True)

        yield plain
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    ) as bar:
        task = bar.add_task("relay bench", total=total)

        def live(line: str) -> None:
            bar.update(task, advance=1, description=line)

        yield live


@attrs.frozen
class _Plan:
    """What a ``relay bench`` run compares: the device, the generated maps found (and
    those skipped, with why), every configuration, the generator table's sizes."""

    device: Any
    found: list[tuple[Any, Any]]
    skipped: list[tuple[Any, str]]
    configs: list[tuple[Any, Any, Any]]
    fields: tuple[int, ...]


def _device(name: str) -> Any:
    """The torch device ``name`` names, or a usage message saying why not."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        return f"bad --device {name!r}: {error}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "--device cuda, but torch sees no CUDA device"
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _plan(args: argparse.Namespace, defaults: Defaults) -> _Plan | str:
    """The run's plan, or a usage message saying what is wrong with ``args``."""
    from relay.bench.sides import PAIRS, discover

    if defaults.repeat < 1 or defaults.sample_ms <= 0 or defaults.warmup < 0:
        return "--repeat must be >= 1, --sample-ms > 0 and --warmup >= 0"
    device = _device(args.device)
    if isinstance(device, str):
        return device
    known = [p.schema for p in PAIRS]
    unknown = [s for s in args.schema or () if s not in known]
    if unknown:
        return (
            f"no baseline is declared for {', '.join(unknown)}; "
            f"choose from {', '.join(known)}"
        )
    preset = PRESETS[defaults.preset].narrowed(
        pool=args.pool, batch=args.batch, topk=args.topk, hidden=args.hidden
    )
    if any(k < 1 for k in preset.topk):
        return "--topk must be >= 1"
    if any(p < 2 for p in preset.pool) or any(b < 1 for b in preset.batch):
        return "--pool must be >= 2 (row 0 is scratch) and --batch >= 1"
    if not any(True for _ in preset.shapes(spec=False)):
        return (
            f"no shape fits: a pool of P rows holds at most P - 1 requests "
            f"(pools {preset.pool}, batches {preset.batch})"
        )
    found, skipped = discover(args.schema)
    configs = [
        (pair, gen, shape)
        for pair, gen in found
        for shape in preset.shapes(spec=pair.spec)
    ]
    fields = (
        preset.fields if args.fields is None else tuple(n for n in args.fields if n > 0)
    )
    if not configs and not fields:
        return (
            "nothing to run: no generated map fits these sizes (every batch is "
            "larger than P - 1, or the schemas are not generated)"
        )
    return _Plan(device, found, skipped, configs, fields)


def _measure_all(
    plan: _Plan, args: argparse.Namespace, defaults: Defaults, report: Any
) -> None:
    """Measure every configuration and the generator table into ``report``, with
    progress, on ``defaults.threads`` torch threads."""
    import torch

    from relay.bench.codegen_speed import generation_times
    from relay.bench.measure import measure
    from relay.bench.timing import copy_bandwidth

    device = plan.device
    saved_threads = torch.get_num_threads()
    if defaults.threads > 0:
        torch.set_num_threads(defaults.threads)
    try:
        report.copy_bandwidth = copy_bandwidth(device, defaults.bandwidth_mb)
        steps = len(plan.configs) + (1 if plan.fields else 0)
        with _progress(steps, quiet=args.quiet) as advance:
            for pair, gen, shape in plan.configs:
                result = measure(
                    pair,
                    gen,
                    shape,
                    device,
                    defaults,
                    debug=not args.no_debug,
                    control=not args.no_control,
                    floor=not args.no_floor,
                )
                report.results.append(result)
                advance(
                    f"{pair.schema} {shape.label}: "
                    + (f"{result.ratio:.2f}x" if result.ok else "FAILED")
                )
            if plan.fields:
                first, table = generation_times(plan.fields)
                report.generation_first, report.generation = first, table
                advance("generator speed")
        # Probed again at the end: the best of both, so a busy moment at the start
        # does not set the physical limit too low.
        report.copy_bandwidth = max(
            report.copy_bandwidth, copy_bandwidth(device, defaults.bandwidth_mb)
        )
    finally:
        torch.set_num_threads(saved_threads)


def run(args: argparse.Namespace) -> int:
    """Run ``relay bench`` with parsed ``args``; returns the exit status."""
    import torch

    from relay.bench.report import Report

    if args.breakdown:
        return _run_breakdown(args)
    defaults = _defaults(args)
    plan = _plan(args, defaults)
    if isinstance(plan, str):
        return _usage(plan)
    start = time.perf_counter()
    report = Report(
        meta=_meta(plan.device, defaults, torch),
        pairs=[(pair.schema, pair.design) for pair, _ in plan.found],
        skipped=[(pair.schema, why) for pair, why in plan.skipped],
    )
    _measure_all(plan, args, defaults, report)
    report.meta["seconds"] = round(time.perf_counter() - start, 2)
    report.render(sys.stdout, terminal=sys.stdout.isatty())
    print(f"\n{len(plan.configs)} configuration(s) in {report.meta['seconds']:.1f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8"
        )
        print(f"wrote {args.json}")
    return EXIT_FAILED if report.failures else EXIT_OK


def _run_breakdown(args: argparse.Namespace) -> int:
    """``relay bench --breakdown``: per method and statement, on the CPU."""
    import torch

    from relay.bench.breakdown import breakdown, breakdown_json, render_breakdown
    from relay.bench.floor import FLOORS
    from relay.bench.sides import discover

    if args.device != "cpu":
        return _usage("--breakdown times Python on the CPU: leave --device out")
    schemas = args.schema or BREAKDOWN.schemas
    unknown = [s for s in schemas if s not in FLOORS]
    if unknown:
        return _usage(
            f"no floor for {', '.join(unknown)}; choose from {', '.join(FLOORS)}"
        )
    repeat = BREAKDOWN.repeat if args.repeat is None else args.repeat
    sample_ms = BREAKDOWN.sample_ms if args.sample_ms is None else args.sample_ms
    q = BREAKDOWN.quantile if args.quantile is None else args.quantile
    if repeat < 1 or sample_ms <= 0 or not 0 <= q <= 1:
        return _usage(
            "--repeat must be >= 1, --sample-ms > 0 and --quantile between 0 and 1"
        )
    preset = BREAKDOWN.preset.narrowed(
        pool=args.pool, batch=args.batch, topk=args.topk, hidden=args.hidden
    )
    found, skipped = discover(schemas)
    if skipped:
        return _usage("; ".join(f"{p.schema}: {why}" for p, why in skipped))
    saved_threads = torch.get_num_threads()
    threads = DEFAULTS["default"].threads if args.threads is None else args.threads
    if threads > 0:
        torch.set_num_threads(threads)
    results = []
    try:
        for pair, gen in found:
            for shape in preset.shapes(spec=pair.spec):
                results += breakdown(
                    pair.schema,
                    shape,
                    generated=gen,
                    repeat=repeat,
                    sample_us=sample_ms * 1000,
                    q=q,
                    seed=args.seed or 0,
                )
    finally:
        torch.set_num_threads(saved_threads)
    if not results:
        return _usage("no shape fits: a pool of P rows holds at most P - 1 requests")
    print(
        f"relay bench --breakdown: cpu, torch {torch.__version__}, {threads or saved_threads} "
        f"thread(s), {repeat} interleaved repeats of ~{sample_ms} ms per row, "
        f"load average {os.getloadavg()[0]:.2f}; each time is the {q:g} quantile of "
        "its samples less an empty call's (Note [Low quantile] in "
        "relay/bench/breakdown.py). Provisional on a shared machine: compare rows of "
        "one run."
    )
    render_breakdown(results, sys.stdout)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(breakdown_json(results), indent=2) + "\n", encoding="utf-8"
        )
        print(f"wrote {args.json}")
    return EXIT_OK


def _meta(device: Any, defaults: Defaults, torch: Any) -> dict[str, Any]:
    argv: Sequence[str] = sys.argv[1:]
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": "relay " + " ".join(argv)
        if argv[:1] == ["bench"]
        else "relay bench",
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        **attrs.asdict(defaults),
        "timer": "cuda events" if device.type == "cuda" else "time.perf_counter_ns",
    }
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    return meta
