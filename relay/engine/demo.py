"""``relay demo``: generate the bundled maps, import them, run the engine both ways.

For plain and speculative decoding it runs the synchronous loop and the overlap
loop on the same workload and prints throughput, speedup, forward occupancy,
acceptance length and whether the two produced the same tokens. The exit code is
1 when any outputs differ.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import torch

from relay.engine.engine import EngineConfig, RunResult, run_workload
from relay.engine.model import ModelConfig
from relay.engine.runner import SpecConfig
from relay.engine.scheduler import SchedulerConfig
from relay.engine.workload import WorkloadConfig
from relay.errors import RelayError

__all__ = ["MODEL_PRESETS", "add_arguments", "config_from_args", "run"]

#: Model sizes by name. ``small`` is the default and is sized for a 2-core CPU.
MODEL_PRESETS: dict[str, ModelConfig] = {
    # A forward so light that the scheduler is a large share of a step, as for a small
    # model on a GPU: with many slots it shows what overlap hides (docs/engine.md).
    "micro": ModelConfig(vocab_size=1024, hidden=32, layers=1, heads=2, ffn=64, max_context=160,
                         eos_boost=1.4),
    "tiny": ModelConfig(vocab_size=1024, hidden=64, layers=1, heads=2, ffn=128, max_context=128),
    "small": ModelConfig(),
    "base": ModelConfig(vocab_size=16384, hidden=1024, layers=4, heads=8, ffn=2816,
                        max_context=512),
}

MAP_MODULES = ("relay.maps.decode", "relay.maps.eagle")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``relay demo``."""
    parser.add_argument("--model", choices=sorted(MODEL_PRESETS), default="small",
                        help="model size (default: small, sized for a 2-core CPU)")
    parser.add_argument("--mode", choices=["both", "decode", "eagle"], default="both",
                        help="plain decoding, EAGLE speculative decoding, or both (default)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default), cuda, cuda:N, or auto (cuda when available)")
    parser.add_argument("--requests", type=int, default=WorkloadConfig().requests,
                        help="number of requests (default: %(default)s)")
    parser.add_argument("--max-running", type=int, default=SchedulerConfig().max_running,
                        help="request-pool slots; the KV budget grows to hold a full context "
                             "in each (default: %(default)s)")
    parser.add_argument("--arrival-rate", type=float, default=WorkloadConfig().arrival_rate,
                        help="mean arrivals per scheduler step (default: %(default)s)")
    parser.add_argument("--spec-steps", type=int, default=SpecConfig().steps,
                        help="draft tokens per branch (default: %(default)s)")
    parser.add_argument("--topk", type=int, default=SpecConfig().topk,
                        help="draft branches per request (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="model and workload seed")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads of the CPU forward (default: 1; the "
                             "other cores run the scheduler)")
    parser.add_argument("--ranks", type=int, default=1,
                        help="data-parallel ranks, one process each (default: 1)")
    parser.add_argument("--debug", action="store_true",
                        help="maps in debug mode: poisoned buffers, consume-once and fence checks")
    parser.add_argument("--no-generate", action="store_true",
                        help="skip generation and use the maps as they are")


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration (plain decoding, overlap) the flags describe."""
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = attrs.evolve(MODEL_PRESETS[args.model], seed=args.seed)
    return EngineConfig(
        model=model,
        workload=attrs.evolve(WorkloadConfig(), requests=args.requests,
                              arrival_rate=args.arrival_rate, seed=args.seed),
        scheduler=_scheduler_for(args.max_running, model.max_context),
        device=device,
        debug=args.debug,
        cpu_threads=args.threads,
    )


def _scheduler_for(max_running: int, max_context: int) -> SchedulerConfig:
    """The default scheduler with ``max_running`` slots and a KV budget that holds them."""
    default = SchedulerConfig()
    pages_per_slot = -(-max_context // default.page_size)
    return attrs.evolve(default, max_running=max_running,
                        kv_pages=max(default.kv_pages, max_running * pages_per_slot))


def _generate(skip: bool) -> list[Path]:
    """Regenerate the bundled maps if this is a source checkout; the files written."""
    if skip:
        print("1. generate: skipped (--no-generate); using the maps as they are")
        return []
    print("1. generate the bundled maps ([tool.relay] in pyproject.toml)", flush=True)
    try:
        from relay.codegen.api import generate_configured
    except ImportError:
        print("   codegen is not installed; using the packaged maps")
        return []
    try:
        result = generate_configured()
    except RelayError as error:
        print(f"   {error}\n   using the packaged maps")
        return []
    for path in result.written:
        print(f"   wrote {path}")
    print(f"   {len(result.written)} written, {len(result.unchanged)} unchanged")
    return list(result.written)


def _import_maps(written: list[Path]) -> None:
    print("2. import the generated maps", flush=True)
    fresh = {p.resolve() for p in written}
    for name in MAP_MODULES:
        module = sys.modules.get(name)
        if module is not None and module.__file__ and Path(module.__file__).resolve() in fresh:
            module = importlib.reload(module)  # imported before it was regenerated
        else:
            module = importlib.import_module(name)
        print(f"   {name:<18} {module.__file__}")


def _progress(label: str) -> Callable[[int, int], None]:
    marks = [0]

    def report(done: int, total: int) -> None:
        quarter = 4 * done // max(total, 1)
        while marks[0] < quarter:
            marks[0] += 1
            print(f" {25 * marks[0]}%", end="", flush=True)

    print(f"   {label:<22}", end="", flush=True)
    return report


def _run_one(config: EngineConfig, label: str, ranks: int) -> RunResult:
    start = time.perf_counter()
    if ranks > 1:
        from relay.engine.parallel import run_data_parallel

        print(f"   {label:<22} {ranks} ranks ...", end="", flush=True)
        result, _ = run_data_parallel(config, ranks)
    else:
        result = run_workload(config, progress=_progress(label))
    print(f"  {time.perf_counter() - start:5.1f} s, {result.tokens_per_second:7.0f} tok/s, "
          f"occupancy {result.occupancy:6.1%}", flush=True)
    return result


@attrs.frozen
class _Row:
    mode: str
    sync: RunResult
    overlap: RunResult
    single: RunResult | None  # the single-rank overlap run, when ranks > 1


def _table(rows: list[_Row], ranks: int) -> str:
    head = ["mode", "sync tok/s", "overlap tok/s", "speedup", "occupancy sync", "occupancy overlap",
            "accept len", "identical"]
    if ranks > 1:
        head.append(f"{ranks} ranks = 1 rank")
    lines = [head]
    for row in rows:
        s, o = row.sync, row.overlap
        cells = [
            row.mode, f"{s.tokens_per_second:.0f}", f"{o.tokens_per_second:.0f}",
            f"{o.tokens_per_second / s.tokens_per_second:.2f}x", f"{s.occupancy:.1%}",
            f"{o.occupancy:.1%}", f"{o.accept_length:.2f}" if row.mode == "eagle" else "-",
            "yes" if s.outputs == o.outputs else "NO",
        ]
        if row.single is not None:
            cells.append("yes" if row.single.outputs == o.outputs else "NO")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every overlap run matched its synchronous run token for token."""
    started = time.perf_counter()
    base = config_from_args(args)
    _import_maps(_generate(args.no_generate))
    w, m = base.workload, base.model
    print(f"3. run the engine on {base.device}: {w.requests} requests (prompts {w.min_prompt}-"
          f"{w.max_prompt} tokens, output limits {w.min_output}-{w.max_output}, "
          f"{w.arrival_rate:g} arrivals/step), model {args.model} (hidden {m.hidden}, "
          f"{m.layers} layer{'s' if m.layers != 1 else ''}, vocab {m.vocab_size}), {base.scheduler.max_running} slots"
          + (", debug maps" if base.debug else ""), flush=True)
    modes = ["decode", "eagle"] if args.mode == "both" else [args.mode]
    rows = []
    for mode in modes:
        spec = SpecConfig(steps=args.spec_steps, topk=args.topk) if mode == "eagle" else None
        config = attrs.evolve(base, spec=spec)
        if args.ranks == 1:
            # Untimed: a process's first run of a mode is slower (its memory grows,
            # measured 15-30% here), which would flatter whichever run comes second.
            # Ranks run in fresh processes every time, equally cold in both modes.
            _run_one(attrs.evolve(config, overlap=False), f"{mode} warm-up", 1)
        sync = _run_one(attrs.evolve(config, overlap=False), f"{mode} sync", args.ranks)
        overlap = _run_one(attrs.evolve(config, overlap=True), f"{mode} overlap", args.ranks)
        single = None
        if args.ranks > 1:
            single = _run_one(attrs.evolve(config, overlap=True), f"{mode} overlap", 1)
        rows.append(_Row(mode, sync, overlap, single))
    print()
    print(_table(rows, args.ranks))
    ok = all(r.sync.outputs == r.overlap.outputs and
             (r.single is None or r.single.outputs == r.overlap.outputs) for r in rows)
    print(f"\n{'all outputs identical' if ok else 'OUTPUTS DIFFER'}; "
          f"demo took {time.perf_counter() - started:.1f} s")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run the demo without the ``relay`` CLI: ``python -m relay.engine.demo``."""
    parser = argparse.ArgumentParser(prog="relay demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
