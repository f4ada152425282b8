"""``relay bench``: flags, one configuration measured, the report and its JSON.

Exit status: 0 every side ran and resolved the same values, 1 a side raised or the
values differ, 2 bad usage or device. Timings never fail a run. torch is imported by
``run`` only, after the flags are checked (``flags_problem``), so building the flags
(``relay --help``) and refusing a bad one stay fast."""

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
import time
from pathlib import Path
from typing import Any

from relay.cli.status import Exit

__all__ = ["add_arguments", "flags_problem", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = Exit.OK, Exit.FAILED, Exit.USAGE

#: Size grids (pool, batch, top-k, hidden in bf16) and how long to time each side.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {"sizes": ((257, 4097), (1, 32, 256), (1, 8), (4096, 7168)), "repeat": 15, "sample_ms": 0.25},
    "quick": {"sizes": ((257,), (1, 32), (1,), (4096,)), "repeat": 5, "sample_ms": 0.1},
}  # fmt: skip
#: Steps driven with fresh outputs to check that both sides resolve the same values.
CHECK_STEPS = 3


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ints, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative ints, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``relay bench`` flags."""
    add = parser.add_argument
    add("--quick", action="store_true", help="a small grid and 5 repeats: seconds")
    add(
        "--schema",
        type=lambda t: tuple(t.split(",")),
        metavar="NAMES",
        help="bundled schemas to compare, comma-separated (default: every one)",
    )
    add("--pool", type=_ints, metavar="P,...", help="pool sizes (default 257,4097)")
    add("--batch", type=_ints, metavar="B,...", help="batch sizes (default 1,32,256)")
    add("--topk", type=_ints, metavar="K,...", help="top-k of EAGLE maps (default 1,8)")
    add(
        "--hidden",
        type=_ints,
        metavar="H,...",
        help="hidden sizes of EAGLE maps, bf16, 0: none (default 4096,7168)",
    )
    add(
        "--device", default="cpu", help="torch device, e.g. cpu or cuda:0 (default cpu)"
    )
    add("--repeat", type=int, metavar="N", help="timed samples per side (default 15)")
    add("--warmup", type=int, default=3, metavar="N", help="untimed steps first (3)")
    add("--sample-ms", type=float, metavar="MS", help="length of a sample (0.25)")
    add(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch intra-op threads while timing (default 1; 0 keeps torch's)",
    )
    add("--seed", type=int, default=0, help="seed of the workloads")
    add("--json", type=Path, metavar="PATH", help="also write every figure to PATH")
    add("-q", "--quiet", action="store_true", help="no progress on stderr")  # fmt: skip
    add(
        "--spans",
        action="store_true",
        help="time the vllm_drafts map's counted scatter against its plain floor instead",
    )


def _usage(message: str) -> int:
    print(f"relay bench: {message}", file=sys.stderr)
    return EXIT_USAGE


def _device(name: str) -> Any:
    """The torch device ``name`` names, or why not."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        return f"bad --device {name!r}: {error}"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "--device cuda, but torch sees no CUDA device"
    return device


def _sizes(args: argparse.Namespace) -> tuple[tuple[int, ...], ...]:
    """Pools, batches, top-ks and hidden sizes: the flags', else the preset's."""
    preset = PRESETS["quick" if args.quick else "default"]["sizes"]
    flags = (args.pool, args.batch, args.topk, args.hidden)
    return tuple(given or default for given, default in zip(flags, preset))


