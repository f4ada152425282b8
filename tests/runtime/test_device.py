"""Device policies and the schedule-lane fence: lazy creation, chained records, waits.

The two-stream tests use ``relay.cpu_stream.ThreadStream``s, so the overlap is real
on the CPU. A delayed publish on stream A is held by a gate that a policy hook opens
only once someone waits on the fence (a publisher chaining, or the scheduler), so
a wait that does not cover A's write reads the stale row.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from relay_runtime_support import (
    GUARD_S,
    batch_of,
    eagle_payload,
    gated,
    slots,
    thread_streams,
)

import relay.device
from relay.cpu_stream import current_cpu_stream
from relay.device import (
    CpuPolicy,
    GenericPolicy,
    HipPolicy,
    HostMirror,
    policy_for,
    register_policy,
)
from relay.maps.decode_seq_lens import DecodeSeqLensFutureMap as DecodeFutureMap
from relay.maps.decode_seq_lens import DecodeSeqLensPayload as DecodePayload
from relay.maps.eagle import EagleFutureMap, EaglePayload

POOL = 9
_WINDOW_S = 0.2


class RecordingPolicy(CpuPolicy):
    """The CPU policy, logging every call a Fence or HostMirror makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.on_stream_wait: threading.Event | None = None
        self.on_wait: threading.Event | None = None
        self.events: list[Any] = []

    def new_event(self) -> Any:
        event = super().new_event()
        self.events.append(event)
        self.calls.append(("new_event", None))
        return event

    def record(self, event: Any, stream: Any) -> None:
        self.calls.append(("record", stream))
        super().record(event, stream)

    def stream_wait(self, stream: Any, event: Any) -> None:
        self.calls.append(("stream_wait", stream))
        if self.on_stream_wait is not None:
            self.on_stream_wait.set()
        super().stream_wait(stream, event)

    def wait(self, event: Any) -> None:
        self.calls.append(("wait", current_cpu_stream()))
        if self.on_wait is not None:
            self.on_wait.set()
        super().wait(event)

    def to_host(self, src: torch.Tensor, mirror: HostMirror) -> torch.Tensor:
        self.calls.append(("to_host", tuple(src.shape)))
        return super().to_host(src, mirror)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def recording(isolated_policies: None) -> RecordingPolicy:
    """A RecordingPolicy installed for the cpu device type."""
    policy = RecordingPolicy()
    register_policy("cpu", lambda device: policy)
    return policy


# -- policy selection --------------------------------------------------------------------------


def test_cpu_device_gets_the_cpu_policy(isolated_policies: None) -> None:
    """policy_for(cpu) is the synchronous CpuPolicy, one object per device."""
    policy = policy_for(torch.device("cpu"))
    assert isinstance(policy, CpuPolicy)
    assert policy_for(torch.device("cpu")) is policy


