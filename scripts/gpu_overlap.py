"""The overlap bars on a GPU, with the configuration ``relay demo --device cuda`` runs by
default (its ``gpu`` model, decode steps replaying CUDA graphs):

    PYTHONPATH=. python3 scripts/gpu_overlap.py [--device cuda] [--json PATH]
    PYTHONPATH=. python3 scripts/gpu_overlap.py --dry-run   # the plumbing, on the CPU
    PYTHONPATH=. python3 scripts/gpu_overlap.py --short     # the sanitizers' workload

Per mode, ``--repeat`` back-to-back pairs of a synchronous and an overlap run (after one
untimed pair, which warms up the allocator and the kernels): the overlap run's forward
occupancy, the speedup (overlap / sync throughput), the ideal (``ideal_speedup`` of the
sync run) and the efficiency (speedup / ideal), medians; the outputs of every run must
be the first sync run's. Exit 0 when every mode meets the bars (occupancy >= 95%,
efficiency >= 90%, outputs identical), 1 otherwise. ``--dry-run`` runs the ``tiny``
model on the CPU with a short workload and reports the figures without judging them
(exit 1 only if outputs differ or no decode step ran over the static buffers).
``--short`` is the sanitizers' workload: on the device, the ``tiny`` model, 4 requests
of 4 to 16 output tokens in 4 slots, one synchronous and one overlap run per mode,
nothing timed (exit 1 only if outputs differ or no decode step ran over the static
buffers, which the overlap run replays as CUDA graphs on CUDA). ``scripts/gpu_check.sh``
runs it as its ``overlap`` step and, ``--short``, under each sanitizer;
``scripts/gpu_figures.py`` reads its JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import attrs

from relay.cli import demo
from relay.engine.engine import EngineConfig, RunResult, ideal_speedup, run_workload
from relay.engine.spec import SpecConfig

OCCUPANCY_BAR = 0.95
EFFICIENCY_BAR = 0.90
MODES = ("decode", "eagle")


def demo_config(device: str, dry_run: bool) -> EngineConfig:
    """The configuration ``relay demo --device DEVICE`` runs with its defaults (a dry
    run: the ``tiny`` model and 16 requests, its decode steps over the static buffers
    the CUDA graphs capture, run eagerly on the CPU)."""
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    flags = ["--device", device]
    if dry_run:
        flags += ["--model", "tiny", "--requests", "16", "--max-running", "8"]
    config = demo.config_from_args(parser.parse_args(flags))
    return attrs.evolve(config, graphs=True) if dry_run else config


def short_config(device: str) -> EngineConfig:
    """The sanitizers' workload (``--short``): few kernels, every path of a step (the
    static-buffer phases, the publish between them, the stash after), over graphs."""
    config = demo_config(device, dry_run=True)
    workload = attrs.evolve(config.workload, requests=4, min_output=4, max_output=16)
    scheduler = attrs.evolve(config.scheduler, max_running=4)
    return attrs.evolve(config, workload=workload, scheduler=scheduler)


def short_run(config: EngineConfig, mode: str) -> list[str]:
    """One synchronous and one overlap run of ``mode``: what is wrong (empty: nothing)."""
    config = attrs.evolve(config, spec=_spec(mode))
    sync = run_workload(attrs.evolve(config, overlap=False))
    overlap = run_workload(attrs.evolve(config, overlap=True))
    steps = sum(overlap.bucket_steps.values())
    print(
        f"{mode}: {overlap.generated_tokens} tokens, identical "
        f"{sync.outputs == overlap.outputs}, graphs {overlap.graphs_captured}, steps in "
        f"buckets {steps}"
    )
    wrong = [] if sync.outputs == overlap.outputs else [f"{mode}: outputs differ"]
    return wrong + ([] if steps else [f"{mode}: no step over the static buffers"])


def _spec(mode: str) -> SpecConfig | None:
    return None if mode == "decode" else SpecConfig(method=mode)


def measure(config: EngineConfig, mode: str, repeat: int) -> dict[str, Any]:
    """One mode's figures against the bars."""
    config = attrs.evolve(config, spec=_spec(mode))
    pairs: list[tuple[RunResult, RunResult]] = []
    for _ in range(repeat + 1):  # the first pair is not timed
        sync = run_workload(attrs.evolve(config, overlap=False))
        overlap = run_workload(attrs.evolve(config, overlap=True))
        pairs.append((sync, overlap))
    want = pairs[0][0].outputs
    identical = all(s.outputs == want and o.outputs == want for s, o in pairs)
    timed = pairs[1:]
    speedups = [o.tokens_per_second / s.tokens_per_second for s, o in timed]
    ideals = [ideal_speedup(s) for s, _ in timed]
    overlap_runs = [o for _, o in timed]
    return {
        "mode": mode,
        "sync_tok_s": statistics.median(s.tokens_per_second for s, _ in timed),
        "overlap_tok_s": statistics.median(o.tokens_per_second for o in overlap_runs),
        "speedup": statistics.median(speedups),
        "ideal": statistics.median(ideals),
        "efficiency": statistics.median(m / i for m, i in zip(speedups, ideals)),
        "occupancy": statistics.median(o.occupancy for o in overlap_runs),
        "sync_occupancy": statistics.median(s.occupancy for s, _ in timed),
        "identical": identical,
        "graphs_captured": overlap_runs[0].graphs_captured,
        "bucket_steps": sum(overlap_runs[0].bucket_steps.values()),
        "eager_decode_steps": overlap_runs[0].eager_decode_steps,
    }


