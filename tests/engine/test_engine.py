"""The reference overlap engine: overlap runs match synchronous runs token for token."""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs
import pytest
import torch

from relay.cpu_stream import CpuEvent, ThreadStream, use_cpu_stream
from relay.engine import (
    EngineConfig,
    ModelConfig,
    RunResult,
    SchedulerConfig,
    SpecConfig,
    WorkloadConfig,
    run_workload,
)
from relay.engine.batch import ForwardBatch, StepOutput
from relay.engine.maps import MapSource
from relay.engine.model import KVCache, TargetModel
from relay.engine.relays import MapRelay, map_relay
from relay.engine.runner import ModelRunner
from relay.maps.eagle import EagleFutureMap

TINY = ModelConfig(
    vocab_size=1024, hidden=64, layers=1, heads=2, ffn=128, max_context=128
)
# More requests than slots, arriving over time: slots are freed and reused.
SMALL = EngineConfig(
    model=TINY,
    workload=WorkloadConfig(
        requests=40,
        min_prompt=4,
        max_prompt=24,
        min_output=2,
        max_output=24,
        arrival_rate=1.5,
    ),
    scheduler=SchedulerConfig(
        max_running=6, max_prefill_tokens=64, kv_pages=64, page_size=8
    ),
    debug=True,
)
EAGLE = SpecConfig(steps=3, topk=2)


def _pair(config: EngineConfig) -> tuple[RunResult, RunResult]:
    sync = run_workload(attrs.evolve(config, overlap=False))
    overlap = run_workload(attrs.evolve(config, overlap=True))
    return sync, overlap


def _check_workload_shape(result: RunResult, config: EngineConfig) -> None:
    assert len(result.outputs) == config.workload.requests
    # Both ways of finishing occur, so the one-step-late EOS path is exercised.
    assert result.finish_reasons.get("eos", 0) > 0
    assert result.finish_reasons.get("length", 0) > 0


def test_overlap_matches_sync_decode() -> None:
    """Plain decoding: the overlap loop over the decode map yields the sync loop's tokens."""
    sync, overlap = _pair(SMALL)
    _check_workload_shape(sync, SMALL)
    assert overlap.outputs == sync.outputs
    assert overlap.steps == sync.steps


def test_overlap_matches_sync_eagle() -> None:
    """EAGLE decoding: the overlap loop over the eagle map yields the sync loop's tokens."""
    config = attrs.evolve(SMALL, spec=EAGLE)
    sync, overlap = _pair(config)
    _check_workload_shape(sync, config)
    assert overlap.outputs == sync.outputs
    assert overlap.accept_length == sync.accept_length > 1.0


def test_freed_slots_are_released_on_the_forward_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finished requests' slots reach the debug map's release, in the forward after them."""
    released: list[int] = []
    original = MapRelay.release

    def spy(self: MapRelay, slots: torch.Tensor) -> None:
        released.extend(slots.tolist())
        original(self, slots)

    monkeypatch.setattr(MapRelay, "release", spy)
    result = run_workload(attrs.evolve(SMALL, overlap=True))
    # Slots are reused (40 requests, 6 slots), each reuse released first; only the
    # last requests end after the last launch.
    assert len(released) >= SMALL.workload.requests - SMALL.scheduler.max_running
    assert set(released) <= set(range(1, SMALL.scheduler.max_running + 1))
    assert len(result.outputs) == SMALL.workload.requests


def test_a_slot_released_too_early_is_caught_in_debug_mode() -> None:
    """Releasing on the host, before the in-flight forward that reads the slot, is reported."""
    relay = map_relay(MapSource().load(), None, torch.device("cpu"), 4, debug=True)
    slot = torch.tensor([2])
    relay.stash(slot, torch.tensor([7]), ())
    relay.release(slot)  # wrong: the next forward still reads the slot's token
    batch = ForwardBatch.idle(torch.device("cpu"))
    batch.req_pool_indices = slot
    batch.input_ids = -slot
    with pytest.raises(RuntimeError, match="reused"):
        relay.resolve_future(batch)


def test_eagle_reproduces_greedy_decoding() -> None:
    """Greedy verification makes speculative decoding emit plain greedy decoding's tokens."""
    plain = run_workload(attrs.evolve(SMALL, overlap=True))
    spec = run_workload(
        attrs.evolve(SMALL, overlap=True, spec=SpecConfig(steps=2, topk=1))
    )
    assert spec.outputs == plain.outputs
    assert spec.steps < plain.steps


