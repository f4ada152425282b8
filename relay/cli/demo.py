"""``relay demo``: generate the bundled maps privately, import them, run the engine both ways.

The command-line side of the reference engine (``relay.engine``, a library that
imports nothing from here): flags, model presets, progress and the results table.

The bundled schemas the engine runs (``decode``, ``decode_seq_lens``, ``eagle``,
``ngram``) are generated into a private temporary folder and imported from there: the
demo never reads or writes the caller's project (no ``[tool.relay]`` lookup, nothing
written under the working folder). For plain decoding, EAGLE and n-gram speculation
(retraction under KV pressure, aborts, chunked prefill and prebuilt requests on) it
then runs the synchronous loop and the overlap loop on the same workload, each several
times, interleaved, and prints the forward's occupancy (its busy share of each run,
measured within the run), throughput, the measured speedup beside the ideal one and
their ratio (the efficiency; these compare two runs, so each is shown with its range),
acceptance length, how many requests were retracted, aborted, chunked and prebuilt,
and whether every overlap run produced the synchronous run's tokens. With --trace or --plot
it then runs each loop once more, traced, on the first requests of the workload,
and writes a Chrome trace (Perfetto, chrome://tracing) or a timeline picture.

Exit status: 0 ok, 1 some outputs differ, 2 bad usage or an unusable device (one
line on stderr), 3 a bundled schema is invalid, 130 Ctrl-C, 143 SIGTERM (both after
removing the private folder).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from relay.cli.status import Exit
from relay.errors import RelayError, SchemaError, SchemaImportError

# torch and the engine are imported where a run needs them, not here: the flags are
# built and checked without them, so a bad flag or a missing extra is refused at once.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from relay.engine.engine import EngineConfig, RunResult
    from relay.engine.maps import MapSource
    from relay.engine.model import ModelConfig
    from relay.engine.scheduler import SchedulerConfig
    from relay.engine.spec import SpecConfig

__all__ = [
    "MODELS",
    "TRACE_REQUESTS",
    "ModeResult",
    "UsageError",
    "add_arguments",
    "bundled_schemas",
    "config_from_args",
    "default_model",
    "main",
    "model_preset",
    "resolve_device",
    "run",
]

#: Requests of the traced runs (--trace, --plot): enough to reach steady decoding,
#: few enough that the trace stays a few MB.
TRACE_REQUESTS = 24
#: What ``--plot`` can write (matplotlib picks the format from the suffix).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
#: The decoding modes, in the order the demo runs them.
MODES = ("decode", "eagle", "ngram")
#: KV pages per slot by default: fewer than a full context needs, so that pages run
#: out when the batch is full and the newest requests are retracted.
PAGES_PER_SLOT = 2
#: Model sizes by name (``model_preset``). ``small`` is the default on the CPU, sized for
#: a 2-core CPU; ``gpu`` on CUDA (``default_model``).
MODELS = ("micro", "tiny", "small", "base", "gpu")
#: The engine's defaults the flags show, written out so that parsing needs no torch
#: (tests/cli/test_demo.py checks them against ``relay.engine``'s configs).
DEFAULTS = {"requests": 200, "arrival_rate": 2.0, "max_running": 64, "page_size": 16}
DEFAULTS |= {"spec_steps": 3, "topk": 2}


def model_preset(name: str) -> ModelConfig:
    """The model of ``--model name``."""
    from relay.engine.model import ModelConfig

    return {
        # A forward so light that the scheduler is a large share of a step, as for a
        # small model on a GPU: with many slots it shows what overlap hides.
        "micro": ModelConfig(
            vocab_size=1024,
            hidden=32,
            layers=1,
            heads=2,
            ffn=64,
            max_context=160,
            eos_boost=1.4,
        ),
        "tiny": ModelConfig(
            vocab_size=1024, hidden=64, layers=1, heads=2, ffn=128, max_context=128
        ),
        "small": ModelConfig(),
        "base": ModelConfig(
            vocab_size=16384, hidden=1024, layers=4, heads=8, ffn=2816, max_context=512
        ),
        # A forward whose device time per step exceeds its launch time on a GPU, once
        # its decode steps replay CUDA graphs (EngineConfig.graphs): the scheduler's
        # host work has device time to hide behind.
        "gpu": ModelConfig(
            vocab_size=16384, hidden=1536, layers=6, heads=12, ffn=4096, max_context=384
        ),
    }[name]


def default_model(device: str) -> str:
    """The model ``relay demo`` runs without ``--model`` on ``device`` (resolved)."""
    return "gpu" if device.startswith("cuda") else "small"


class UsageError(Exception):
    """A flag the demo cannot run with (exit 2, one line)."""


def _number(
    cast: type[float], test: Callable[[float], bool], want: str
) -> Callable[[str], float]:
    """An argparse type: ``cast(text)`` where ``test`` holds, else ``want`` in the error."""

    def parse(text: str) -> float:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text}")
        return value

    return parse


_positive_int = _number(int, lambda v: v >= 1, "a whole number >= 1")
_positive_float = _number(float, lambda v: v > 0, "a number > 0")
_share = _number(float, lambda v: 0 <= v <= 1, "a share in [0, 1]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``relay demo``, in two groups of its help."""
    parser.description = (
        __doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else None
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    _run_arguments(parser.add_argument_group("what runs"))
    _output_arguments(parser.add_argument_group("checks and output"))


def _number_flag(
    group: argparse._ArgumentGroup,
    flag: str,
    parse: Callable[[str], float],
    default: float | None,
    help_text: str,
) -> None:
    """A numeric flag whose help ends with its default."""
    shown = "" if default is None else " (default: %(default)s)"
    group.add_argument(flag, type=parse, default=default, help=help_text + shown)


def _run_arguments(group: argparse._ArgumentGroup) -> None:
    """The model, the workload and the device."""
    group.add_argument(
        "--model",
        choices=sorted(MODELS),
        default=None,
        help="model size (default: small, sized for a 2-core CPU; gpu on CUDA)",
    )
    group.add_argument(
        "--mode",
        choices=["all", *MODES],
        default="all",
        help="plain decoding, EAGLE or n-gram speculative decoding, or all three "
        "(default)",
    )
    group.add_argument(
        "--device",
        default="cpu",
        help="cpu (default), cuda, cuda:N, or auto (cuda when available)",
    )
    number = functools.partial(_number_flag, group)
    number("--requests", _positive_int, DEFAULTS["requests"], "number of requests")
    slots = "request-pool slots"
    number("--max-running", _positive_int, DEFAULTS["max_running"], slots)
    _scheduling_arguments(group)
    rate = "mean arrivals per scheduler step"
    number("--arrival-rate", _positive_float, DEFAULTS["arrival_rate"], rate)
    steps = "draft tokens per branch"
    number("--spec-steps", _positive_int, DEFAULTS["spec_steps"], steps)
    number("--topk", _positive_int, DEFAULTS["topk"], "draft branches per request")
    group.add_argument("--seed", type=int, default=0, help="model and workload seed")
    number(
        "--threads",
        _positive_int,
        1,
        "torch intra-op threads of the CPU forward; the other cores run the scheduler",
    )
    number("--ranks", _positive_int, 1, "data-parallel ranks, one process each")
    repeat = "timed runs of each loop per mode, sync and overlap interleaved; figures"
    repeat += " are medians with their range"
    number("--repeat", _positive_int, 3, repeat)


def _scheduling_arguments(group: argparse._ArgumentGroup) -> None:
    """KV pressure, chunks, aborts and prebuilt requests."""
    number = functools.partial(_number_flag, group)
    number(
        "--kv-pages",
        _positive_int,
        None,
        f"KV budget in pages of {DEFAULTS['page_size']} tokens (default: "
        f"{PAGES_PER_SLOT} per slot, and at least one full context: a full batch "
        "runs out and retracts its newest requests)",
    )
    chunk = "prompt tokens per prefill, and the chunk size"
    number("--prefill-tokens", _positive_int, 256, chunk)
    number("--abort-share", _share, 0.05, "share of requests aborted mid-flight")
    prebuilt = "share of requests arriving prefilled elsewhere"
    number("--prebuilt-share", _share, 0.1, prebuilt)
    for flag, help_text in (
        ("--no-retract", "admission reserves each request's worst case; no retraction"),
        ("--no-chunked-prefill", "prefill each prompt whole"),
        ("--mixed", "a prefill chunk rides in the same forward as the decode rows"),
    ):
        group.add_argument(flag, action="store_true", help=help_text)


def _output_arguments(group: argparse._ArgumentGroup) -> None:
    """Debug mode, generation, and what the run writes."""
    group.add_argument(
        "--debug",
        action="store_true",
        help="maps in debug mode: poisoned buffers, consume-once and fence checks",
    )
    group.add_argument(
        "--no-generate",
        action="store_true",
        help="skip generation and run the packaged maps (relay.maps)",
    )
    group.add_argument(
        "--trace",
        metavar="PATH",
        type=Path,
        help="afterwards, run each loop once more on the first "
        f"{TRACE_REQUESTS} requests and write a Chrome trace of it (torch.profiler; "
        "open in Perfetto or chrome://tracing): named ranges per step on the "
        "scheduler thread and the forward worker",
    )
    group.add_argument(
        "--plot",
        metavar="PATH.png",
        type=Path,
        help="afterwards, draw a timeline of a few steps of those traced runs, sync "
        "above overlap (needs matplotlib: pip install 'relay-futuremap[plot]')",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only the results table and the verdict",
    )


def resolve_device(name: str, ranks: int = 1) -> str:
    """The torch device string for ``--device``; ``UsageError`` when it cannot run here."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(
            f"--device {name!r} is not a device (cpu, cuda, cuda:N or auto)"
        ) from None
    if device.type == "cpu":
        return str(device)
    if device.type != "cuda":
        raise UsageError(f"--device {name}: the reference engine runs on cpu or cuda")
    if not torch.cuda.is_available():
        build = (
            "a CPU-only build"
            if torch.version.cuda is None
            else f"CUDA {torch.version.cuda}"
        )
        raise UsageError(
            f"--device {name}: CUDA is not available here (torch "
            f"{torch.__version__}, {build}); use --device cpu"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UsageError(f"--device {name}: no such GPU ({count} CUDA device(s))")
    if ranks > count:
        raise UsageError(f"--ranks {ranks} on CUDA needs {ranks} GPUs; {count} found")
    return str(device)


def config_from_args(
    args: argparse.Namespace, maps: MapSource | None = None
) -> EngineConfig:
    """The engine configuration (plain decoding, overlap) the flags describe; ``maps``
    defaults to the packaged ``relay.maps``."""
    from relay.engine import EngineConfig, WorkloadConfig
    from relay.engine.maps import MapSource

    device = resolve_device(args.device, args.ranks)
    name = args.model or default_model(device)
    model = attrs.evolve(model_preset(name), seed=args.seed)
    return EngineConfig(
        model=model,
        workload=attrs.evolve(
            WorkloadConfig(),
            requests=args.requests,
            arrival_rate=args.arrival_rate,
            seed=args.seed,
            abort_share=args.abort_share,
            prebuilt_share=args.prebuilt_share,
        ),
        scheduler=_scheduler_for(args, model.max_context),
        device=device,
        # On CUDA decode steps replay graphs, as production engines run them.
        graphs=device.startswith("cuda"),
        debug=args.debug,
        cpu_threads=args.threads,
        maps=maps or MapSource(),
    )


def _scheduler_for(args: argparse.Namespace, max_context: int) -> SchedulerConfig:
    """The scheduler the flags describe. Without retraction the default budget holds
    a full context in every slot, as worst-case admission needs."""
    from relay.engine import SchedulerConfig

    default = SchedulerConfig()
    context_pages = -(-max_context // default.page_size)
    per_slot = context_pages if args.no_retract else PAGES_PER_SLOT
    pages = args.kv_pages or max(context_pages, args.max_running * per_slot)
    return attrs.evolve(
        default,
        max_running=args.max_running,
        max_prefill_tokens=args.prefill_tokens,
        kv_pages=pages,
        retract=not args.no_retract,
        chunked_prefill=not args.no_chunked_prefill,
        mixed=args.mixed,
    )


def _modes(args: argparse.Namespace) -> list[str]:
    return list(MODES) if args.mode == "all" else [args.mode]


def _spec_for(mode: str, args: argparse.Namespace) -> SpecConfig | None:
    from relay.engine import SpecConfig

    return (
        None
        if mode == "decode"
        else SpecConfig(steps=args.spec_steps, topk=args.topk, method=mode)
    )


def bundled_schemas() -> list[Path] | None:
    """The bundled schema modules of ``MAP_MODULES`` (installed with relay, in
    ``relay/schemas/``), or None where one is missing."""
    import relay
    from relay.engine.maps import MAP_MODULES

    root = Path(relay.__file__).resolve().parent / "schemas"
    paths = [root / f"{stem}.py" for stem in MAP_MODULES]
    return paths if all(p.is_file() for p in paths) else None


@contextmanager
def _private_maps(skip: bool, say: Callable[[str], None]) -> Iterator[MapSource]:
    """Generate the bundled schemas into a private temporary folder; the source to run.

    Nothing of the caller's project is read or written (Note [One set of map classes
    per run] in relay/engine/maps.py says how the folder's modules are imported).
    """
    from relay.engine.maps import MapSource

    if skip:
        say(
            "1. generate: skipped (--no-generate); running the packaged maps (relay.maps)"
        )
        yield MapSource()
        return
    schemas = bundled_schemas()
    if schemas is None:
        say(
            "1. generate: the bundled schemas are not installed with this package; "
            "running the packaged maps (relay.maps)"
        )
        yield MapSource()
        return
    from relay.codegen import explicit_job, run_job

    with tempfile.TemporaryDirectory(prefix="relay-demo-") as folder:
        say(f"1. generate the bundled schemas into a private folder, {folder}")
        result = run_job(explicit_job(schemas, Path(folder)))
        for path in result.written:
            say(f"   wrote {path.name}")
        yield MapSource(folder)


# Note [Figures from one run and from two]
# Occupancy, the share of a run's wall time the forward was busy, is measured within
# one run: whatever else the machine runs, it cannot pass 100%, and an overlap that
# hides all the scheduler's work keeps a forward-bound run's forward busy nearly all
# the time. So it is the headline, with its range over the runs. Speedup, ideal and
# efficiency each compare two runs, a sync one and an overlap one after it: another
# process's load or the machine's drift slows one more than the other (and a busy CPU
# may favour the overlap loop's two threads over the sync loop's one), so a pair can
# beat its ideal. They are shown as measured, with their range, and a pair
# above its ideal is marked and listed with its numbers, never capped.


@attrs.frozen
class ModeResult:
    """One mode's runs: ``sync[i]`` and ``overlap[i]`` ran back to back."""

    mode: str
    sync: tuple[RunResult, ...]
    overlap: tuple[RunResult, ...]
    #: The single-rank overlap run, when ranks > 1 (its outputs must match the ranks').
    single: RunResult | None = None

    @property
    def speedups(self) -> list[float]:
        """Overlap / sync throughput of each back-to-back pair."""
        return [
            o.tokens_per_second / s.tokens_per_second
            for s, o in zip(self.sync, self.overlap)
        ]

    @property
    def ideals(self) -> list[float]:
        """The ideal speedup of each pair's sync run."""
        from relay.engine.engine import ideal_speedup

        return [ideal_speedup(s) for s in self.sync]

    @property
    def efficiencies(self) -> list[float]:
        """Each pair's measured / ideal speedup: the share of what overlap could hide
        that it hid, above 1.0 only when the two runs ran at different speeds (Note
        [Figures from one run and from two])."""
        return [m / i for m, i in zip(self.speedups, self.ideals)]

    @property
    def identical(self) -> bool:
        """Every overlap run produced the sync run's tokens (and the single-rank run
        the ranks' tokens, see ``ranks_agree``)."""
        want = self.sync[0].outputs
        same = all(r.outputs == want for r in (*self.sync, *self.overlap))
        return same and (self.single is None or self.ranks_agree)

    @property
    def ranks_agree(self) -> bool:
        """The single-rank run produced the ranks' tokens for every request that no
        run aborted: an abort comes at a step, and how far a request has got by then
        depends on the batches, which differ between one rank and several."""
        if self.single is None:
            return True
        ranked = self.overlap[0]
        aborted = set(self.single.aborted_ids) | set(ranked.aborted_ids)
        return all(
            tokens == ranked.outputs.get(rid)
            for rid, tokens in self.single.outputs.items()
            if rid not in aborted
        )