def verdict(row: dict[str, Any]) -> list[str]:
    """The bars a mode's figures miss (empty: it meets them all)."""
    missed = []
    if row["occupancy"] < OCCUPANCY_BAR:
        missed.append(f"occupancy {row['occupancy']:.1%} < {OCCUPANCY_BAR:.0%}")
    if row["efficiency"] < EFFICIENCY_BAR:
        missed.append(f"efficiency {row['efficiency']:.1%} < {EFFICIENCY_BAR:.0%}")
    if not row["identical"]:
        missed.append("overlap outputs differ from sync")
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeat", type=int, default=3, help="timed pairs per mode")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="the tiny model on the CPU, figures not judged",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="the sanitizers' workload on --device: one untimed pair per mode",
    )
    args = parser.parse_args(argv)
    if args.short:
        wrong = [
            w for mode in args.modes for w in short_run(short_config(args.device), mode)
        ]
        print("; ".join(wrong) if wrong else "PASS")
        return 1 if wrong else 0
    device = "cpu" if args.dry_run else args.device
    config = demo_config(device, args.dry_run)
    m = config.model
    print(
        f"device {config.device}, model hidden {m.hidden} x {m.layers} layers, vocab "
        f"{m.vocab_size}; {config.workload.requests} requests, "
        f"{config.scheduler.max_running} slots; graphs {config.graphs}"
    )
    rows = [measure(config, mode, args.repeat) for mode in args.modes]
    failed = False
    for row in rows:
        missed = verdict(row)
        if not row["bucket_steps"]:
            missed.append("no decode step ran over the static buffers")
        judged = missed if not args.dry_run else [p for p in missed if "%" not in p]
        failed |= bool(judged)
        row["missed"] = missed
        print(
            f"{row['mode']}: sync {row['sync_tok_s']:.0f} tok/s, overlap "
            f"{row['overlap_tok_s']:.0f} tok/s, speedup {row['speedup']:.2f}x of ideal "
            f"{row['ideal']:.2f}x (efficiency {row['efficiency']:.0%}), occupancy "
            f"{row['occupancy']:.1%}, identical {row['identical']}, graphs "
            f"{row['graphs_captured']}, steps in buckets {row['bucket_steps']}, eager "
            f"{row['eager_decode_steps']}: "
            + ("; ".join(missed) if missed else "meets the bars")
        )
    if args.json is not None:
        document = {"device": config.device, "dry_run": args.dry_run, "modes": rows}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.dry_run:
        print("dry run: the bars are not judged on the CPU")
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
