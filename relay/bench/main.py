"""``relay bench``: flags, a configuration measured, the report (docs/bench.md)."""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relay.cli.status import Exit

__all__ = ["SPAN_MAPS", "add_arguments", "flags_problem", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = Exit.OK, Exit.FAILED, Exit.USAGE

#: Each flag's default, and under ``--quick``; ``--spans``' batches and maps below.
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "pool": ((257, 4097), (257,)),
    "batch": ((1, 32, 256), (1, 32)),
    "topk": ((1, 8), (1,)),
    "hidden": ((4096, 7168), (4096,)),
    "repeat": (15, 5),
    "sample_ms": (0.25, 0.1),
}
SPAN_BATCHES = (1, 8, 64, 256)
SPAN_MAPS = ("vllm_drafts", "ngram", "vllm_v1_drafts", "vllm_v2_drafts")
CHECK_STEPS = 3
SIDES = ("baseline", "generated", "floor", "bare")
HEADER = """\
baseline: the sglang-style map an engine keeps by hand (relay/bench/baseline.py); \
generated: the bundled map, debug off
floor: the same torch calls as plain tensor methods, plus relay's host check of a CPU \
write's slots (one per write call); bare: the floor without that check
ops: data ops per step, baseline / generated (+ the CPU host check's); ratios: median \
of the per-repeat ratios (p25-p75)"""


def _ints(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdecimal() for part in parts):
        raise argparse.ArgumentTypeError(f"expected non-negative ints, got {text!r}")
    return tuple(map(int, parts))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    ints: dict[str, Any] = {"type": _ints}
    names: dict[str, Any] = {"type": lambda t: tuple(t.split(","))}
    add("--quick", action="store_true", help="a small grid and 5 repeats: seconds")
    add("--schema", **names, metavar="NAMES", help="bundled schemas (default: all)")
    add("--pool", **ints, metavar="P,...", help="pool sizes (default 257,4097)")
    add("--batch", **ints, metavar="B,...", help="batch sizes (default 1,32,256)")
    add("--topk", **ints, metavar="K,...", help="top-k of EAGLE maps (default 1,8)")
    add("--hidden", **ints, metavar="H,...", help="bf16 hidden, 0: none (4096,7168)")
    add("--device", default="cpu", help="torch device: cpu, cuda:0... (default cpu)")
    add("--repeat", type=int, metavar="N", help="timed samples per side (default 15)")
    add("--warmup", type=int, default=3, metavar="N", help="untimed steps first (3)")
    add("--sample-ms", type=float, metavar="MS", help="length of a sample (0.25)")
    add("--threads", type=int, default=1, help="torch threads (1; 0: torch's)")
    add("--seed", type=int, default=0, help="seed of the workloads")
    add("--json", type=Path, metavar="PATH", help="also write every figure to PATH")
    add("-q", "--quiet", action="store_true", help="no progress on stderr")
    add("--spans", action="store_true", help="time the counted scatters (--schema)")


def _usage(message: str) -> int:
    print(f"relay bench: {message}", file=sys.stderr)
    return EXIT_USAGE


def flags_problem(args: argparse.Namespace) -> str | None:
    """Fills in the flags not given; what is wrong with them, seen without torch."""
    if args.spans and args.batch is None:
        args.batch = SPAN_BATCHES
    if args.spans and not set(args.schema or ()) <= set(SPAN_MAPS):
        return f"--spans times {', '.join(SPAN_MAPS)} (--schema)"
    for name, (default, quick) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    if min(args.topk) < 1 or min(args.pool) < 2 or min(args.batch) < 1:
        return "--topk and --batch must be >= 1, --pool >= 2 (row 0 is scratch)"
    if args.repeat < 1 or not (math.isfinite(args.sample_ms) and args.sample_ms > 0):
        return "--repeat must be >= 1 and --sample-ms > 0"
    if args.warmup < 0 or args.threads < 0:
        return "--warmup and --threads must be >= 0 (--threads 0 keeps torch's)"
    if all(batch > pool - 1 for pool in args.pool for batch in args.batch):
        return "no shape fits: a pool of P rows holds at most P - 1 requests"
    return None


def _configs(args: argparse.Namespace) -> list[Any] | str:
    from relay.bench.sides import PAIRS, Shape, discover

    unknown = [s for s in args.schema or () if s not in [p.schema for p in PAIRS]]
    if unknown:
        known = ", ".join(dict.fromkeys(p.schema for p in PAIRS))
        return f"no baseline is declared for {', '.join(unknown)}; choose from {known}"
    found, skipped = discover(args.schema)
    for pair, why in skipped:
        print(f"relay bench: {pair.name} skipped ({why})", file=sys.stderr)
    if not found:
        return "no generated map to compare: every schema was skipped"
    configs = []
    for pair, gen in found:
        topks = args.topk if pair.spec else [0]
        hiddens = args.hidden if pair.spec and pair.hidden else [0]
        grid = itertools.product(args.pool, args.batch, topks, hiddens)
        configs += [(pair, gen, Shape(*s)) for s in grid if s[1] <= s[0] - 1]
    return configs  # not empty: flags_problem saw a shape that fits


