"""``relay demo``: generate the bundled maps privately, import them, run the engine both ways.

The command-line side of the reference engine (``relay.engine``, a library that
imports nothing from here): flags, model presets, progress and the results table;
``DESCRIPTION`` is what its users read in ``--help``.

The bundled schemas the engine runs (``decode``, ``decode_seq_lens``, ``eagle``,
``ngram``) are generated into a private temporary folder and imported from there: the
demo never reads or writes the caller's project (no ``[tool.relay]`` lookup, nothing
written under the working folder). For each mode it runs the synchronous loop and
the overlap loop on the same workload, several times, interleaved, measuring around
each run what other processes did (``relay.cli.machine``), and prints one row per
mode from each loop's totals (Note [Figures from one run and from two]), with a
note where the speedup passed its ideal or fell below 1.0x. With --trace or --plot
it then runs each loop once more, traced, on the first requests of the workload.

Exit status: 0 ok, 1 some outputs differ, 2 bad usage or an unusable device (one
line on stderr), 3 a bundled schema is invalid, 130 Ctrl-C, 143 SIGTERM (both after
removing the private folder).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from relay.cli.machine import Load, Meter, cores, pooled
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
    "check_device_name",
    "config_from_args",
    "default_model",
    "graphs_on",
    "main",
    "model_preset",
    "resolve_device",
    "run",
]

#: Requests of the traced runs (--trace, --plot): enough to reach steady decoding,
#: few enough that the trace stays a few MB.
TRACE_REQUESTS = 24
#: The refusal of ``--plot`` without matplotlib.
PLOT_MISSING = (
    "--plot needs matplotlib, which is not installed: pip install matplotlib "
    "(or, in a checkout of relay, pip install -e '.[plot]')"
)
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


def graphs_on(flag: bool | None, device: str) -> bool:
    """Whether decode steps run over static buffers (``--graphs``/``--no-graphs``):
    without the flag, on CUDA only, where they replay CUDA graphs as production engines
    run them."""
    return device.startswith("cuda") if flag is None else flag


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


#: What ``relay demo --help`` says before the flags.
DESCRIPTION = """\
Watch overlap scheduling work: a small reference engine decodes the same requests
with a synchronous loop and with an overlap loop (the scheduler builds step N+1
while forward N runs), through maps generated from relay's bundled schemas, and
checks that both loops produce the same tokens.

It runs plain decoding, EAGLE and n-gram speculative decoding (with retraction
under KV pressure, aborts, chunked prefill and prefilled requests), each loop
several times, and prints one row per mode: the forward's busy share of the
overlap runs (occupancy), both loops' throughput, the speedup beside the best a
perfect overlap could give (ideal), and whether the outputs were identical.
--wide adds the rest, --json writes every figure and run to a file. Where overlap
loses to the synchronous loop, or beats its ideal, a note says how busy the machine
was meanwhile.

The maps are generated into a private temporary folder, removed at the end: the
demo reads and writes nothing in the folder you run it from. --trace and --plot
show a few steps of both loops in time.

exit status: 0 ok; 1 outputs differ; 2 bad usage or an unusable device (one line
on stderr); 3 a bundled schema is invalid; 130 Ctrl-C; 143 SIGTERM."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``relay demo``, in two groups of its help."""
    parser.description = DESCRIPTION
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
    group.add_argument(
        "--graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode steps over static buffers per batch-size bucket, captured once "
        "in CUDA graphs and replayed on CUDA, run eagerly over the same buffers on "
        "the CPU; --no-graphs runs every decode step eagerly (default: on for CUDA, "
        "off on the CPU)",
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
        f"{TRACE_REQUESTS} requests and write a Chrome trace of it (open in "
        "Perfetto or chrome://tracing): named ranges per step on the scheduler "
        "thread and the forward worker, and on a GPU the kernels",
    )
    group.add_argument(
        "--plot",
        metavar="PATH.png",
        type=Path,
        help="afterwards, draw a timeline of a few steps of those traced runs, sync "
        "above overlap, each with the machine's load (needs matplotlib)",
    )
    group.add_argument(
        "--wide",
        action="store_true",
        help="every column: each loop's occupancy, the speedups' range, efficiency, "
        "other processes' CPU use, retractions, aborts, chunks, prebuilt requests",
    )
    group.add_argument(
        "--json",
        metavar="PATH",
        type=Path,
        help="also write every figure of the table and of each run to PATH (JSON)",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only the results table and the verdict",
    )