class _Reporter:
    """Progress and results: rich on a terminal (a live bar with an ETA), plain lines
    otherwise; nothing but the table and the verdict with ``-q``."""

    def __init__(self, quiet: bool) -> None:
        from relay.cli import rich_console

        self.quiet = quiet
        self.console: Console = rich_console()
        self.live = self.console.is_terminal and not quiet
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.done = 0  # requests of the runs finished so far

    def say(self, line: str) -> None:
        if not self.quiet:
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    @contextmanager
    def runs(self, total_requests: int) -> Iterator[None]:
        if not self.live:
            yield
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("   {task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self.task = self.progress.add_task("starting", total=total_requests)
        with self.progress:
            yield
        self.progress = None

    def run_started(self, label: str) -> Callable[[int, int], None]:
        """Called as a run starts; returns the engine's ``progress(done, total)``."""
        progress, task, before = self.progress, self.task, self.done
        if progress is None or task is None:
            return lambda done, total: None
        progress.update(task, description=label)
        return lambda done, total: progress.update(task, completed=before + done)

    def run_finished(self, label: str, result: RunResult, requests: int) -> None:
        self.done += requests
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=self.done)
        self.say(
            f"   {label:<22} {result.wall_seconds:5.1f} s, "
            f"{result.tokens_per_second:7.0f} tok/s, occupancy {result.occupancy:6.1%}"
        )

    def table(self, rows: Sequence[ModeResult], ranks: int) -> None:
        from rich import box
        from rich.table import Table

        # Off a terminal, the same layout in ASCII: a dashed line under the header.
        plain = box.Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)
        table = Table(
            box=box.SIMPLE_HEAD if self.console.is_terminal else plain,
            show_edge=False,
            pad_edge=False,
        )
        # The headline first: occupancy (Note [Figures from one run and from two]).
        columns = "mode,occupancy overlap,occupancy sync,sync tok/s,overlap tok/s"
        columns += ",speedup,ideal,efficiency,accept len,retracted,aborted,chunks"
        columns += ",prebuilt,identical" + (f",{ranks} ranks = 1 rank" * (ranks > 1))
        for name in columns.split(","):
            table.add_column(
                name, justify="left" if name == "mode" else "right", no_wrap=True
            )
        above = []
        for row in rows:
            first, pairs = row.sync[0], zip(row.efficiencies, row.speedups, row.ideals)
            above += [
                f"{row.mode} {e:.0%} ({m:.2f}x against {i:.2f}x)"
                for e, m, i in pairs
                if e > 1
            ]
            cells = [
                row.mode,
                _spread([o.occupancy for o in row.overlap], ".1f", "%"),
                _spread([s.occupancy for s in row.sync], ".1f", "%"),
                f"{statistics.median(s.tokens_per_second for s in row.sync):.0f}",
                f"{statistics.median(o.tokens_per_second for o in row.overlap):.0f}",
                _spread(row.speedups, ".2f", "x"),
                _spread(row.ideals, ".2f", "x"),
                _spread(row.efficiencies, ".0f", "%")
                + "*" * (max(row.efficiencies) > 1),
                f"{row.overlap[0].accept_length:.2f}" if row.mode != "decode" else "-",
                str(first.retractions),
                str(first.aborts),
                str(first.chunks),
                str(first.prebuilt),
                "yes" if row.identical else "NO",
            ]
            if ranks > 1:
                cells.append("yes" if row.ranks_agree else "NO")
            table.add_row(*cells)
        if not self.console.is_terminal:
            # Off a terminal nothing folds: a log or a pipe keeps one line per mode.
            self.console.width = max(self.console.width, 200)
        self.console.print(table)
        if above:
            # Note [Figures from one run and from two]
            self.console.print(
                f"* pairs above their ideal: {', '.join(above)}. Speedup and ideal "
                "come from two runs, which other load on the machine or its drift "
                "slowed unequally; occupancy, from one run, cannot pass 100%",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )

    def verdict(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False)