def measure(pair: Any, gen: Any, shape: Any, device: Any, args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """One configuration: values checked, ops counted, the sides timed."""
    from relay.bench import plain, sides, timing
    from relay.opcount import count_ops
    from relay.schema import Schema

    problems = sides.compare_values(pair, gen, shape, device, steps=CHECK_STEPS, seed=args.seed)  # fmt: skip
    work = sides.Workload.random(shape, device, args.seed)
    base, side = sides.pair_sides(pair, gen, shape, device, work)
    schema, methods = Schema.bundled(pair.schema), [m for m, _ in side.calls]
    try:
        floors, missing = [
            plain.build_plain(schema, side.map, shape, work, methods, graph=pair.graph, check=check)
            for check in (True, False)
        ], None  # fmt: skip
    except plain.Unsupported as why:
        floors, missing = [], str(why)
    driven: list[Any] = [base, side, *floors]
    for _ in range(2):  # the steady state: lazy buffers allocated, first calls made
        for each in driven:
            each.step()
    for name, floor in zip(SIDES[2:], floors):  # as many steps: the same values now
        problems += [
            f"{pair.name} {shape.label}: the {name} floor's {key} differs"
            for key, _, _ in sides.differences(side.batch, floor.batch)
        ]
    counted = {k: {m: count_ops(c) for m, c in s.calls} for k, s in zip(SIDES, driven)}
    timed = timing.figures({k: s.step for k, s in zip(SIDES, driven)}, device, args)
    inner = max(1, int(args.sample_ms * 1e6 // max(timed["ns"]["baseline"], 1)))
    host = timing.per_method([base.calls, side.calls], device, repeat=args.repeat, inner=inner)  # fmt: skip
    fields = [f.name for f in schema.fields]
    return {
        "schema": pair.schema, "name": pair.name, "graph": pair.graph,
        "baseline": pair.design, "label": shape.label, "pool": shape.pool,
        "batch": shape.batch, "topk": shape.topk, "hidden": shape.hidden,
        "ok": not problems, "problems": problems, "error": None,
        "ops": {k: sum(len(c.data) for c in v.values()) for k, v in counted.items()},
        "methods": {
            k: {m: {"ops": list(c.data), "views": len(c.views)} for m, c in v.items()}
            for k, v in counted.items()
        },
        **timed,
        "host_ns": dict(zip(SIDES, host)),
        "bytes": {k: sides.buffer_bytes(s.map, fields) for k, s in zip(SIDES, (base, side))},
        "floor_source": floors[0].source if floors else None,
        "bare_source": floors[1].source if floors else None,
        "floor_missing": missing,
    }  # fmt: skip


def _meta(device: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    git = ["git", "rev-parse", "--short", "HEAD"]
    try:
        done = subprocess.run(git, capture_output=True, text=True, check=True, timeout=10, cwd=Path(__file__).parent)  # fmt: skip
        commit: str | None = done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__, "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(), "repeat": args.repeat,
    }  # fmt: skip


def _table(rows: Sequence[tuple[str, ...]], left: int = 2) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    pads = [str.ljust if i < left else str.rjust for i in range(len(widths))]
    cells = (zip(pads, row, widths) for row in rows)
    return ["  ".join(pad(c, w) for pad, c, w in line).rstrip() for line in cells]


def _us(ns: float) -> str:
    return f"{ns / 1e3:.1f}"


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    if r["error"] is not None or not r["ok"]:
        return (r["name"], r["label"], "FAILED", *[""] * 7)
    ops, ns = r["ops"], r["ns"]
    check = ops["generated"] - ops.get("bare", ops["generated"])
    ratios = [r.get(f"generated/{k}") for k in ("baseline", "floor", "bare")]
    return (
        r["name"], r["label"],
        f"{ops['baseline']}/{ops['generated'] - check}" + (f"+{check}" if check else ""),
        *(_us(ns[k]) if k in ns else "-" for k in SIDES),
        *("-" if q is None else _quartiles(q) for q in ratios),
    )  # fmt: skip


def _quartiles(q: dict[str, float]) -> str:
    return f"{q['median']:.2f}x ({q['p25']:.2f}-{q['p75']:.2f})"


def render(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    gpu = f" ({meta['gpu']})" if meta["gpu"] else ""
    out = [
        (f"relay bench: {meta['device']}{gpu}, {meta['machine']}, torch {meta['torch']}, {meta['torch_threads']} "
         f"thread(s), {meta['repeat']} repeats, {meta['date']}, commit {meta['commit']}"), HEADER, "",
    ]  # fmt: skip
    head = ("map", "shape", "ops", "baseline us", "generated us", "floor us",
            "bare us", "gen/baseline", "gen/floor", "gen/bare")  # fmt: skip
    out += _table([head, *map(_cells, results)])
    out += ["", "host us per step, and per method in step order, generated / baseline"]
    done = [r for r in results if r["error"] is None and r["ok"]]
    rows = []
    for r in done:
        gen, base = r["host_ns"]["generated"], r["host_ns"]["baseline"]
        parts = [f"{m} {_us(v)}/{_us(base[m]) if m in base else '-'}" for m, v in gen.items() if m != "step"]  # fmt: skip
        rows.append((r["name"], r["label"], f"{_us(gen['step'])}/{_us(base['step'])}:", "  ".join(parts)))  # fmt: skip
    out += _table(rows, left=4) if rows else []
    names = dict.fromkeys(r["name"] for r in done)
    for r in [next(r for r in done if r["name"] == n) for n in names]:
        base, gen = r["methods"]["baseline"], r["methods"]["generated"]
        out += [
            f"\n{r['name']}, baseline: {r['baseline']}",
            f"  buffers at {r['label']}: baseline {r['bytes']['baseline']:,} bytes, generated {r['bytes']['generated']:,}",
            "  data ops per method, baseline | generated",
            *(f"  {m}: {' | '.join(', '.join(side[m]['ops']) or '(none)' if m in side else '-' for side in (base, gen))}" for m in dict.fromkeys([*base, *gen])),
        ]  # fmt: skip
        if r["floor_source"]:
            out.append(f"  the floor at {r['label']}, one function per method in step order:")  # fmt: skip
            out += [f"    {line}" for line in r["floor_source"].splitlines()]
        else:
            out.append(f"  no floor: {r['floor_missing']}")
    return "\n".join(out)


def _spans(args: argparse.Namespace, device: Any) -> int:
    from relay.bench import spans, timing

    results = []
    for name, batch in itertools.product(args.schema or SPAN_MAPS, args.batch):
        steps, same = spans.sides(batch, device, args.seed, name)
        figures = timing.figures(steps, device, args)
        results.append({"map": name, "batch": batch, "same": same, **figures})
    print(f"counted scatters (P={spans.POOL}, K={spans.DRAFTS}): stash + resolve_future per step; "
          "floor: the same torch calls and relay's host checks on the CPU, bare: without them")  # fmt: skip
    head = ("map", "batch", "generated us", "floor us", "bare us", "gen/floor", "gen/bare")  # fmt: skip
    rows = [(r["map"], str(r["batch"]), *(_us(ns) for ns in r["ns"].values()),
             *(_quartiles(r[f"generated/{k}"]) for k in ("floor", "bare")),
             "same" if r["same"] else "DIFFER") for r in results]  # fmt: skip
    print("\n".join(_table([(*head, "values"), *rows], left=1)))
    _write_json(args.json, {"spans": results})
    return EXIT_OK if all(r["same"] for r in results) else EXIT_FAILED


def _write_json(path: Path | None, data: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {path}")


def run(args: argparse.Namespace) -> int:
    problem = flags_problem(args)
    if problem is not None:
        return _usage(problem)
    import torch

    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        return _usage(f"bad --device {args.device!r}: {error}")
    if device.type == "cuda" and not torch.cuda.is_available():
        return _usage("--device cuda, but torch sees no CUDA device")
    configs = [] if args.spans else _configs(args)
    if isinstance(configs, str):
        return _usage(configs)
    saved = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        if args.spans:
            return _spans(args, device)
        meta, results = _meta(device, args), []
        for n, (pair, gen, shape) in enumerate(configs, 1):
            try:
                result = measure(pair, gen, shape, device, args)
            except Exception as error:  # noqa: BLE001 - reported per configuration
                result = {"schema": pair.schema, "name": pair.name,
                          "label": shape.label, "ok": False, "problems": [],
                          "error": f"{type(error).__name__}: {error}"}  # fmt: skip
            results.append(result)
            if not args.quiet:  # the configuration's row of the report
                row = "  ".join(cell for cell in _cells(result) if cell)
                print(f"[{n}/{len(configs)}] {row}", file=sys.stderr)
    finally:
        torch.set_num_threads(saved)
    print(render(meta, results))
    failures = [f"{r['name']} {r['label']}: {r['error']}" for r in results if r["error"]]  # fmt: skip
    failures += [p for r in results for p in r["problems"]]
    print("\n" + ("\n".join(failures) if failures else
                  "values: generated == baseline == floors in every configuration"))  # fmt: skip
    _write_json(args.json, {"meta": meta, "configs": results})
    return EXIT_FAILED if failures else EXIT_OK
