"""``relay demo --plot``: a timeline picture of a few traced steps (matplotlib, optional).

One panel per loop, sync above overlap, one row per thread: the scheduler thread
and, in the CPU overlap loop, the forward executor's worker thread (on CUDA, one
row per CUDA stream with its kernels). The same steps (both loops build the
same batches), on one time scale per mode, so the overlap panel is shorter by what
overlap hides. The relay calls inside each forward are marked and named on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from relay.engine import trace
from relay.engine.trace import Span, Trace

__all__ = ["STEPS", "timeline"]

#: Consecutive decode steps a panel shows.
STEPS = 4

#: The scheduler's work, drawn as blocks on its row: what -> (colour, key label).
_SCHEDULER = {
    trace.BUILD: ("#4C72B0", "build batch N+1"),
    trace.HOST_SEQ_LENS: ("#DD8452", ""),
    trace.RESOLVE_SEQ_LENS: ("#DD8452", "its lengths (resolve_seq_lens_cpu)"),
    trace.FENCE_WAIT: ("#C44E52", "fence wait in it"),
    trace.PROCESS: ("#55A868", "process N's tokens"),
    trace.HOST_WAIT: ("#D9D9D9", "host wait for forward N"),
}
_FORWARD_COLOUR = "#8172B3"
_KERNEL_COLOUR = "#4D4D4D"
#: How ``relay.engine.trace.load`` names a CUDA stream's row.
_STREAM = "stream "
#: The relay calls inside a forward: (colour, the name written on the first forward).
_RELAY_CALLS = {
    trace.RELEASE: ("#937860", "release"),
    trace.RESOLVE_FUTURE: ("#DA8BC3", "resolve_future"),
    trace.PUBLISH: ("#CCB974", "publish"),
    trace.STASH: ("#64B5CD", "stash"),
}


def _window(sync: Trace, overlap: Trace) -> list[int]:
    """``STEPS`` consecutive decode steps present in both loops, mid-run."""
    decode = sorted(
        set(sync.named(trace.RESOLVE_FUTURE)) & set(overlap.named(trace.RESOLVE_FUTURE))
    )
    runs: list[list[int]] = []
    for step in decode:
        if runs and runs[-1][-1] == step - 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    long_enough = [r for r in runs if len(r) >= STEPS] or [max(runs, key=len)]
    middle = long_enough[len(long_enough) // 2]
    first = middle[(len(middle) - STEPS) // 2] if len(middle) > STEPS else middle[0]
    return [s for s in middle if first <= s < first + STEPS]


def _panel_spans(run: Trace, steps: list[int]) -> tuple[list[Span], float, float]:
    """The spans inside the window from forward ``steps[0]``'s start to forward
    ``steps[-1]``'s end (the device's view of those steps), and the window."""
    forward = run.named(trace.FORWARD)
    start = forward[steps[0]].start
    end = forward[steps[-1]].end
    shown = [s for s in run.spans if s.start < end and s.end > start]
    shown += [k for k in run.kernels if k.start < end and k.end > start]
    return shown, start, end


def _row_of(span: Span) -> str:
    """The row a span is drawn on: a role (the trace names threads ``role (tid)``)
    or a CUDA stream."""
    if span.row.startswith(_STREAM):
        return span.row
    if span.row.startswith(trace.FORWARD_THREAD):
        return trace.FORWARD_THREAD
    return trace.SCHEDULER_THREAD


def _rows(spans: Sequence[Span]) -> list[str]:
    """The panel's rows, top to bottom: the scheduler thread, the forward worker
    (CPU overlap), then each CUDA stream that ran kernels."""
    found = {_row_of(s) for s in spans}
    rows = [trace.SCHEDULER_THREAD]
    if trace.FORWARD_THREAD in found:
        rows.append(trace.FORWARD_THREAD)
    return rows + sorted(r for r in found if r.startswith(_STREAM))


def timeline(
    data: Trace,
    path: Path,
    modes: Sequence[str],
    machine: Mapping[str, str] | None = None,
) -> None:
    """Draw ``modes``' traced runs (sync above overlap) into the picture ``path``;
    ``machine``: what else the machine did during each run (``"decode sync"``), added
    to its panel's title."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    runs = data.runs()
    panels: list[tuple[str, list[Span], float, float, list[int]]] = []
    for mode in modes:
        sync, overlap = runs[f"{mode} sync"], runs[f"{mode} overlap"]
        steps = _window(sync, overlap)
        for loop, run in (("sync", sync), ("overlap", overlap)):
            spans, start, end = _panel_spans(run, steps)
            panels.append((f"{mode}, {loop}", spans, start, end, steps))
    machine = machine or {}
    # One time scale per mode, sync and overlap alike: the shorter panel is faster.
    mode_width = {
        mode: max(end - start for t, _, start, end, _ in panels if t.startswith(mode))
        / 1000.0
        for mode in modes
    }
    heights = [len(_rows(p[1])) for p in panels]
    figure = Figure(figsize=(12, 1.1 + 1.05 * sum(heights)), layout="constrained")
    axes_list = figure.subplots(
        len(panels),
        1,
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )[:, 0]
    for axes, (title, spans, start, end, steps) in zip(axes_list, panels):
        width_ms = mode_width[title.split(",")[0]]
        during = machine.get(title.replace(",", ""))
        _draw_panel(axes, title, spans, start, end, steps, width_ms, during)
        axes.set_xlim(0, width_ms * 1.01)
    axes_list[-1].set_xlabel(
        "ms from the start of the first step's forward; numbers above the "
        "scheduler's blocks are the step whose batch it builds"
    )
    keys = [Patch(color=c, label=label) for c, label in _SCHEDULER.values() if label]
    keys.insert(0, Patch(color=_FORWARD_COLOUR, label="forward N"))
    figure.legend(
        handles=keys,
        loc="outside upper center",
        ncol=len(keys),
        frameon=False,
        fontsize=9,
    )
    figure.savefig(path, dpi=110)