def _scheduling(config: EngineConfig) -> str:
    """The scheduling features of a run, in words."""
    sched, w = config.scheduler, config.workload
    parts = [
        f"{sched.kv_pages} KV pages"
        + (" (retraction on)" if sched.retract else " (worst case reserved)"),
        f"prefill {sched.max_prefill_tokens} tokens"
        + (" in chunks" if sched.chunked_prefill else "")
        + (", mixed batches" if sched.mixed else ""),
        f"{w.abort_share:.0%} aborted, {w.prebuilt_share:.0%} prebuilt",
    ]
    return ", ".join(parts)


def _spread(values: Sequence[float], spec: str, unit: str) -> str:
    """The median and, where the runs differ, their range: ``1.18x (1.12-1.35)``."""
    scale = 100 if unit == "%" else 1
    figures = statistics.median(values), min(values), max(values)
    median, low, high = (f"{v * scale:{spec}}" for v in figures)
    return f"{median}{unit}" if low == high else f"{median}{unit} ({low}-{high})"


def _run_one(
    config: EngineConfig, label: str, ranks: int, report: _Reporter
) -> RunResult:
    from relay.engine import run_workload

    progress = report.run_started(label)
    if ranks > 1:
        from relay.engine.parallel import run_data_parallel

        result, _ = run_data_parallel(config, ranks)
    else:
        result = run_workload(config, progress=progress)
    report.run_finished(label, result, config.workload.requests)
    return result