#: What ``--device`` accepts, checked before torch is imported.
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device_name(name: str) -> None:
    """``UsageError`` unless ``name`` is a device the demo runs on; needs no torch."""
    if _DEVICE.fullmatch(name) is None:
        raise UsageError(
            f"--device {name!r}: the reference engine runs on cpu, cuda, cuda:N "
            "or auto (cuda when available)"
        )


def resolve_device(name: str, ranks: int = 1) -> str:
    """The torch device string for ``--device``; ``UsageError`` when it cannot run here."""
    check_device_name(name)
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cpu":
        return str(device)
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
        graphs=graphs_on(args.graphs, device),
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
# Every figure of a row comes from the same totals: each loop's tokens, wall time and
# forward busy time summed over its timed runs. So the speedup is exactly the ratio
# of the two tok/s columns, the ideal is that of the summed sync runs, and the
# occupancy is the forward's busy share of the summed runs of one loop. Occupancy,
# measured within one loop's runs, cannot pass 100% whatever else the machine runs:
# it is the headline. Speedup, ideal and efficiency compare two loops that ran at
# different times: another process's load or the machine's drift slows one more
# than the other (a busy CPU may favour the overlap loop's two threads over the
# sync loop's one, or starve them), so a mode can beat its ideal or lose to the
# synchronous loop. Then a note below the table says so, with the CPU time other
# processes used during each loop's runs as measured (relay.cli.machine); nothing is
# capped or waved off. The single runs' spread is in --wide and --json.


@attrs.frozen
class ModeResult:
    """One mode's runs: ``sync[i]`` and ``overlap[i]`` ran back to back."""

    mode: str
    sync: tuple[RunResult, ...]
    overlap: tuple[RunResult, ...]
    #: The single-rank overlap run, when ranks > 1 (its outputs must match the ranks').
    single: RunResult | None = None
    #: Other processes' CPU use during each run (``relay.cli.machine``), if measured.
    sync_loads: tuple[Load, ...] = ()
    overlap_loads: tuple[Load, ...] = ()

    @property
    def sync_total(self) -> RunResult:
        """The sync runs as one: tokens, wall and busy time summed."""
        return _summed(self.sync)

    @property
    def overlap_total(self) -> RunResult:
        """The overlap runs as one: tokens, wall and busy time summed."""
        return _summed(self.overlap)

    @property
    def speedup(self) -> float:
        """Overlap over sync throughput, both from their totals."""
        sync = self.sync_total.tokens_per_second
        return self.overlap_total.tokens_per_second / sync if sync else 0.0

    @property
    def ideal(self) -> float:
        """The ideal speedup of the summed sync runs."""
        from relay.engine.engine import ideal_speedup

        return ideal_speedup(self.sync_total)

    @property
    def efficiency(self) -> float:
        """Measured over ideal speedup: the share of what overlap could hide that it
        hid, above 1.0 only when the loops ran at different speeds (Note [Figures from
        one run and from two])."""
        return self.speedup / self.ideal

    @property
    def speedups(self) -> list[float]:
        """Overlap / sync throughput of each back-to-back pair (their spread)."""
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
        """Each pair's measured / ideal speedup."""
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


def _summed(runs: Sequence[RunResult]) -> RunResult:
    """``runs`` as one run: tokens, wall time and forward busy time summed."""
    return attrs.evolve(
        runs[0],
        generated_tokens=sum(r.generated_tokens for r in runs),
        wall_seconds=sum(r.wall_seconds for r in runs),
        forward_busy_seconds=sum(r.forward_busy_seconds for r in runs),
    )


