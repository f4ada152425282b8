"""The figures of a GPU check, from its results folder, as Markdown.

    python3 scripts/gpu_figures.py RESULTS_DIR > RESULTS_DIR/figures.md

``scripts/gpu_check.sh`` runs it last. It only reads what the steps left (logs, JUnit XML,
JSON); a step that did not run is reported as missing. Pass/fail of each step is the
summary's job; this page collects what docs/gpu.md and the README's measured table record,
and sets each against its bar where the bar is a number.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

#: The bars of ``relay demo --device cuda`` in overlap mode (percent).
OCCUPANCY_BAR = 95.0
EFFICIENCY_BAR = 90.0

#: What each GPU test file proves.
TEST_FILES = {
    "test_gpu_graphs": "resolve_future captured in a CUDA graph, replayed for new slots",
    "test_gpu_sync_free": 'stash, publish, resolve_future under set_sync_debug_mode("error")',
    "test_gpu_streams": "fences, host mirror and copy stream, gated",
    "test_graphs": "decode steps over static buffers, captured in CUDA graphs and replayed",
    "test_gate": "the gates the stream tests use (CPU, Triton's interpreter)",
}


def _missing(name: str) -> str:
    return f"_{name} not found: the step did not run (see summary.txt)_"


def environment(results: Path) -> list[str]:
    """The GPU, versions and commit from env.log."""
    log = results / "env.log"
    if not log.is_file():
        return [_missing("env.log")]
    keep = ("date", "commit", "python ", "cuda:", "relay ")
    lines = [
        line.strip()
        for line in log.read_text(errors="replace").splitlines()
        if line.strip().startswith(keep)
    ]
    return [f"- {line}" for line in lines] or ["_env.log holds no versions_"]


def gpu_tests(results: Path) -> list[str]:
    """Passed / failed / skipped per test file, from pytest-gpu.xml."""
    xml = results / "pytest-gpu.xml"
    if not xml.is_file():
        return [_missing("pytest-gpu.xml")]
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    failed: list[str] = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "?").split(".")[-1]
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                failed.append(f"{module}::{case.get('name')}")
            elif child.tag == "skipped":
                outcome = "skipped"
        counts[module][outcome] += 1
    rows = ["| file | passed | failed | skipped | checks |", "|---|---|---|---|---|"]
    for module in sorted(counts):
        c = counts[module]
        rows.append(
            f"| {module} | {c['passed']} | {c['failed']} | {c['skipped']} "
            f"| {TEST_FILES.get(module, '')} |"
        )
    for module in TEST_FILES:
        if module not in counts and module != "test_gate":
            rows.append(f"| {module} | - | - | - | NOT COLLECTED |")
    total = {
        k: sum(c[k] for c in counts.values()) for k in ("passed", "failed", "skipped")
    }
    rows.append("")
    rows.append(
        f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped"
    )
    rows += [f"- failed: `{name}`" for name in failed[:20]]
    return rows


def demo(results: Path) -> list[str]:
    """relay demo --device cuda (its --json), both modes, against the bars."""
    out: list[str] = []
    for step in ("demo-decode", "demo-eagle"):
        path = results / f"{step}.json"
        if not path.is_file():
            out.append(f"- {step}: " + _missing(f"{step}.json"))
            continue
        document = json.loads(path.read_text())
        for m in document["modes"]:
            occupancy = 100 * m["occupancy_overlap"]
            efficiency = 100 * m["efficiency"]
            occupancy_bar = ">=" if occupancy >= OCCUPANCY_BAR else "BELOW"
            efficiency_bar = ">=" if efficiency >= EFFICIENCY_BAR else "BELOW"
            bars = [
                f"occupancy {occupancy:.1f}% {occupancy_bar} {OCCUPANCY_BAR:.0f}%",
                f"efficiency {efficiency:.0f}% {efficiency_bar} {EFFICIENCY_BAR:.0f}%",
            ]
            out.append(
                f"- {step} {m['mode']}: sync {m['sync_tokens_per_second']:.0f} tok/s, "
                f"overlap {m['overlap_tokens_per_second']:.0f} tok/s, speedup "
                f"{m['speedup']:.2f}x (ideal {m['ideal']:.2f}x); {'; '.join(bars)}; "
                f"identical {m['identical']}"
            )
    return out


def _us(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1000:.1f}"


def bench(results: Path) -> list[str]:
    """relay bench --device cuda: ops and time per step, generated against the baseline
    and the floors (the same torch calls as plain tensor methods; on CUDA the checked
    and bare floors are the same), and the host time per method of both maps."""
    path = results / "bench.json"
    if not path.is_file():
        return [_missing("bench.json")]
    data = json.loads(path.read_text())
    rows = [
        (
            "| schema | shape | ops base / gen | us base / gen / floor | gen/base | gen/floor "
            "| host us per method, gen / base |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for c in data.get("configs", []):
        if not c.get("ok", True) or c.get("error"):
            rows.append(
                f"| {c.get('schema')} | {c.get('label')} | error: {c.get('error')} |"
            )
            continue
        ops, ns, host = c["ops"], c["ns"], c.get("host_ns", {})
        gen, base = host.get("generated", {}), host.get("baseline", {})
        parts = ", ".join(
            f"{m} {v / 1e3:.1f}/{base[m] / 1e3:.1f}"
            if m in base
            else f"{m} {v / 1e3:.1f}"
            for m, v in gen.items()
        )
        rows.append(
            f"| {c.get('name', c['schema'])} | {c['label']} "
            f"| {ops.get('baseline', '-')} / {ops.get('generated', '-')} "
            f"| {' / '.join(_us(ns.get(k)) for k in ('baseline', 'generated', 'floor'))} | "
            + " | ".join(
                f"{c[r]['median']:.2f}x" if r in c else "-"
                for r in ("generated/baseline", "generated/floor")
            )
            + f" | {parts or '-'} |"
        )
    meta = data.get("meta", {})
    rows.append("")
    rows.append(
        f"device {meta.get('device')} ({meta.get('gpu')}), torch {meta.get('torch')}, "
        f"{meta.get('date')}, commit {meta.get('commit')}"
    )
    return rows


def overlap(results: Path) -> list[str]:
    """scripts/gpu_overlap.py: the demo's CUDA default against the overlap bars."""
    path = results / "overlap.json"
    if not path.is_file():
        return [_missing("overlap.json")]
    document = json.loads(path.read_text())
    rows = [
        (
            "| mode | sync tok/s | overlap tok/s | speedup | ideal | efficiency "
            "| occupancy | identical | graphs | bars |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in document["modes"]:
        bars = "; ".join(m.get("missed", [])) or "met"
        rows.append(
            f"| {m['mode']} | {m['sync_tok_s']:.0f} | {m['overlap_tok_s']:.0f} "
            f"| {m['speedup']:.2f}x | {m['ideal']:.2f}x | {m['efficiency']:.0%} "
            f"| {m['occupancy']:.1%} | {m['identical']} | {m['graphs_captured']} | {bars} |"
        )
    rows.append("")
    rows.append(
        f"bars: occupancy >= {OCCUPANCY_BAR:.0f}%, efficiency >= {EFFICIENCY_BAR:.0f}%, "
        f"outputs identical; device {document['device']}"
        + (" (a dry run: not judged)" if document.get("dry_run") else "")
    )
    return rows


def sanitizers(results: Path) -> list[str]:
    """The summary lines of torch's CUDA sanitizer and compute-sanitizer's tools."""
    out = []
    for step in ("torch-sanitizer", "racecheck", "memcheck"):
        log = results / f"{step}.log"
        if not log.is_file():
            out.append(f"- {step}: " + _missing(f"{step}.log"))
            continue
        text = log.read_text(errors="replace")
        found = [
            line.strip()
            for line in text.splitlines()
            if "SUMMARY" in line or line.startswith("SKIP") or "CSAN" in line
        ]
        out.append(
            f"- {step}: " + ("; ".join(found[-3:]) or "no summary line; see the log")
        )
    out.append(
        "- a report names kernels, not Python: trace it to the op that launched it before "
        "calling it relay's or torch's"
    )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    results = Path(argv[0])
    sections = [
        ("Environment", environment),
        ("GPU tests", gpu_tests),
        ("Overlap bars (scripts/gpu_overlap.py)", overlap),
        ("relay demo --device cuda", demo),
        ("relay bench --device cuda", bench),
        ("Sanitizers", sanitizers),
    ]
    print(f"# Figures of the GPU check in {results}")
    for title, section in sections:
        print()
        print(f"## {title}")
        print()
        try:
            lines = section(results)
        except Exception as error:  # noqa: BLE001 - one bad file must not hide the rest
            lines = [f"_could not read: {type(error).__name__}: {error}_"]
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