def flags_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the parsed flags, as far as it shows without torch (a device
    name and the schema names are checked by ``run``, after importing it); None if
    nothing is."""
    pools, batches, topks, _ = _sizes(args)
    if min(topks) < 1 or min(pools) < 2 or min(batches) < 1:
        return "--topk and --batch must be >= 1, --pool >= 2 (row 0 is scratch)"
    sample_ms = args.sample_ms
    if (args.repeat is not None and args.repeat < 1) or (
        sample_ms is not None and not (math.isfinite(sample_ms) and sample_ms > 0)
    ):
        return "--repeat must be >= 1 and --sample-ms > 0"
    if args.warmup < 0 or args.threads < 0:
        return "--warmup and --threads must be >= 0 (--threads 0 keeps torch's)"
    if all(batch > pool - 1 for pool in pools for batch in batches):
        return "no shape fits: a pool of P rows holds at most P - 1 requests"
    return None


def _configs(args: argparse.Namespace) -> list[Any] | str:
    """Every (pair, generated, shape) to measure, or a usage message."""
    from relay.bench.sides import PAIRS, Shape, discover

    pools, batches, topks, hiddens = _sizes(args)
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
        grid = itertools.product(pools, batches, topks if pair.spec else [0],
                                 hiddens if pair.spec and pair.hidden else [0])  # fmt: skip
        configs += [(pair, gen, Shape(*s)) for s in grid if s[1] <= s[0] - 1]
    return configs  # not empty: flags_problem saw a shape that fits


def _counts(counts: dict[str, Any]) -> dict[str, Any]:
    """Per method: the data ops in order, and how many view ops."""
    return {m: {"ops": list(c.data), "views": len(c.views)} for m, c in counts.items()}


def _ratio(num: list[float], den: list[float]) -> dict[str, float]:
    """Quartiles of the per-repeat ratios: drift between repeats cancels."""
    from relay.bench.timing import quantile

    per = [n / d for n, d in zip(num, den)]
    return {
        "p25": quantile(per, 0.25),
        "median": quantile(per, 0.5),
        "p75": quantile(per, 0.75),
    }


def _plain(pair: Any, side: Any, shape: Any, work: Any) -> tuple[Any, str | None]:
    """The generated side's plain floor, or None and why the schema's step has none."""
    from relay.bench.plain import Unsupported, build_plain
    from relay.schema import Schema

    methods = [m for m, _ in side.calls]
    try:
        schema = Schema.bundled(pair.schema)
        plain = build_plain(schema, side.map, shape, work, methods, graph=pair.graph)
        return plain, None
    except Unsupported as why:
        return None, str(why)


def measure(
    pair: Any, gen: Any, shape: Any, device: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """One configuration: values checked, one step of each side counted, then the
    baseline, the generated map and its two floors (the replay, and the plain tensor
    methods where the schema's step has one) timed, interleaved."""
    from relay.bench.replay import floor_calls, record
    from relay.bench.sides import Workload, compare_values, observed, pair_sides, same
    from relay.bench.timing import time_interleaved, timer_for
    from relay.opcount import count_ops

    preset = PRESETS["quick" if args.quick else "default"]
    problems = compare_values(
        pair, gen, shape, device, steps=CHECK_STEPS, seed=args.seed
    )
    work = Workload.random(shape, device, args.seed, spec=pair.spec)
    base, side = pair_sides(pair, gen, shape, device, work)
    plain, plain_missing = _plain(pair, side, shape, work)
    driven = [base, side] if plain is None else [base, side, plain]
    for _ in range(2):  # the steady state: lazy buffers allocated, first calls made
        for each in driven:
            each.step()
    recording = record(side.calls)
    floor = floor_calls(recording)
    counted = {
        "baseline": {m: count_ops(c) for m, c in base.calls},
        "generated": recording.counts(),
        "floor": {m: count_ops(c) for m, c in floor},
    }

    def floor_step() -> None:
        for _, call in floor:
            call()

    steps = [base.step, side.step, floor_step]
    if plain is not None:
        plain.step()  # as many steps as the generated map: the same values now
        want, got = dict(observed(side.batch, True)), dict(observed(plain.batch, True))
        problems += [
            f"{pair.name} {shape.label}: the plain floor's {key} differs"
            for key, value in want.items()
            if not same(value, got[key])
        ]
        counted["plain"] = {m: count_ops(c) for m, c in plain.calls}
        steps.append(plain.step)
    base_ns, gen_ns, floor_ns, *plain_ns = time_interleaved(
        steps,
        timer_for(device),
        repeat=args.repeat or preset["repeat"],
        warmup=args.warmup,
        target_ns=int((args.sample_ms or preset["sample_ms"]) * 1e6),
    )
    from statistics import median

    result = {
        "schema": pair.schema, "name": pair.name, "graph": pair.graph,
        "baseline": pair.design, "label": shape.label,
        "pool": shape.pool,
        "batch": shape.batch, "topk": shape.topk, "hidden": shape.hidden,
        "ok": not problems, "problems": problems, "error": None,
        "ops": {k: sum(len(c.data) for c in v.values()) for k, v in counted.items()},
        "methods": {k: _counts(v) for k, v in counted.items()},
        "ns": {"baseline": median(base_ns), "generated": median(gen_ns), "floor": median(floor_ns)},
        "generated/baseline": _ratio(gen_ns, base_ns),
        "generated/floor": _ratio(gen_ns, floor_ns),
        "plain_missing": plain_missing,
    }  # fmt: skip
    if plain_ns:
        result["ns"]["plain"] = median(plain_ns[0])
        result["generated/plain"] = _ratio(gen_ns, plain_ns[0])
        result["plain_source"] = plain.source
    return result


def _meta(device: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            check=True, timeout=10, cwd=Path(__file__).parent,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "repeat": args.repeat or PRESETS["quick" if args.quick else "default"]["repeat"],
    }  # fmt: skip


def _render(meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """The results as one plain table, then each schema's ops per method and its plain
    floor's source."""
    print(
        f"relay bench: {meta['device']}{' (' + meta['gpu'] + ')' if meta['gpu'] else ''}, "
        f"{meta['machine']}, torch {meta['torch']}, {meta['torch_threads']} thread(s), "
        f"{meta['repeat']} repeats, {meta['date']}, commit {meta['commit']}\n"
        "ops: data ops per step, baseline/generated/plain/replay; plain: the same torch "
        "calls as plain tensor methods; replay: the recorded aten calls replayed; "
        "ratios: median of the per-repeat ratios (p25-p75)\n"
    )
    head = ("schema", "shape", "ops", "baseline us", "generated us", "plain us",
            "replay us", "gen/baseline", "gen/plain", "gen/replay")  # fmt: skip
    rows = [head]
    for r in results:
        if r["error"] is not None or not r["ok"]:
            rows.append((r["name"], r["label"], "FAILED", *[""] * (len(head) - 3)))
            continue
        ops, ns = r["ops"], r["ns"]

        def ratio(q: dict[str, float] | None) -> str:
            return (
                "-"
                if q is None
                else f"{q['median']:.2f}x ({q['p25']:.2f}-{q['p75']:.2f})"
            )

        sides = ("baseline", "generated", "plain", "floor")
        rows.append((
            r["name"], r["label"], "/".join(str(ops.get(k, "-")) for k in sides),
            *("-" if k not in ns else f"{ns[k] / 1e3:.1f}" for k in sides),
            ratio(r["generated/baseline"]), ratio(r.get("generated/plain")),
            ratio(r["generated/floor"]),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
    seen = set()
    for r in results:
        if r["name"] in seen or r["error"] is not None:
            continue
        seen.add(r["name"])
        print(f"\n{r['name']} {r['label']}, baseline: {r['baseline']}")
        print("  data ops per method, baseline | generated")
        base, gen = r["methods"]["baseline"], r["methods"]["generated"]
        for method in dict.fromkeys([*base, *gen]):
            ops = [
                ", ".join(side[method]["ops"]) if method in side else "-"
                for side in (base, gen)
            ]
            print(f"  {method}: {ops[0] or '(none)'} | {ops[1] or '(none)'}")
        if r.get("plain_source"):
            print("  plain floor, one function per method in step order:")
            print("\n".join(f"    {line}" for line in r["plain_source"].splitlines()))
        else:
            print(f"  no plain floor: {r.get('plain_missing')}")


def _spans(args: argparse.Namespace, device: Any) -> int:
    """``relay bench --spans``: the counted scatter against its plain floor
    (``relay/bench/spans.py``), at ``--batch`` sizes."""
    import torch

    from relay.bench import spans

    saved = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        results = spans.measure(
            args.batch or spans.BATCHES,
            device,
            repeat=args.repeat or (5 if args.quick else 15),
            warmup=args.warmup,
            sample_ms=args.sample_ms or 0.25,
            seed=args.seed,
        )
    finally:
        torch.set_num_threads(saved)
    print(spans.render(results))
    if args.json is not None:
        args.json.write_text(json.dumps({"spans": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return EXIT_OK if all(r["same"] for r in results) else EXIT_FAILED


def run(args: argparse.Namespace) -> int:
    """Run ``relay bench`` with parsed ``args``; returns the exit status."""
    problem = flags_problem(args)
    if problem is not None:
        return _usage(problem)
    import torch

    device = _device(args.device)
    if isinstance(device, str):
        return _usage(device)
    if args.spans:
        return _spans(args, device)
    configs = _configs(args)
    if isinstance(configs, str):
        return _usage(configs)
    saved = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    results = []
    try:
        meta = _meta(device, args)
        for n, (pair, gen, shape) in enumerate(configs, 1):
            start = time.perf_counter()
            try:
                result = measure(pair, gen, shape, device, args)
            except Exception as error:  # noqa: BLE001 - reported per configuration
                result = {"schema": pair.schema, "name": pair.name,
                          "label": shape.label, "ok": False, "problems": [],
                          "error": f"{type(error).__name__}: {error}"}  # fmt: skip
            results.append(result)
            if not args.quiet:
                verdict = "ok" if result["ok"] else "FAILED"
                print(f"[{n}/{len(configs)}] {pair.name} {shape.label}: {verdict} "
                      f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)  # fmt: skip
    finally:
        torch.set_num_threads(saved)
    _render(meta, results)
    failures = [
        f"{r['name']} {r['label']}: {r['error']}" for r in results if r["error"]
    ]
    failures += [p for r in results for p in r["problems"]]
    print("\n" + ("\n".join(failures) if failures else
                  "values: generated == baseline in every configuration"))  # fmt: skip
    if args.json is not None:
        args.json.write_text(
            json.dumps({"meta": meta, "configs": results}, indent=2) + "\n"
        )
        print(f"wrote {args.json}")
    return EXIT_FAILED if failures else EXIT_OK