def _run_mode(
    config: EngineConfig, mode: str, repeat: int, ranks: int, report: _Reporter
) -> ModeResult:
    sync_config = attrs.evolve(config, overlap=False)
    overlap_config = attrs.evolve(config, overlap=True)
    if ranks == 1:
        # Untimed: a process's first run of a mode is slower (its memory grows,
        # measured 15-30% here), which would flatter whichever run comes second.
        # Ranks run in fresh processes every time, equally cold in both modes.
        _run_one(sync_config, f"{mode} warm-up", 1, report)
    sync: list[RunResult] = []
    overlap: list[RunResult] = []
    for i in range(repeat):
        # Alternate which loop goes first, so a machine slowly speeding up or slowing
        # down does not favour one of them.
        order = [("sync", sync_config, sync), ("overlap", overlap_config, overlap)]
        for name, run_config, results in order if i % 2 == 0 else order[::-1]:
            results.append(
                _run_one(run_config, f"{mode} {name} {i + 1}/{repeat}", ranks, report)
            )
    single = None
    if ranks > 1:
        single = _run_one(overlap_config, f"{mode} overlap, 1 rank", 1, report)
    return ModeResult(mode, tuple(sync), tuple(overlap), single)


def run(args: argparse.Namespace) -> int:
    """Run the demo; the exit status (module doc)."""
    started = time.perf_counter()
    report = _Reporter(args.quiet)
    try:
        # Before any work: exit 2 at once.
        resolve_device(args.device, args.ranks)
        _check_outputs(args)
        with _private_maps(args.no_generate, report.say) as source:
            base = config_from_args(args, source)
            report.say("2. import the generated maps")
            for path in base.maps.load().files:
                report.say(f"   {path}")
            rows = _run_all(args, base, report)
            if not args.quiet:
                report.say("")
            report.table(rows, args.ranks)
            if args.trace is not None or args.plot is not None:
                _trace_and_plot(args, base, report)
    except UsageError as error:
        print(f"relay demo: error: {error}", file=sys.stderr)
        return Exit.USAGE
    except (SchemaError, SchemaImportError) as error:
        print(f"relay demo: a bundled schema is invalid: {error}", file=sys.stderr)
        return Exit.INVALID_SCHEMA
    except RelayError as error:
        print(f"relay demo: error: {error}", file=sys.stderr)
        return Exit.USAGE
    ok = all(row.identical for row in rows)
    report.verdict(
        f"{'all outputs identical' if ok else 'OUTPUTS DIFFER'}; "
        f"demo took {time.perf_counter() - started:.1f} s"
    )
    return Exit.OK if ok else Exit.FAILED


