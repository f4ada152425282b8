"""The figures of a GPU check, from its results folder, as Markdown.

    python3 scripts/gpu_figures.py RESULTS_DIR > RESULTS_DIR/figures.md

``scripts/gpu_check.sh`` runs it last. It only reads what the steps left (logs, JUnit XML,
JSON); a step that did not run is reported as missing. Pass/fail of each step is the
summary's job; this page collects what docs/gpu.md and the README's measured table record,
and sets each against its bar where the bar is a number.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

#: The bars of ``relay demo --device cuda`` in overlap mode.
OCCUPANCY_BAR = 95.0
EFFICIENCY_BAR = 90.0

#: What each GPU test file proves.
TEST_FILES = {
    "test_gpu_graphs": "resolve_future captured in a CUDA graph, replayed for new slots",
    "test_gpu_sync_free": 'stash, publish, resolve_future under set_sync_debug_mode("error")',
    "test_gpu_streams": "fences, host mirror and copy stream, gated",
    "test_gpu_fused_gather": "the Triton gather against index_select on CUDA",
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


def _demo_rows(text: str) -> list[list[str]]:
    """The result table of ``relay demo``: rows of the columns after the header."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("mode") and "efficiency" in line:
            header = re.split(r"\s{2,}", line.strip())
            rows = []
            for row in lines[i + 2 :]:
                cells = re.split(r"\s{2,}", row.strip())
                if len(cells) != len(header):
                    break
                rows.append(cells)
            return [header, *rows]
    return []


def _percent(cell: str) -> float | None:
    """A table cell's leading percentage (the median; a range or mark may follow)."""
    first = cell.split()[0] if cell.split() else ""
    try:
        return float(first.rstrip("%*"))
    except ValueError:
        return None


def demo(results: Path) -> list[str]:
    """relay demo --device cuda, both modes, against the occupancy and efficiency bars."""
    out: list[str] = []
    for step in ("demo-decode", "demo-eagle"):
        log = results / f"{step}.log"
        if not log.is_file():
            out.append(f"- {step}: " + _missing(f"{step}.log"))
            continue
        table = _demo_rows(log.read_text(errors="replace"))
        if not table:
            out.append(f"- {step}: no result table in {step}.log (the demo failed?)")
            continue
        header, *rows = table
        for cells in rows:
            row = dict(zip(header, cells))
            occupancy = _percent(row.get("occupancy overlap", ""))
            efficiency = _percent(row.get("efficiency", ""))
            bars = []
            if occupancy is not None:
                bars.append(
                    f"occupancy {occupancy:.1f}% "
                    f"{'>=' if occupancy >= OCCUPANCY_BAR else 'BELOW'} {OCCUPANCY_BAR:.0f}%"
                )
            if efficiency is not None:
                bars.append(
                    f"efficiency {efficiency:.0f}% "
                    f"{'>=' if efficiency >= EFFICIENCY_BAR else 'BELOW'} {EFFICIENCY_BAR:.0f}%"
                )
            out.append(
                f"- {step} {row.get('mode', '?')}: sync {row.get('sync tok/s')} tok/s, "
                f"overlap {row.get('overlap tok/s')} tok/s, speedup {row.get('speedup')} "
                f"(ideal {row.get('ideal')}); {'; '.join(bars)}; identical "
                f"{row.get('identical')}"
            )
    out.append(
        "- the bars hold only on a configuration where the scheduler's share is what "
        "small models see on a GPU: say which (GPU_CHECK_DEMO_ARGS) when recording"
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


def fused(results: Path) -> list[str]:
    """scripts/gpu_fused_bench.py: the fused gather's launches and time against the baseline."""
    path = results / "fused-bench.json"
    if not path.is_file():
        return [_missing("fused-bench.json")]
    data = json.loads(path.read_text())
    rows = [
        "| shape | launches base / packed / fused | us base / packed / fused | fused/base |",
        "|---|---|---|---|",
    ]
    for s in data.get("shapes", []):
        n, us = s["launches"], s["us_per_step"]
        launches = " / ".join(
            "-" if n[k] is None else f"{n[k]:.1f}"
            for k in ("baseline", "packed", "fused")
        )
        times = " / ".join(f"{us[k]:.1f}" for k in ("baseline", "packed", "fused"))
        rows.append(
            f"| {s['label']} | {launches} | {times} | {s['fused_over_baseline']:.2f}x |"
        )
    rows.append("")
    rows.append(
        f"{'PASS' if data.get('pass') else 'FAIL'}: fewer launches than the baseline and "
        "no slower at every shape"
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
        ("relay demo --device cuda", demo),
        ("relay bench --device cuda", bench),
        ("Fused gather against the baseline", fused),
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