def test_rocm_build_gets_the_hip_policy(
    isolated_policies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a ROCm build the cuda device type gets HipPolicy (host wait), not a device wait."""
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert isinstance(policy_for(torch.device("cuda", 0)), HipPolicy)


def test_hip_policy_wait_blocks_the_host() -> None:
    """HipPolicy.wait synchronizes the event on the host instead of a stream wait."""
    calls: list[str] = []

    class FakeEvent:
        def synchronize(self) -> None:
            calls.append("synchronize")

        def wait(self, stream: Any = None) -> None:
            calls.append("device wait")

    HipPolicy(torch.device("cuda", 0)).wait(FakeEvent())
    assert calls == ["synchronize"]


def test_register_policy_replaces_the_policy_of_existing_devices(
    isolated_policies: None,
) -> None:
    """A policy registered later is used from the next lookup on, even for a cached device."""
    first = policy_for(torch.device("cpu"))
    mine = RecordingPolicy()
    register_policy("cpu", lambda device: mine)
    assert policy_for(torch.device("cpu")) is mine
    assert policy_for(torch.device("cpu")) is not first


def test_map_uses_the_registered_policy(recording: RecordingPolicy) -> None:
    """publish records and resolve waits through the registered policy, with a host copy."""
    relay = DecodeFutureMap("cpu", POOL)
    relay.publish(slots(1, 2), torch.tensor([3, 4]))
    batch = batch_of(2, 1)
    relay.resolve_seq_lens_cpu(batch)
    assert recording.names() == ["new_event", "record", "wait", "to_host"]
    assert ("to_host", (2,)) in recording.calls
    assert batch.seq_lens_cpu.tolist() == [4, 3]


def test_publish_writes_before_it_records(recording: RecordingPolicy) -> None:
    """The fence is recorded after the published rows are written, so a waiter sees them."""
    relay = DecodeFutureMap("cpu", POOL)
    seen: list[int] = []
    original = recording.record

    def record(event: Any, stream: Any) -> None:
        seen.append(int(relay.new_seq_lens_buf[5]))
        original(event, stream)

    recording.record = record  # type: ignore[method-assign]
    relay.publish(slots(5), torch.tensor([42]))
    assert seen == [42]


# -- the fence ---------------------------------------------------------------------------------


def test_fence_is_created_on_the_first_publish_not_at_construction(
    recording: RecordingPolicy,
) -> None:
    """No event exists until the first publish; stash and resolve_future never make one."""
    relay = EagleFutureMap("cpu", POOL, topk=2)
    assert not relay._state.fence.created
    relay.stash(slots(1), eagle_payload(1, 2))
    relay.resolve_future(batch_of(1))
    assert not relay._state.fence.created and recording.calls == []
    relay.publish(slots(1), torch.tensor([9]))
    assert relay._state.fence.created
    relay.publish(slots(2), torch.tensor([9]))
    assert recording.names() == ["new_event", "record", "record"], "one reusable event"


def test_publishes_from_one_stream_do_not_chain(recording: RecordingPolicy) -> None:
    """Consecutive publishes on the same stream record without waiting on themselves."""
    relay = DecodeFutureMap("cpu", POOL)
    with thread_streams("fwd") as (stream,):
        for step in range(3):
            stream.submit(
                lambda step=step: relay.publish(slots(1), torch.tensor([step + 1]))
            )
        stream.synchronize()
    assert "stream_wait" not in recording.names()


def test_publish_from_a_second_stream_waits_on_the_previous_record(
    recording: RecordingPolicy,
) -> None:
    """A publish from another stream (or the host) first waits on the previous record."""
    relay = DecodeFutureMap("cpu", POOL)
    with thread_streams("A", "B") as (a, b):
        a.submit(lambda: relay.publish(slots(1), torch.tensor([1])))
        a.synchronize()
        b.submit(lambda: relay.publish(slots(2), torch.tensor([2])))
        b.synchronize()
        relay.publish(slots(3), torch.tensor([3]))
        assert [c for c in recording.calls if c[0] in ("record", "stream_wait")] == [
            ("record", a),
            ("stream_wait", b),
            ("record", b),
            ("stream_wait", None),
            ("record", None),
        ]


def _chain_scenario(second_publisher: str, recording: RecordingPolicy) -> list[int]:
    """Slot 1 is published late on stream A, slot 2 by ``second_publisher`` after it is
    queued; returns what the scheduler then reads for slots 1 and 2."""
    relay = DecodeFutureMap("cpu", POOL)
    gate = threading.Event()
    # A's delayed write may land once someone waits for it: the second publisher
    # chaining on it, or the scheduler. Before that, the second publish has to run.
    recording.on_stream_wait = gate
    recording.on_wait = gate
    with thread_streams("A", "B") as (a, b):
        try:
            a.submit(
                lambda: relay.publish(slots(1, 2), torch.tensor([5, 6]))
            )  # step N-1
            a.synchronize()
            a.submit(gated(gate, lambda: relay.publish(slots(1), torch.tensor([11]))))
            if second_publisher == "host":
                relay.publish(slots(2), torch.tensor([22]))
            else:
                published = threading.Event()
                b.submit(
                    lambda: (
                        relay.publish(slots(2), torch.tensor([22])),
                        published.set(),
                    )
                )
                assert published.wait(GUARD_S), "B's publish never completed"
            batch = batch_of(1, 2)
            relay.resolve_seq_lens_cpu(batch)
            return [int(v) for v in batch.seq_lens_cpu]
        finally:
            gate.set()


@pytest.mark.parametrize("second_publisher", ["stream B", "host"])
def test_second_publisher_cannot_drop_a_delayed_publish(
    recording: RecordingPolicy, second_publisher: str
) -> None:
    """With a publish still pending on stream A, a later publish elsewhere keeps A's write
    in the scheduler's wait (Note [Fence chaining])."""
    assert _chain_scenario(second_publisher, recording) == [11, 22]


def test_hip_like_policy_blocks_the_host_until_the_publish(
    isolated_policies: None,
) -> None:
    """A policy whose wait blocks the host makes the scheduler's resolve see a late publish."""

    class HipLike(RecordingPolicy):
        def wait(self, event: Any) -> None:
            self.calls.append(("host wait", current_cpu_stream()))
            if self.on_wait is not None:
                self.on_wait.set()
            event.synchronize()

    policy = HipLike()
    register_policy("cpu", lambda device: policy)
    relay = DecodeFutureMap("cpu", POOL)
    gate = threading.Event()
    policy.on_wait = gate  # the publish may proceed once the scheduler is waiting
    with thread_streams("fwd") as (stream,):
        try:
            stream.submit(lambda: relay.publish(slots(3), torch.tensor([7])))
            stream.synchronize()
            stream.submit(
                gated(gate, lambda: relay.publish(slots(3), torch.tensor([8])))
            )
            batch = batch_of(3)
            relay.resolve_seq_lens_cpu(batch)
        finally:
            gate.set()
    assert batch.seq_lens_cpu.tolist() == [8]
    assert ("host wait", None) in policy.calls


def test_scheduler_wait_covers_a_publish_mid_forward() -> None:
    """With the default CPU policy the scheduler's resolve waits for the forward's publish,
    not for the end of the forward."""
    relay = DecodeFutureMap("cpu", POOL)
    finish = threading.Event()
    with thread_streams("fwd") as (stream,):
        stream.submit(lambda: relay.publish(slots(1), torch.tensor([4])))
        stream.synchronize()

        def forward() -> None:
            relay.stash(slots(1), DecodePayload(next_token_ids=torch.tensor([9])))
            relay.publish(slots(1), torch.tensor([5]))
            assert finish.wait(GUARD_S)  # the draft extension, still running

        stream.submit(forward)
        try:
            batch = batch_of(1)
            relay.resolve_seq_lens_cpu(batch)
            assert not finish.is_set()
            assert batch.seq_lens_cpu.tolist() == [5] and batch.seq_lens_sum == 5
        finally:
            finish.set()


def test_scheduler_wait_covers_the_very_first_publish() -> None:
    """The first step's resolve waits for the first publish, submitted but not yet run."""
    relay = DecodeFutureMap("cpu", POOL)
    gate = threading.Event()
    with thread_streams("fwd") as (stream,):
        stream.submit(gated(gate, lambda: relay.publish(slots(1), torch.tensor([4]))))
        batch = batch_of(1)
        done = threading.Event()

        def scheduler() -> None:
            relay.resolve_seq_lens_cpu(batch)
            done.set()

        threading.Thread(target=scheduler, daemon=True).start()
        try:
            done.wait(_WINDOW_S)
            gate.set()
            assert done.wait(GUARD_S)
            assert batch.seq_lens_cpu.tolist() == [4]
        finally:
            gate.set()


# -- CUDA --------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_host_mirror_goes_through_pinned_rows() -> None:
    """The host copy is made through a pinned mirror and handed out as a private tensor."""
    device = torch.device("cuda")
    relay = DecodeFutureMap(device, POOL)
    relay.publish(slots(3).to(device), torch.tensor([12], device=device))
    batch = batch_of(3)
    batch.req_pool_indices = batch.req_pool_indices.to(device)
    relay.resolve_seq_lens_cpu(batch)
    mirror = relay._new_seq_lens_host
    assert mirror._pinned is not None and mirror._pinned.is_pinned()
    assert batch.seq_lens_cpu.tolist() == [12]
    assert batch.seq_lens_cpu.data_ptr() != mirror._pinned.data_ptr()
    first = batch.seq_lens_cpu
    relay.publish(slots(3).to(device), torch.tensor([13], device=device))
    relay.resolve_seq_lens_cpu(batch)
    assert first.tolist() == [12], (
        "the next copy must not overwrite a handed-out mirror"
    )


def _on(payload: EaglePayload, device: torch.device) -> EaglePayload:
    return EaglePayload(
        bonus_tokens=payload.bonus_tokens.to(device),
        topk_p=payload.topk_p.to(device),
        topk_index=payload.topk_index.to(device),
    )


@pytest.mark.gpu
def test_cuda_graph_capture_of_resolve_future() -> None:
    """resolve_future has no host sync, so it can be captured and replayed in a CUDA graph:
    the replay gathers the newest stash into the tensors the capture handed the batch."""
    device = torch.device("cuda")
    relay = EagleFutureMap(device, POOL, topk=2)
    batch = batch_of(1, 2, 0)  # the last row is padding at the scratch slot
    batch.req_pool_indices = batch.req_pool_indices.to(device)
    relay.stash(batch.req_pool_indices[:2], _on(eagle_payload(2, 2, base=3), device))
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        relay.resolve_future(batch)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        relay.resolve_future(batch)
    stashed = eagle_payload(2, 2, base=20)
    relay.stash(batch.req_pool_indices[:2], _on(stashed, device))
    graph.replay()
    torch.cuda.synchronize(device)
    assert batch.spec_info.bonus_tokens[:2].tolist() == [20, 21]
    assert torch.equal(batch.spec_info.topk_index[:2].cpu(), stashed.topk_index)


class _DeviceModule:
    """A device module whose streams are per device, as torch.xpu's are."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    def current_stream(self, device: Any = None) -> str:
        self.asked.append(device)
        return f"stream of {device if device is not None else 'the current device'}"

    def Event(self) -> object:
        return object()


def test_generic_policy_uses_the_maps_own_devices_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A map on xpu:1 records and waits on xpu:1's stream, not the current device's."""
    module = _DeviceModule()
    monkeypatch.setattr(torch, "get_device_module", lambda device_type: module)
    policy = GenericPolicy(torch.device("xpu", 1))
    assert policy.current_stream() == "stream of xpu:1"
    assert module.asked == [torch.device("xpu", 1)]


def test_generic_policy_without_streams_has_no_current_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A device module without streams and events: no stream, a synchronizing event."""
    monkeypatch.setattr(torch, "get_device_module", lambda device_type: object())
    assert GenericPolicy(torch.device("xpu", 1)).current_stream() is None


def test_policies_are_restored_after_isolation() -> None:
    """Tests that register policies leave the process-wide defaults in place."""
    assert relay.device._FACTORIES.get("cpu") is None
    assert isinstance(policy_for(torch.device("cpu")), CpuPolicy)
    assert not isinstance(policy_for(torch.device("cpu")), RecordingPolicy)


# -- the host mirror (Note [CPU host mirror]) ------------------------------------------


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_host_mirror_is_a_copy_an_engine_may_advance_in_place(device: str) -> None:
    """``seq_lens`` and its host copy ``seq_lens_cpu`` are distinct tensors on every device:
    a scheduler advancing both in place between steps counts each once."""
    relay = EagleFutureMap(device, POOL, topk=2)
    indices = slots(2, 5).to(device)
    relay.publish(indices, torch.tensor([7, 11], device=device))
    batch = batch_of(2, 5)
    batch.req_pool_indices = indices
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu.device.type == "cpu"
    assert batch.seq_lens_cpu.untyped_storage().data_ptr() != (
        batch.seq_lens.untyped_storage().data_ptr()
    )
    batch.seq_lens.add_(1)
    batch.seq_lens_cpu.add_(1)
    assert batch.seq_lens.tolist() == [8, 12]
    assert batch.seq_lens_cpu.tolist() == [8, 12]
    assert batch.seq_lens_sum == 18  # summed before the advance


def test_a_host_mirror_outlives_the_next_resolve() -> None:
    """Step N's ``seq_lens_cpu`` keeps its values while step N+1 resolves (the scheduler
    may still read it): each resolve hands over a fresh host tensor."""
    relay = DecodeFutureMap("cpu", POOL)
    first, second = batch_of(1, 2), batch_of(1, 2)
    relay.publish(slots(1, 2), torch.tensor([3, 4]))
    relay.resolve_seq_lens_cpu(first)
    relay.publish(slots(1, 2), torch.tensor([5, 6]))
    relay.resolve_seq_lens_cpu(second)
    assert first.seq_lens_cpu.tolist() == [3, 4]
    assert second.seq_lens_cpu.tolist() == [5, 6]


def test_the_cpu_policy_hands_over_a_copy() -> None:
    """``CpuPolicy.to_host`` never returns its argument, nor a view of it."""
    src = torch.arange(4)
    copy = CpuPolicy().to_host(src, HostMirror(torch.device("cpu"), POOL))
    assert copy is not src and copy.data_ptr() != src.data_ptr()
    assert torch.equal(copy, src)