def test_thread_stream_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host wait issued before a queued task records blocks until that task's record."""
    stream = ThreadStream("test")
    event = CpuEvent()
    host_waits = threading.Event()  # the host is blocked in a wait on the stream
    host_resumed = threading.Event()
    log: list[str] = []
    original_wait = stream.wait_ticket

    def spy_wait(ticket: int, done: Callable[[], bool], *, join: bool = True) -> None:
        host_waits.set()
        original_wait(ticket, done, join=join)

    def task() -> None:
        # Gates, not sleeps: the record happens only once the host waits for it, and
        # the rest of the task only once the host resumed (a wait that covered the
        # whole task would never return: the 60 s bound only keeps such a bug from
        # hanging the suite).
        if not host_waits.wait(timeout=60):
            log.append("the host never waited")
        log.append("before record")
        event.record()
        if not host_resumed.wait(timeout=60):
            log.append("the host did not resume at the record")
        log.append("after record")

    monkeypatch.setattr(stream, "wait_ticket", spy_wait)
    try:
        with use_cpu_stream(None):
            stream.submit(event.record)  # an earlier record, already complete
            stream.synchronize()
            stream.submit(task)
            event.synchronize()  # the newest task has not recorded yet: wait for it
            log.append("host resumed")
            host_resumed.set()
            stream.synchronize()
        assert log == ["before record", "host resumed", "after record"]
        assert stream.busy_seconds > 0.0  # the worker's time in tasks is counted
    finally:
        host_waits.set()
        host_resumed.set()
        stream.close()


def test_thread_stream_runs_in_order_and_reraises() -> None:
    """Tasks run in submission order; a task's error surfaces on the host."""
    stream = ThreadStream("test")
    seen: list[int] = []
    try:
        for i in range(5):
            stream.submit(lambda i=i: seen.append(i))
        stream.synchronize()
        assert seen == list(range(5))
        stream.submit(lambda: 1 / 0)  # type: ignore[func-returns-value]
        with pytest.raises(RuntimeError, match="failed"):
            stream.synchronize()
    finally:
        stream.close()


@pytest.mark.parametrize("spec", [None, EAGLE], ids=["decode", "eagle"])
def test_idle_forward_is_a_no_op(spec: SpecConfig | None) -> None:
    """An idle rank's forward issues every relay operation on zero indices: nothing changes."""
    device = torch.device("cpu")
    pool = 5
    relay = map_relay(MapSource().load(), spec, device, pool, debug=True)
    future_map = relay.map
    before = {
        k: v.clone() for k, v in vars(future_map).items() if isinstance(v, torch.Tensor)
    }
    calls: list[int] = []
    model = TargetModel(TINY, device)
    runner = ModelRunner(
        model, KVCache(TINY, pool, device), relay, spec=spec, step_sync=calls.append
    )
    batch = ForwardBatch.idle(device)
    runner.forward(batch, StepOutput())
    relay.resolve_lengths(batch)  # zero indices: no fence wait, no debug check
    assert calls == [0]
    for name, value in before.items():
        torch.testing.assert_close(
            getattr(future_map, name), value, rtol=0, atol=0, equal_nan=True, msg=name
        )
    if isinstance(future_map, EagleFutureMap):
        assert future_map.hidden_states_buf is None  # lazy field untouched


def test_data_parallel_two_ranks_match_one() -> None:
    """Two gloo ranks, each with its own scheduler and maps, match the single-rank run."""
    from relay.engine.parallel import run_data_parallel

    config = attrs.evolve(
        SMALL,
        spec=EAGLE,
        overlap=True,
        workload=attrs.evolve(SMALL.workload, requests=16, max_output=12),
    )
    single = run_workload(config)
    merged, per_rank = run_data_parallel(config, 2)
    assert merged.outputs == single.outputs
    assert sum(r.idle_steps for r in per_rank) > 0  # some steps ran with an idle rank
    assert per_rank[0].steps == per_rank[1].steps  # one shared step sequence


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", [None, EAGLE], ids=["decode", "eagle"])
def test_overlap_matches_sync_cuda(spec: SpecConfig | None) -> None:
    """On CUDA streams and events, overlap matches sync for both maps."""
    config = attrs.evolve(SMALL, device="cuda", spec=spec)
    sync, overlap = _pair(config)
    assert overlap.outputs == sync.outputs