#: The table's columns: (header, shown without --wide). Headers are two words at most
#: per line, so that the default table fits in 80 columns.
_COLUMNS = (
    ("mode", True),
    ("occupancy\noverlap", True),
    ("occupancy\nsync", False),
    ("tok/s\nsync", True),
    ("tok/s\noverlap", True),
    ("speedup", True),
    ("pairs\nrange", False),
    ("ideal", True),
    ("efficiency", False),
    ("other CPU\nsync", False),
    ("other CPU\noverlap", False),
    ("accept\nlength", True),
    ("retracted", False),
    ("aborted", False),
    ("chunks", False),
    ("prebuilt", False),
    ("outputs\nidentical", True),
)
_RANKS_COLUMN = ("1 rank\nagrees", True)


def _cores_used(load: Load | None) -> str:
    """Other processes' CPU use as a cell: ``1.4 cores``, or ``-`` where unknown."""
    used = None if load is None else load.others_cores
    return "-" if used is None else f"{used:.1f} cores"


def _cells(row: ModeResult, ranks: int) -> dict[str, str]:
    """Every column's cell of ``row`` (Note [Figures from one run and from two])."""
    sync, overlap = row.sync_total, row.overlap_total
    first = row.sync[0]
    mark = "*" if row.speedup > row.ideal else "!" if row.speedup < 1 else ""
    cells = {
        "mode": row.mode,
        "occupancy\noverlap": f"{overlap.occupancy:.1%}",
        "occupancy\nsync": f"{sync.occupancy:.1%}",
        "tok/s\nsync": f"{sync.tokens_per_second:,.0f}",
        "tok/s\noverlap": f"{overlap.tokens_per_second:,.0f}",
        "speedup": f"{row.speedup:.2f}x{mark}",
        "pairs\nrange": _range(row.speedups, ".2f", "x"),
        "ideal": f"{row.ideal:.2f}x",
        "efficiency": f"{row.efficiency:.0%}",
        "other CPU\nsync": _cores_used(pooled(row.sync_loads)),
        "other CPU\noverlap": _cores_used(pooled(row.overlap_loads)),
        "accept\nlength": f"{row.overlap[0].accept_length:.2f}"
        if row.mode != "decode"
        else "-",
        "retracted": str(first.retractions),
        "aborted": str(first.aborts),
        "chunks": str(first.chunks),
        "prebuilt": str(first.prebuilt),
        "outputs\nidentical": "yes" if row.identical else "NO",
    }
    if ranks > 1:
        cells[_RANKS_COLUMN[0]] = "yes" if row.ranks_agree else "NO"
    return cells


def _range(values: Sequence[float], spec: str, unit: str) -> str:
    """The lowest and highest of the runs: ``1.12-1.35x``, one figure where they agree."""
    low, high = (f"{v:{spec}}" for v in (min(values), max(values)))
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def _machine_words(row: ModeResult) -> str:
    """What other processes did during the mode's runs, as measured."""
    sync, overlap = pooled(row.sync_loads), pooled(row.overlap_loads)
    if sync is None or overlap is None or None in (sync.others, overlap.others):
        return "this system does not report other processes' CPU time"
    words = (
        f"other processes used {sync.others_cores:.1f} of this machine's "
        f"{cores()} cores during the sync runs and {overlap.others_cores:.1f} during "
        "the overlap runs"
    )
    stolen = max(sync.stolen_cores or 0.0, overlap.stolen_cores or 0.0)
    if stolen >= 0.05:
        words += f", and the host took up to {stolen:.1f} cores from this machine"
    if overlap.load_average is not None:
        words += f" (load average {overlap.load_average:.1f})"
    return words


