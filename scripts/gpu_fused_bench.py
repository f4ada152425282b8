"""The fused gather against the hand-written baseline, per EAGLE step: kernel launches
and time per step of three sides at each shape of ``relay bench``'s default grid:

- ``baseline``: the sglang-style hand-written map ``relay bench`` compares with;
- ``packed``: the generated ``eagle_packed`` map, its forward lane gathered by torch;
- ``fused``: the same map with ``fused_gather = True`` (one Triton launch on CUDA).

Run by ``scripts/gpu_check.sh`` (step ``fused-bench``); by hand:

    PYTHONPATH=. python3 scripts/gpu_fused_bench.py --device cuda --json fused.json

It passes (exit 0) when at every shape the fused side launches fewer kernels per step
than the baseline and is no slower than it beyond the noise of an A/A control (a second
baseline timed like the first), with a floor of 3%. On the CPU it runs too (no launch
counts; ``fused_gather`` takes the torch path there), which is how it was checked without
a GPU. It drives ``relay.bench``'s sides, so it measures the step ``relay bench`` measures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from typing import Any

import torch

from relay.bench.main import PRESETS
from relay.bench.sides import PAIRS, Generated, Shape, Workload, build_side
from relay.bench.timing import quantile, time_interleaved, timer_for

SCHEMA = "eagle_packed"
NOISE_FLOOR = 0.03


def count_launches(step: Any, device: torch.device, *, steps: int = 10) -> float:
    """Device activities (kernels, copies, fills) per call of ``step`` on CUDA, from the
    profiler's device-side trace, less CUPTI's synchronization records."""
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    launches = sum(
        1
        for event in prof.events()
        if event.device_type == DeviceType.CUDA and "Sync" not in event.name
    )
    return launches / steps


def measure(
    shape: Shape, device: torch.device, *, repeat: int, seed: int
) -> dict[str, Any]:
    """Launches and median time per step of the baseline, packed and fused sides."""
    pair = next(p for p in PAIRS if p.schema == SCHEMA)
    generated = Generated.load(SCHEMA)
    work = Workload.random(shape, device, seed, spec=pair.spec)

    def side(name: str, relay_map: Any, payload: Any) -> Any:
        return build_side(name, relay_map, work, payload)

    sides = {
        "baseline": side("baseline", pair.new_baseline(device, shape), None),
        "packed": side(
            "packed",
            generated.new_map(device, shape, debug=False),
            generated.payload_cls,
        ),
        "fused": side(
            "fused",
            generated.new_map(device, shape, debug=False),
            generated.payload_cls,
        ),
        "baseline (A/A)": side(
            "baseline (A/A)", pair.new_baseline(device, shape), None
        ),
    }
    sides["fused"].map.fused_gather = True
    launches: dict[str, float | None] = dict.fromkeys(sides)
    if device.type == "cuda":
        launches = {name: count_launches(s.step, device) for name, s in sides.items()}
    series = time_interleaved(
        [s.step for s in sides.values()],
        timer_for(device),
        repeat=repeat,
        warmup=3,
        target_ns=250_000,
    )
    ns = {name: quantile(s, 0.5) for name, s in zip(sides, series)}
    base = series[0]
    fused_ratio = quantile([f / b for f, b in zip(series[2], base)], 0.5)
    control = quantile([t / b for t, b in zip(series[3], base)], 0.5)
    noise = max(abs(control - 1.0), NOISE_FLOOR)
    # None where launches are not counted (off CUDA): neither met nor missed.
    fewer = None
    if launches["fused"] is not None and launches["baseline"] is not None:
        fewer = launches["fused"] < launches["baseline"]
    return {
        "label": shape.label,
        "pool": shape.pool,
        "batch": shape.batch,
        "topk": shape.topk,
        "hidden": shape.hidden,
        "launches": launches,
        "us_per_step": {name: t / 1000 for name, t in ns.items()},
        "fused_over_baseline": fused_ratio,
        "control": control,
        "noise": noise,
        "fewer_launches": fewer,
        "not_slower": fused_ratio <= 1.0 + noise,
    }


def _verdict(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "NO"


def _launch_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="default", choices=sorted(PRESETS))
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this path as JSON")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    started = time.perf_counter()
    rows = []
    for pool, batch, topk, hidden in itertools.product(*PRESETS[args.sizes]["sizes"]):
        if batch > pool - 1:
            continue
        shape = Shape(pool, batch, topk, hidden)
        rows.append(measure(shape, device, repeat=args.repeat, seed=args.seed))
        print(f"measured {shape.label}", file=sys.stderr, flush=True)

    print(
        f"{SCHEMA}: fused gather against the baseline, per step, on {device} "
        f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'})"
    )
    print()
    print(
        "| shape | launches base | packed | fused | us base | packed | fused "
        "| fused/base | A/A | fewer launches | not slower |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        n, us = row["launches"], row["us_per_step"]
        print(
            f"| {row['label']} | {_launch_text(n['baseline'])} | "
            f"{_launch_text(n['packed'])} | {_launch_text(n['fused'])} | "
            f"{us['baseline']:.1f} | {us['packed']:.1f} | {us['fused']:.1f} | "
            f"{row['fused_over_baseline']:.2f}x | {row['control']:.2f}x | "
            f"{_verdict(row['fewer_launches'])} | "
            f"{_verdict(row['not_slower'])} |"
        )
    met = [r["fewer_launches"] is not False and r["not_slower"] for r in rows]
    ok = all(met)
    print()
    print(
        f"{'PASS' if ok else 'FAIL'}: fused launches fewer kernels than the baseline and "
        f"is no slower (within max(A/A, {NOISE_FLOOR:.0%})) at "
        f"{sum(met)} of {len(rows)} shapes"
        + ("" if device.type == "cuda" else " (launches are counted on CUDA only)")
        + f"; {time.perf_counter() - started:.1f} s"
    )
    if args.json:
        meta = {
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else None,
            "torch": torch.__version__,
            "sizes": args.sizes,
            "repeat": args.repeat,
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"meta": meta, "shapes": rows, "pass": ok}, out, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
