"""Traces of the engine (``relay demo --trace``): each step's ranges, on their threads, in time."""

from __future__ import annotations

import threading
from pathlib import Path

import attrs
import pytest

from relay.engine import (
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpecConfig,
    WorkloadConfig,
    run_workload,
    trace,
)
from relay.engine.relays import MapRelay
from relay.engine.runner import ModelRunner
from relay.engine.scheduler import Scheduler
from relay.engine.trace import Span, Trace

#: Long enough for a test machine under load; reached only when something is broken.
GUARD_S = 120.0

FAST = EngineConfig(
    model=ModelConfig(
        vocab_size=1024, hidden=32, layers=1, heads=2, ffn=64, max_context=96
    ),
    workload=WorkloadConfig(
        requests=10,
        min_prompt=4,
        max_prompt=16,
        min_output=4,
        max_output=16,
        arrival_rate=2.0,
    ),
    scheduler=SchedulerConfig(
        max_running=4, max_prefill_tokens=64, kv_pages=64, page_size=8
    ),
    trace=True,
)
#: The scheduler's ranges of a step (what it does to build and resolve that step).
SCHEDULER_WORK = (trace.BUILD, trace.HOST_SEQ_LENS, trace.RESOLVE_SEQ_LENS)


class _BuildGate:
    """Holds each overlap forward at its stash until the scheduler has started to
    build the next batch, so forward N is certainly still running then (the trace
    must show it; without the gate a fast forward could end first)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cond = threading.Condition()
        self.builds = 0
        self.builds_at_launch: dict[int, int] = {}
        gate = self
        next_batch, scheduled, stash = (
            Scheduler.next_batch,
            MapRelay.scheduled,
            ModelRunner._stash,
        )

        def counting_next_batch(self: Scheduler) -> object:
            with gate.cond:
                gate.builds += 1
                gate.cond.notify_all()
            return next_batch(self)

        def noting_scheduled(self: MapRelay, batch: object) -> None:
            with gate.cond:
                gate.builds_at_launch[batch.step] = gate.builds  # type: ignore[attr-defined]
            scheduled(self, batch)  # type: ignore[arg-type]

        def gated_stash(self: ModelRunner, batch: object, *args: object) -> None:
            step = batch.step  # type: ignore[attr-defined]
            with gate.cond:
                assert gate.cond.wait_for(
                    lambda: gate.builds > gate.builds_at_launch[step], GUARD_S
                ), f"the scheduler never started building step {step + 1}"
            stash(self, batch, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(Scheduler, "next_batch", counting_next_batch)
        monkeypatch.setattr(MapRelay, "scheduled", noting_scheduled)
        monkeypatch.setattr(ModelRunner, "_stash", gated_stash)


def _traced(tmp_path: Path, config: EngineConfig, name: str) -> Trace:
    path = tmp_path / f"{name}.json"
    with trace.record(path):
        run_workload(config)
    return trace.load(path)


def _on(span: Span, row: str) -> bool:
    return span.row.startswith(row)


def _scheduler_overlaps(run: Trace, step: int, forward: Span) -> list[str]:
    """The scheduler's ranges of ``step`` that were open while ``forward`` ran."""
    return [
        s.what
        for s in run.spans
        if s.step == step and s.what in SCHEDULER_WORK and s.overlaps(forward)
    ]


def test_scheduler_of_step_n_plus_1_overlaps_forward_n_only_in_overlap_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overlap: building batch N+1 runs on the scheduler thread while forward N runs on
    the forward worker; sync: no range of step N+1 overlaps forward N."""
    sync = _traced(tmp_path, attrs.evolve(FAST, overlap=False), "sync")
    with monkeypatch.context() as patch:
        _BuildGate(patch)
        overlap = _traced(tmp_path, attrs.evolve(FAST, overlap=True), "overlap")
    assert set(sync.runs()) == {"decode sync"}
    assert set(overlap.runs()) == {"decode overlap"}
    sync_forwards, overlap_forwards = (
        sync.named(trace.FORWARD),
        overlap.named(trace.FORWARD),
    )
    assert sync_forwards.keys() == overlap_forwards.keys()  # the same steps both ways
    assert len(overlap_forwards) > 10
    # Sync: one thread does everything, and step N+1's work follows forward N.
    assert all(_on(s, trace.SCHEDULER_THREAD) for s in sync.spans)
    for step, forward in sync_forwards.items():
        assert _scheduler_overlaps(sync, step + 1, forward) == []
    # Overlap: forwards on the worker, batches built on the scheduler thread, and from
    # step 2 on (the loop's wait for N-1 also waits until forward N has started, Note
    # [Host turns on the CPU worker]) building N+1 overlaps forward N, every time.
    assert all(_on(f, trace.FORWARD_THREAD) for f in overlap_forwards.values())
    builds = overlap.named(trace.BUILD)
    assert all(_on(b, trace.SCHEDULER_THREAD) for b in builds.values())
    overlapped = [
        step
        for step, forward in overlap_forwards.items()
        if trace.BUILD in _scheduler_overlaps(overlap, step + 1, forward)
    ]
    assert set(sorted(overlap_forwards)[1:]) <= set(overlapped)


def test_relay_calls_are_ranges_inside_their_forward_and_the_fence_wait_inside_resolve(
    tmp_path: Path,
) -> None:
    """EAGLE overlap: resolve_future, publish and stash sit inside forward N on the worker;
    resolve_seq_lens_cpu of N+1 holds its fence wait, which ends after N's publish began."""
    run = _traced(
        tmp_path, attrs.evolve(FAST, spec=SpecConfig(steps=2, topk=2)), "eagle"
    )
    forwards = run.named(trace.FORWARD)
    publishes = run.named(trace.PUBLISH)
    decode_steps = sorted(run.named(trace.RESOLVE_FUTURE))
    assert len(decode_steps) > 5
    for what in (trace.RESOLVE_FUTURE, trace.PUBLISH, trace.STASH):
        for step, call in run.named(what).items():
            forward = forwards[step]
            assert _on(call, trace.FORWARD_THREAD)
            assert forward.start <= call.start and call.end <= forward.end, (what, step)
    waits = run.named(trace.FENCE_WAIT)
    resolves = run.named(trace.RESOLVE_SEQ_LENS)
    assert set(waits) == set(resolves) == set(decode_steps)
    for step in decode_steps:
        wait, resolve = waits[step], resolves[step]
        assert _on(resolve, trace.SCHEDULER_THREAD)
        assert resolve.start <= wait.start and wait.end <= resolve.end
        # The fence: the wait returns only once the previous forward has published
        # (the record is inside the publish range).
        assert wait.end > publishes[step - 1].start


def test_tracing_off_opens_no_profiler_range() -> None:
    """With ``trace=False`` a run is chosen ``no_ranges``: one shared empty context."""
    assert trace.ranges_for(False) is trace.no_ranges
    assert trace.no_ranges("forward", 1) is trace.no_ranges("stash", 2)
    assert trace.ranges_for(True) is not trace.no_ranges
