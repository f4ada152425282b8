"""The debug-off fast paths (Note [Checked values], Note [Vouched slots], Note [Bare
CPU fence]): whatever they let through untested is refused on the slow path, before
any write, and the bare fence orders as the chained one."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from relay_runtime_support import (
    Batch,
    buffer_copies,
    buffers_unchanged,
    eagle_payload,
    gated,
    slots,
    thread_streams,
)

import relay.device as device_module
from relay import RelayError
from relay.cpu_stream import CpuEvent
from relay.device import CpuFence, CpuPolicy, Fence
from relay.errors import SlotError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.eagle import EagleFutureMap

POOL = 9
TOPK = 2


def resolved(relay: Any, indices: torch.Tensor) -> Batch:
    """Resolve a batch whose slots tensor is ``indices`` itself (so it is vouched for)."""
    batch = Batch(req_pool_indices=indices)
    relay.resolve_future(batch)
    return batch


def test_a_vouched_slots_tensor_changed_in_place_is_checked_again() -> None:
    """The slots resolve_future gathered with, then set to a slot outside the pool in
    place, are refused by stash and publish with nothing written."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    indices = slots(1, 2)
    resolved(relay, indices)
    relay.stash(indices, eagle_payload(2, TOPK, base=3))  # vouched: written as is
    assert relay.output_tokens_buf[1:3].tolist() == [3, 4]
    indices[1] = POOL
    before = buffer_copies(relay)
    with pytest.raises(
        SlotError, match=r"^EagleFutureMap\.stash: slot 9 at position 1"
    ):
        relay.stash(indices, eagle_payload(2, TOPK, base=5))
    with pytest.raises(SlotError, match=r"^EagleFutureMap\.publish: slot 9"):
        relay.publish(indices, torch.tensor([4, 4]))
    assert buffers_unchanged(relay, before)


def test_inference_tensor_slots_are_always_checked() -> None:
    """Slots made under inference_mode keep no version counter: never vouched for."""
    relay = DecodeFutureMap("cpu", POOL)
    with torch.inference_mode():
        indices = torch.tensor([1, POOL + 3])
    with pytest.raises(IndexError):  # index_select refuses the gather itself
        resolved(relay, indices)
    with torch.inference_mode():
        good = torch.tensor([1, 2])
    resolved(relay, good)
    assert relay._gathered is None
    before = buffer_copies(relay)
    with pytest.raises(SlotError, match=r"^DecodeFutureMap\.stash: slot 12"):
        relay.stash(indices, DecodePayload(next_token_ids=slots(5, 6)))
    assert buffers_unchanged(relay, before)


def test_int32_gathered_slots_are_cast_not_vouched() -> None:
    """Int32 slots are never vouched for: each write casts and checks them."""
    relay = DecodeFutureMap("cpu", POOL)
    indices = torch.tensor([3, 4], dtype=torch.int32)
    resolved(relay, indices)
    assert relay._gathered is None
    relay.stash(indices, DecodePayload(next_token_ids=slots(7, 8)))
    assert relay.output_tokens_buf[3:5].tolist() == [7, 8]


def test_lazy_field_checked_against_its_buffer_after_allocation() -> None:
    """Once the hidden state's buffer exists, another width, another dtype or a value
    that is no tensor is refused (the inline test's cached dtype and row)."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    hidden = torch.ones(2, 4, dtype=torch.bfloat16)
    relay.stash(slots(1, 2), eagle_payload(2, TOPK, hidden=hidden))
    before = buffer_copies(relay)
    for bad, message in (
        (torch.ones(2, 5, dtype=torch.bfloat16), r"got a tensor of shape \(2, 5\)"),
        (torch.ones(2, 4, dtype=torch.complex64), r"got torch\.complex64 values"),
        ([[1.0] * 4] * 2, r"got .* of type list, not a tensor"),
    ):
        with pytest.raises(
            RelayError, match=rf"^EagleFutureMap\.hidden_states: {message}"
        ):
            relay.stash(slots(3, 4), eagle_payload(2, TOPK, hidden=bad))  # type: ignore[arg-type]
    assert buffers_unchanged(relay, before)
    # Another float dtype is cast, as check_rows does.
    relay.stash(slots(3), eagle_payload(1, TOPK, hidden=torch.full((1, 4), 2.0)))
    assert relay.hidden_states_buf is not None
    assert relay.hidden_states_buf.dtype is torch.bfloat16
    assert relay.hidden_states_buf[3].tolist() == [2.0] * 4


def test_zero_slots_leave_a_lazy_buffer_unallocated() -> None:
    """A stash with no slots writes nothing and allocates nothing."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    empty = slots()
    relay.stash(empty, eagle_payload(0, TOPK, hidden=torch.ones(0, 4)))
    assert relay.hidden_states_buf is None


def test_a_tensor_subclass_takes_the_slow_path_and_is_written() -> None:
    """A value of a tensor subclass (a Parameter) is accepted by check_rows and written."""
    relay = DecodeFutureMap("cpu", POOL)
    value = torch.nn.Parameter(torch.tensor([5, 6]), requires_grad=False)
    relay.stash(slots(1, 2), DecodePayload(next_token_ids=value))
    assert relay.output_tokens_buf[1:3].tolist() == [5, 6]


# -- Note [Bare CPU fence] ---------------------------------------------------------------------


def test_a_debug_off_cpu_map_records_and_waits_on_the_bare_event() -> None:
    """After the first publish, the fence's record and wait are the CpuEvent's own
    methods; no event exists before it; debug mode keeps the chained Fence."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    assert isinstance(relay._fence, CpuFence) and not relay._fence.created
    relay.publish(slots(1), torch.tensor([4]))
    record, wait = relay._fence.record, relay._fence.wait
    assert isinstance(record.__self__, CpuEvent)  # type: ignore[attr-defined]
    assert record.__func__ is CpuEvent.record  # type: ignore[attr-defined]
    assert wait.__func__ is CpuEvent.synchronize  # type: ignore[attr-defined]
    batch = Batch(req_pool_indices=slots(1))
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_sum == 4
    assert type(EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)._fence) is Fence


def test_a_registered_cpu_policy_keeps_the_policy_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CPU device whose policy is not the stock CpuPolicy gets Fence, which calls it."""
    calls: list[str] = []

    class Logged(CpuPolicy):
        def record(self, event: Any, stream: Any) -> None:
            calls.append("record")
            super().record(event, stream)

    monkeypatch.setattr(device_module, "_POLICIES", {})
    monkeypatch.setitem(device_module._FACTORIES, "cpu", lambda device: Logged())
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    relay.publish(slots(1), torch.tensor([4]))
    assert type(relay._fence) is Fence and calls == ["record"]


def test_publishes_from_two_streams_are_both_waited_for() -> None:
    """Two thread streams publish (the second queued behind a gate the first opens); the
    host's resolve waits for both: chaining is the CpuEvent's own."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    gate = threading.Event()
    with thread_streams("forward", "draft") as (forward, draft):
        draft.submit(gated(gate, lambda: relay.publish(slots(2), torch.tensor([6]))))

        def first() -> None:
            relay.publish(slots(1), torch.tensor([4]))
            gate.set()

        forward.submit(first)
        batch = Batch(req_pool_indices=slots(1, 2))
        relay.resolve_seq_lens_cpu(batch)
        assert batch.seq_lens.tolist() == [4, 6] and batch.seq_lens_sum == 10