def _notes(rows: Sequence[ModeResult], threads: int) -> list[str]:
    """A line for each mode whose overlap beat its ideal (``*``) or lost to the
    synchronous loop (``!``), with the machine's load as measured."""
    notes = []
    for row in rows:
        speed = f"{row.speedup:.2f}x against an ideal of {row.ideal:.2f}x"
        if row.speedup > row.ideal:
            notes.append(
                f"* {row.mode}: {speed}. Speedup and ideal compare loops run at "
                f"different times, which other load slowed unequally: "
                f"{_machine_words(row)}.{_why_faster(row, threads)} Occupancy, "
                "measured within a loop's runs, cannot pass 100%."
            )
        elif row.speedup < 1:
            notes.append(
                f"! {row.mode}: overlap was slower than sync, {speed}: "
                f"{_machine_words(row)}. {_why_slower(row, threads)}"
            )
    return notes


def _short_of_cores(used: float, threads: int) -> bool:
    """Whether other processes' use left the overlap loop's threads short of a core
    each, by half a core or more (a tenth of a core busy elsewhere is no shortage)."""
    return cores() - used <= threads - 0.5


def _why_faster(row: ModeResult, threads: int) -> str:
    """What a busy machine does for the overlap loop, where it was busy; else ``""``."""
    sync = pooled(row.sync_loads)
    used = None if sync is None else sync.others_cores
    if used is None or threads < 2 or not _short_of_cores(used, threads):
        return ""
    return (
        f" With fewer cores free than the overlap loop's {threads} threads, the "
        "operating system may also give them a larger share of the CPU than the "
        "synchronous loop's one thread."
    )


def _why_slower(row: ModeResult, threads: int) -> str:
    """Whether the machine's measured load explains an overlap slower than sync."""
    overlap = pooled(row.overlap_loads)
    used = None if overlap is None else overlap.others_cores
    hidden = 1 - 1 / row.ideal
    if used is None:
        return ""
    free = cores() - used
    if _short_of_cores(used, threads):
        return (
            f"The overlap loop runs its scheduler and its forward at once, on {threads} "
            f"threads; with about {max(free, 0):.1f} cores free they took turns, and "
            "overlap only added the cost of handing work between them."
        )
    return (
        f"About {free:.1f} cores were free, enough for the overlap loop's {threads} "
        "threads, so the machine's load does not explain it: overlap's own costs "
        f"outweighed the {hidden:.0%} of a sync step it can hide."
    )


