"""``relay demo --trace`` and ``--plot``: the files they write, and the missing-matplotlib path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import pytest

from relay.cli import Exit, main, plot
from relay.engine import trace

TINY_DEMO = ["demo", "--model", "tiny", "--requests", "10", "--repeat", "1"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_demo_writes_a_trace_and_a_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """All three modes traced, sync and overlap; the trace is Chrome JSON, the plot a PNG."""
    pytest.importorskip("matplotlib")
    trace_path, picture = tmp_path / "demo.json", tmp_path / "timeline.png"
    code = main([*TINY_DEMO, "--trace", str(trace_path), "--plot", str(picture)])
    out = capsys.readouterr().out
    assert code == Exit.OK
    assert f"wrote the trace {trace_path}" in out
    assert f"wrote the timeline {picture}" in out
    events = json.loads(trace_path.read_text())["traceEvents"]
    assert {e["ph"] for e in events} >= {"X", "M"}  # complete events and thread names
    runs = trace.load(trace_path).runs()
    assert set(runs) == {
        f"{mode} {loop}"
        for mode in ("decode", "eagle", "ngram")
        for loop in ("sync", "overlap")
    }
    rows = {s.row.split(" (")[0] for s in runs["eagle overlap"].spans}
    assert rows == {trace.SCHEDULER_THREAD, trace.FORWARD_THREAD}
    assert picture.read_bytes().startswith(PNG_SIGNATURE)
    # Host-side torch ops are left out: the file stays small enough to mail.
    assert trace_path.stat().st_size < 2_000_000


def test_plot_without_matplotlib_is_one_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No matplotlib: one line saying what to install, exit 2, before any run."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec: not installed
    assert main([*TINY_DEMO, "--plot", str(tmp_path / "t.png")]) == Exit.USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "pip install matplotlib" in line and line.startswith("relay demo: error:")


@pytest.mark.parametrize(
    ("flag", "name", "message"),
    [
        ("--plot", "timeline.gif", "must end in .png, .svg, .pdf"),
        ("--trace", "missing/trace.json", "no folder"),
    ],
)
def test_unwritable_trace_or_plot_is_bad_usage(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    name: str,
    message: str,
) -> None:
    """A picture format matplotlib is not asked for, or a missing folder: exit 2 at once."""
    assert main([*TINY_DEMO, flag, str(tmp_path / name)]) == Exit.USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


def test_timeline_draws_a_row_per_cuda_stream(tmp_path: Path) -> None:
    """A trace with CUDA kernels (as on a GPU) gets one row per stream, each panel's
    title says what else the machine did during its run; the picture is written."""
    pytest.importorskip("matplotlib")
    spans: list[trace.Span] = []
    kernels: list[trace.Span] = []
    for loop, step_us in (("sync", 1000.0), ("overlap", 700.0)):
        base = 100_000.0 if loop == "overlap" else 0.0
        spans.append(trace.Span(f"{trace.RUN} decode {loop}", 0, "s", base, base + 9e4))
        for step in range(1, 9):
            t = base + step * step_us
            spans += [
                trace.Span(trace.BUILD, step, "scheduler thread (1)", t, t + 100),
                trace.Span(
                    trace.FORWARD, step, "scheduler thread (1)", t + 150, t + 300
                ),
                trace.Span(
                    trace.RESOLVE_FUTURE, step, "scheduler thread (1)", t + 160, t + 170
                ),
            ]
            kernels.append(trace.Span("gemm", 0, "stream 7", t + 200, t + 650))
    data = trace.Trace(tuple(spans), tuple(kernels))
    axes_rows: list[list[str]] = []
    original = plot._rows

    def spy(found: list[trace.Span]) -> list[str]:
        rows = original(found)
        axes_rows.append(rows)
        return rows

    picture = tmp_path / "gpu.png"
    titles: list[str] = []
    frame = plot._frame

    def title_spy(axes: object, title: str, *args: object) -> dict[str, int]:
        y_of = frame(axes, title, *args)  # type: ignore[arg-type]
        titles.append(axes.get_title(loc="left"))  # type: ignore[attr-defined]
        return y_of

    machine = {"decode overlap": "other processes 1.4 of 2 cores"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plot, "_rows", spy)
        patch.setattr(plot, "_frame", title_spy)
        plot.timeline(data, picture, ["decode"], machine)
    assert ["scheduler thread", "stream 7"] in axes_rows
    assert picture.read_bytes().startswith(PNG_SIGNATURE)
    # What the machine did during a run is in its panel's title.
    assert not titles[0].endswith("cores")
    assert titles[1].endswith("; during the run, other processes 1.4 of 2 cores")


def test_a_cpu_trace_never_starts_torchs_profiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU relay keeps its ranges itself, two clock readings each: torch's
    profiler, whose per-operator records once held most of a traced demo's memory,
    is never started, and the trace still holds every step's ranges on both threads."""
    import torch

    from relay.engine import EngineConfig, ModelConfig, WorkloadConfig, run_workload

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.profiler.profile was started")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    config = EngineConfig(
        model=ModelConfig(
            vocab_size=256, hidden=16, layers=1, heads=2, ffn=32, max_context=64
        ),
        workload=WorkloadConfig(
            requests=4, min_prompt=4, max_prompt=8, min_output=4, max_output=8
        ),
        trace=True,
        overlap=True,
    )
    path = tmp_path / "cpu.json"
    with trace.record(path):
        run_workload(config)
    run = trace.load(path).runs()["decode overlap"]
    forwards = run.named(trace.FORWARD)
    assert forwards and set(run.named(trace.BUILD)) >= set(forwards) - {0}
    assert {s.row.split(" (")[0] for s in run.spans} == {
        trace.SCHEDULER_THREAD,
        trace.FORWARD_THREAD,
    }
    events = json.loads(path.read_text())["traceEvents"]
    assert {e.get("cat") for e in events if e["ph"] == "X"} == {"user_annotation"}


@pytest.mark.gpu
def test_a_cuda_trace_puts_each_kernel_inside_the_run_that_launched_it(
    tmp_path: Path,
) -> None:
    """On CUDA the profiler records the device's work only; moved onto relay's clock,
    each traced run holds kernels (a clock off by more than a run would leave it
    none), on stream rows."""
    from relay.engine import EngineConfig, ModelConfig, WorkloadConfig, run_workload

    config = EngineConfig(
        model=ModelConfig(
            vocab_size=256, hidden=16, layers=1, heads=2, ffn=32, max_context=64
        ),
        workload=WorkloadConfig(
            requests=4, min_prompt=4, max_prompt=8, min_output=4, max_output=8
        ),
        device="cuda",
        trace=True,
    )
    path = tmp_path / "cuda.json"
    with trace.record(path, "cuda"):
        for overlap in (False, True):
            run_workload(attrs.evolve(config, overlap=overlap))
    runs = trace.load(path).runs()
    assert set(runs) == {"decode sync", "decode overlap"}
    for run in runs.values():
        assert run.kernels and all(k.row.startswith("stream ") for k in run.kernels)
        assert run.named(trace.FORWARD)