def _draw_panel(
    axes: Any,
    title: str,
    spans: list[Span],
    start: float,
    end: float,
    steps: list[int],
    width_ms: float,
    during: str | None = None,
) -> None:
    y_of = _frame(axes, title, _rows(spans), (end - start) / 1000.0, steps, during)
    named_calls: set[str] = set()
    for span in spans:
        row = _row_of(span)
        y = y_of[row]
        # Clipped to the window: a host wait may start before it or end after it.
        left = (max(span.start, start) - start) / 1000.0
        width = (min(span.end, end) - max(span.start, start)) / 1000.0
        if row.startswith(_STREAM):
            axes.broken_barh(
                [(left, max(width, width_ms * 0.001))],
                (y - 0.25, 0.5),
                color=_KERNEL_COLOUR,
            )
        elif span.what == trace.FORWARD:
            _draw_forward(axes, span, y, (left, width), steps, width_ms)
        elif span.what in _SCHEDULER:
            _draw_scheduler(axes, span, y, (left, width), steps)
        elif span.what in _RELAY_CALLS:
            _draw_relay_call(axes, span, y, (left, width), steps, width_ms, named_calls)


def _frame(
    axes: Any,
    title: str,
    rows: list[str],
    ms: float,
    steps: list[int],
    during: str | None,
) -> dict[str, int]:
    """The panel's title (with what else the machine did during the run, ``during``),
    row labels and spines; the y of each row, top to bottom."""
    y_of = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    axes.set_title(
        f"{title}: steps {steps[0]}-{steps[-1]} in {ms:.1f} ms"
        + ("" if during is None else f"; during the run, {during}"),
        loc="left",
        fontsize=10,
        fontweight="bold",
    )
    streams = [r for r in rows if r.startswith(_STREAM)]
    role = (
        ""
        if trace.FORWARD_THREAD in rows
        else "\n(launches the forwards)"
        if streams
        else "\n(runs the forward too)"
    )
    labels = {
        trace.SCHEDULER_THREAD: f"scheduler thread{role}",
        trace.FORWARD_THREAD: "forward worker\n(thread)",
    }
    labels.update({r: f"CUDA {r}\n(kernels)" for r in streams})
    axes.set_yticks([y_of[r] for r in rows], [labels[r] for r in rows], fontsize=9)
    axes.set_ylim(-0.6, len(rows) - 0.4)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    return y_of


def _draw_forward(
    axes: Any,
    span: Span,
    y: int,
    at: tuple[float, float],
    steps: list[int],
    width_ms: float,
) -> None:
    """A forward pass: a bar, named with its step where it is wide enough."""
    left, width = at
    axes.broken_barh(
        [(left, width)], (y - 0.32, 0.64), color=_FORWARD_COLOUR, alpha=0.85
    )
    share = width / width_ms
    text = f"forward {span.step}" if share > 0.12 else f"{span.step}"
    if span.step in steps and share > 0.03:
        axes.text(
            left + width / 2,
            y + 0.12,
            text,
            ha="center",
            va="center",
            color="white",
            fontsize=9,
            fontweight="bold",
            clip_on=True,
        )


def _draw_scheduler(
    axes: Any, span: Span, y: int, at: tuple[float, float], steps: list[int]
) -> None:
    """A scheduler range: waits hatched, the fence wait inside its host wait, each
    batch build numbered with its step."""
    left, width = at
    colour, _ = _SCHEDULER[span.what]
    inner = span.what == trace.FENCE_WAIT
    height = 0.4 if inner else 0.64
    axes.broken_barh(
        [(left, width)],
        (y - height / 2, height),
        color=colour,
        hatch="//" if span.what in (trace.HOST_WAIT, trace.FENCE_WAIT) else None,
        edgecolor="white" if inner else None,
        linewidth=0,
    )
    if span.what == trace.BUILD and span.step >= steps[0] - 1:
        axes.text(
            left,
            y + 0.36,
            f"{span.step}",
            ha="left",
            va="bottom",
            fontsize=8,
            color=colour,
            clip_on=True,
        )


def _draw_relay_call(
    axes: Any,
    span: Span,
    y: int,
    at: tuple[float, float],
    steps: list[int],
    width_ms: float,
    named_calls: set[str],
) -> None:
    """A relay call, tens of microseconds: a mark a few pixels wide at least. Each
    call is named once per panel (``named_calls``), on its own forward so names do
    not collide."""
    left, width = at
    colour, name = _RELAY_CALLS[span.what]
    shown = max(width, width_ms * 0.004)
    axes.broken_barh([(left, shown)], (y - 0.32, 0.2), color=colour)
    turn = steps.index(span.step) if span.step in steps else -1
    order = [trace.RESOLVE_FUTURE, trace.PUBLISH, trace.STASH]
    if (
        span.what in order
        and span.what not in named_calls
        and turn == order.index(span.what)
    ):
        named_calls.add(span.what)
        axes.annotate(
            name,
            (left + shown / 2, y - 0.32),
            xytext=(0, -9),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=8,
            color="black",
            arrowprops={"arrowstyle": "-", "color": colour, "lw": 1},
            annotation_clip=False,
        )