class _Reporter:
    """Progress and results: rich on a terminal (a live bar with an ETA), plain lines
    otherwise; nothing but the table and the verdict with ``-q``."""

    def __init__(
        self, quiet: bool, wide: bool = False, console: Console | None = None
    ) -> None:
        from relay.cli import rich_console

        self.quiet = quiet
        self.wide = wide
        self.console: Console = console or rich_console()
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

    def run_finished(
        self, label: str, result: RunResult, requests: int, load: Load | None
    ) -> None:
        self.done += requests
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=self.done)
        used = None if load is None else load.others_cores
        elsewhere = "" if used is None else f", other processes {used:.1f} cores"
        self.say(
            f"   {label:<22} {result.wall_seconds:5.1f} s, "
            f"{result.tokens_per_second:7.0f} tok/s, occupancy {result.occupancy:6.1%}"
            + elsewhere
        )

    def table(self, rows: Sequence[ModeResult], ranks: int, threads: int = 2) -> None:
        """The results, one row per mode, and a note for each mode whose speedup
        passed its ideal or fell below 1.0x; ``threads``: how many the overlap loop
        runs at once."""
        from rich import box
        from rich.table import Table

        # Off a terminal, the same layout in ASCII: a dashed line under the header.
        plain = box.Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)
        table = Table(
            box=box.SIMPLE_HEAD if self.console.is_terminal else plain,
            show_edge=False,
            pad_edge=False,
            # Two blanks between columns, not three: the default table fits 80.
            collapse_padding=True,
        )
        columns = [*_COLUMNS, *([_RANKS_COLUMN] if ranks > 1 else [])]
        names = [name for name, default in columns if default or self.wide]
        for name in names:
            table.add_column(
                name, justify="left" if name == "mode" else "right", no_wrap=True
            )
        for row in rows:
            cells = _cells(row, ranks)
            table.add_row(*(cells[name] for name in names))
        if self.wide and not self.console.is_terminal:
            # Off a terminal nothing folds: a log or a pipe keeps one line per mode.
            self.console.width = max(self.console.width, 200)
        self.console.print(table)
        # Notes are prose: wrapped at 80 columns (or a narrower terminal's width) even
        # off a terminal, where the console is wide so that the table never folds.
        for note in _notes(rows, threads):
            self.console.print(
                note, highlight=False, markup=False, width=min(self.console.width, 80)
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


def _run_one(
    config: EngineConfig, label: str, ranks: int, report: _Reporter
) -> tuple[RunResult, Load | None]:
    from relay.engine import run_workload

    progress = report.run_started(label)
    meter = Meter()
    with meter:
        if ranks > 1:
            from relay.engine.parallel import run_data_parallel

            result, _ = run_data_parallel(config, ranks)
        else:
            result = run_workload(config, progress=progress)
    report.run_finished(label, result, config.workload.requests, meter.load)
    return result, meter.load


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
    runs: dict[str, list[tuple[RunResult, Load | None]]] = {"sync": [], "overlap": []}
    for i in range(repeat):
        # Alternate which loop goes first, so a machine slowly speeding up or slowing
        # down does not favour one of them.
        order = [("sync", sync_config), ("overlap", overlap_config)]
        for name, run_config in order if i % 2 == 0 else order[::-1]:
            label = f"{mode} {name} {i + 1}/{repeat}"
            runs[name].append(_run_one(run_config, label, ranks, report))
    single = None
    if ranks > 1:
        single, _ = _run_one(overlap_config, f"{mode} overlap, 1 rank", 1, report)
    sync, overlap = runs["sync"], runs["overlap"]
    return ModeResult(
        mode,
        tuple(r for r, _ in sync),
        tuple(r for r, _ in overlap),
        single,
        tuple(x for _, x in sync if x is not None),
        tuple(x for _, x in overlap if x is not None),
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; the exit status (module doc)."""
    started = time.perf_counter()
    report = _Reporter(args.quiet, args.wide)
    try:
        # Before any work: exit 2 at once, and without torch where it can.
        check_device_name(args.device)
        _check_outputs(args)
        resolve_device(args.device, args.ranks)
        with _private_maps(args.no_generate, report.say) as source:
            base = config_from_args(args, source)
            report.say("2. import the generated maps")
            for path in base.maps.load().files:
                report.say(f"   {path}")
            rows = _run_all(args, base, report)
            if not args.quiet:
                report.say("")
            # The CPU overlap loop's forward worker runs beside the scheduler thread.
            cpu = base.device == "cpu"
            report.table(rows, args.ranks, args.threads + 1 if cpu else 1)
            if args.json is not None:
                _write_json(args.json, args, base, rows)
                report.say(f"   wrote every figure to {args.json}")
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
    outputs = [("--trace", args.trace), ("--plot", args.plot), ("--json", args.json)]
    named = [(flag, path) for flag, path in outputs if path is not None]
    for flag, path in named:
        _check_writable(flag, path)
    for i, (flag, path) in enumerate(named):
        for other, same in named[i + 1 :]:
            if path == same:
                raise UsageError(f"{flag} and {other} both name {path}; name two files")
    if args.plot is None:
        return
    if args.plot.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(
            f"--plot {args.plot}: the picture's name must end in "
            + ", ".join(PLOT_SUFFIXES)
        )
    # Not through relay.cli.plot, which imports torch.
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(PLOT_MISSING)


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


def _write_json(
    path: Path, args: argparse.Namespace, base: EngineConfig, rows: Sequence[ModeResult]
) -> None:
    """Every figure of the table, and each timed run's, as JSON (``--json``)."""
    flags = {
        k: str(v) if isinstance(v, Path) else v
        for k, v in sorted(vars(args).items())
        if k != "command"
    }
    data = {
        "flags": flags,
        "device": base.device,
        "cores": cores(),
        "modes": [_mode_json(row) for row in rows],
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _mode_json(row: ModeResult) -> dict[str, object]:
    """One mode's figures (Note [Figures from one run and from two]) and runs."""
    sync, overlap = row.sync_total, row.overlap_total
    first = row.sync[0]

    def run(loop: str, result: RunResult, load: Load | None) -> dict[str, object]:
        return {
            "loop": loop,
            "wall_seconds": result.wall_seconds,
            "forward_busy_seconds": result.forward_busy_seconds,
            "generated_tokens": result.generated_tokens,
            "tokens_per_second": result.tokens_per_second,
            "occupancy": result.occupancy,
            "other_processes_cores": None if load is None else load.others_cores,
            "stolen_cores": None if load is None else load.stolen_cores,
            "load_average": None if load is None else load.load_average,
        }

    def loads(found: tuple[Load, ...], n: int) -> list[Load | None]:
        return list(found) if len(found) == n else [None] * n

    runs = [
        run(loop, result, load)
        for loop, results, found in (
            ("sync", row.sync, row.sync_loads),
            ("overlap", row.overlap, row.overlap_loads),
        )
        for result, load in zip(results, loads(found, len(results)))
    ]
    return {
        "mode": row.mode,
        "sync_tokens_per_second": sync.tokens_per_second,
        "overlap_tokens_per_second": overlap.tokens_per_second,
        "speedup": row.speedup,
        "ideal": row.ideal,
        "efficiency": row.efficiency,
        "pair_speedups": row.speedups,
        "occupancy_overlap": overlap.occupancy,
        "occupancy_sync": sync.occupancy,
        "accept_length": row.overlap[0].accept_length if row.mode != "decode" else None,
        "retracted": first.retractions,
        "aborted": first.aborts,
        "chunks": first.chunks,
        "prebuilt": first.prebuilt,
        "identical": row.identical,
        "ranks_agree": row.ranks_agree,
        "runs": runs,
    }


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
    loads: dict[str, Load] = {}
    with tempfile.TemporaryDirectory(prefix="relay-trace-") as folder:
        path = args.trace if args.trace is not None else Path(folder, "trace.json")
        with trace.record(path, base.device):
            for mode in modes:
                spec = _spec_for(mode, args)
                for overlap in (False, True):
                    meter = Meter()
                    with meter:
                        run_workload(attrs.evolve(traced, spec=spec, overlap=overlap))
                    if meter.load is not None:
                        loads[f"{mode} {'overlap' if overlap else 'sync'}"] = meter.load
        if args.trace is not None:
            size = path.stat().st_size / 1e6
            report.say(
                f"   wrote the trace {path} ({size:.1f} MB): open it in "
                "https://ui.perfetto.dev or chrome://tracing"
            )
        if args.plot is not None:
            from relay.cli import plot

            machine = {
                run: f"other processes {load.others_cores:.1f} of {cores()} cores"
                for run, load in loads.items()
                if load.others_cores is not None
            }
            plot.timeline(trace.load(path), args.plot, modes, machine)
            report.say(f"   wrote the timeline {args.plot}")


#: What ``--graphs`` adds to the run's line, by whether the device is CUDA.
_STATIC = {
    True: ", decode steps in CUDA graphs",
    False: ", decode steps over static buffers",
}


def _run_all(
    args: argparse.Namespace, base: EngineConfig, report: _Reporter
) -> list[ModeResult]:
    w, m = base.workload, base.model
    model = args.model or default_model(base.device)
    report.say(
        f"3. run the engine on {base.device}: {w.requests} requests (prompts {w.min_prompt}-"
        f"{w.max_prompt} tokens, output limits {w.min_output}-{w.max_output}, "
        f"{w.arrival_rate:g} arrivals/step), model {model} (hidden {m.hidden}, "
        f"{m.layers} layer{'s' if m.layers != 1 else ''}, vocab {m.vocab_size}), "
        f"{base.scheduler.max_running} slots, {_scheduling(base)}"
        + (", debug maps" if base.debug else "")
        + (_STATIC[base.device.startswith("cuda")] if base.graphs else "")
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