def _check_outputs(args: argparse.Namespace) -> None:
    """``UsageError`` for a --trace or --plot the demo could not write, before any run
    (and before anything is written)."""
    for flag, path in (("--trace", args.trace), ("--plot", args.plot)):
        if path is not None:
            _check_writable(flag, path)
    if args.trace is not None and args.trace == args.plot:
        raise UsageError(f"--trace and --plot both name {args.trace}; name two files")
    if args.plot is None:
        return
    if args.plot.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(
            f"--plot {args.plot}: the picture's name must end in "
            + ", ".join(PLOT_SUFFIXES)
        )
    from relay.cli import plot

    if not plot.available():
        raise UsageError(plot.MISSING)


def _check_writable(flag: str, path: Path) -> None:
    """``UsageError`` unless a file can be written at ``path``: not a folder, in a
    folder that exists and takes a new file (tried with a probe, removed at once)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a folder; name a file in it")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: no folder {folder}")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: the file is not writable")
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".relay-demo-probe-")
    except OSError as error:
        raise UsageError(
            f"{flag} {path}: cannot write in {folder} ({error.strerror})"
        ) from None
    os.close(handle)
    os.unlink(probe)


def _trace_and_plot(
    args: argparse.Namespace, base: EngineConfig, report: _Reporter
) -> None:
    """Run each loop of each mode once more, traced, and write the trace and the plot."""
    from relay.engine import run_workload, trace

    modes = _modes(args)
    requests = min(base.workload.requests, TRACE_REQUESTS)
    traced = attrs.evolve(
        base,
        workload=attrs.evolve(base.workload, requests=requests),
        trace=True,
    )
    report.say("")
    report.say(
        f"4. trace each loop once more on the first {requests} requests"
        + (" (one rank)" if args.ranks > 1 else "")
    )
    with tempfile.TemporaryDirectory(prefix="relay-trace-") as folder:
        path = args.trace if args.trace is not None else Path(folder, "trace.json")
        with trace.record(path, base.device):
            for mode in modes:
                spec = _spec_for(mode, args)
                for overlap in (False, True):
                    run_workload(attrs.evolve(traced, spec=spec, overlap=overlap))
        if args.trace is not None:
            size = path.stat().st_size / 1e6
            report.say(
                f"   wrote the trace {path} ({size:.1f} MB): open it in "
                "https://ui.perfetto.dev or chrome://tracing"
            )
        if args.plot is not None:
            from relay.cli import plot

            plot.timeline(trace.load(path), args.plot, modes)
            report.say(f"   wrote the timeline {args.plot}")


def _run_all(
    args: argparse.Namespace, base: EngineConfig, report: _Reporter
) -> list[ModeResult]:
    w, m = base.workload, base.model
    report.say(
        f"3. run the engine on {base.device}: {w.requests} requests (prompts {w.min_prompt}-"
        f"{w.max_prompt} tokens, output limits {w.min_output}-{w.max_output}, "
        f"{w.arrival_rate:g} arrivals/step), model {args.model or default_model(base.device)} (hidden {m.hidden}, "
        f"{m.layers} layer{'s' if m.layers != 1 else ''}, vocab {m.vocab_size}), "
        f"{base.scheduler.max_running} slots, {_scheduling(base)}"
        + (", debug maps" if base.debug else "")
        + f"; each loop {args.repeat}x per mode, interleaved"
    )
    modes = _modes(args)
    runs_per_mode = 2 * args.repeat + 1  # and a warm-up (1 rank) or a 1-rank check
    rows = []
    with report.runs(len(modes) * runs_per_mode * w.requests):
        for mode in modes:
            spec = _spec_for(mode, args)
            rows.append(
                _run_mode(
                    attrs.evolve(base, spec=spec), mode, args.repeat, args.ranks, report
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """``relay demo ARGV`` (tests call it in process)."""
    from relay.cli import main as relay_main

    return relay_main(["demo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
