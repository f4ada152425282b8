"""Debug mode (``debug=True``): poisoned buffers, consume-once resolves, fence freshness,
slot checks, generation stamps and stream order; and that none of it fires when off."""

from __future__ import annotations

import math

import pytest
import torch
from relay_runtime_support import batch_of, eagle_payload, slots, thread_streams

from relay import RelayDebugError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.eagle import EagleFutureMap
from relay.maps.eagle_confidence import EagleConfidenceFutureMap, EagleConfidencePayload
from relay.maps.eagle_dsa import EagleDsaFutureMap, EagleDsaPayload

POOL = 9
TOPK = 2


def test_buffers_start_poisoned() -> None:
    """Eager buffers start at -1 (ints) or NaN (floats), so an unwritten row is visible."""
    relay = EagleConfidenceFutureMap("cpu", POOL, topk=TOPK, draft_tokens=3, debug=True)
    for buf in (relay.output_tokens_buf, relay.topk_index_buf, relay.new_seq_lens_buf):
        assert bool((buf == -1).all())
    for buf in (relay.topk_p_buf, relay.draft_confidence_buf):
        assert bool(torch.isnan(buf).all())


def test_lazy_buffers_start_poisoned_outside_the_stashed_rows() -> None:
    """A lazily allocated buffer is poisoned too, except the rows its first payload wrote."""
    relay = EagleDsaFutureMap("cpu", POOL, topk=1, debug=True)
    relay.stash(
        slots(2),
        EagleDsaPayload(
            bonus_tokens=torch.tensor([1]), topk_p=torch.rand(1, 1), topk_index=torch.zeros(1, 1),
            hidden_states=torch.ones(1, 4, dtype=torch.bfloat16),
            dsa_topk_indices=torch.tensor([[3, 4]], dtype=torch.int32),
        ),
    )
    assert relay.dsa_topk_indices_buf is not None and relay.hidden_states_buf is not None
    assert relay.dsa_topk_indices_buf[2].tolist() == [3, 4]
    assert bool((relay.dsa_topk_indices_buf[[0, 1, 3]] == -1).all())
    assert bool(torch.isnan(relay.hidden_states_buf[[0, 1, 3]]).all())


def test_resolve_future_consumes_each_value_once() -> None:
    """A resolve returns the stash and poisons the rows; a second resolve without a stash raises."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    payload = eagle_payload(2, TOPK, base=3)
    relay.stash(slots(4, 6), payload)
    batch = batch_of(6, 4)
    relay.invalidate(batch, batch.req_pool_indices)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [4, 3]
    assert torch.equal(batch.spec_info.topk_p, payload.topk_p[[1, 0]])
    assert relay.output_tokens_buf[[4, 6]].tolist() == [-1, -1]
    assert bool(torch.isnan(relay.topk_p_buf[[4, 6]]).all())
    assert bool((relay.topk_index_buf[[4, 6]] == -1).all())

    again = batch_of(6, 4)
    relay.invalidate(again, again.req_pool_indices)
    with pytest.raises(RuntimeError, match=r"EagleFutureMap\.output_tokens.*not written"):
        relay.resolve_future(again)


def test_gather_field_read_twice_is_caught() -> None:
    """A gather target read twice is caught too, naming its field."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay.stash(slots(1), eagle_payload(1, TOPK, base=1))
    first = batch_of(1)
    relay.invalidate(first, first.req_pool_indices)
    relay.resolve_future(first)
    batch = batch_of(1)
    batch.input_ids = torch.tensor([5])  # a real token: the placeholder lane is not read
    with pytest.raises(RuntimeError, match=r"EagleFutureMap\.topk_p.*not written"):
        relay.resolve_future(batch)


def test_resolve_future_before_any_stash_is_caught() -> None:
    """Reading a slot that nothing stashed into fails instead of returning zeros."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    batch = batch_of(3)
    relay.invalidate(batch, batch.req_pool_indices)
    with pytest.raises(RuntimeError, match=r"DecodeFutureMap\.output_tokens"):
        relay.resolve_future(batch)


def test_real_tokens_in_a_mixed_batch_are_not_checked_as_reads() -> None:
    """Positions holding real tokens read nothing, so they pass the consume-once check."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(slots(2), DecodePayload(next_token_ids=torch.tensor([0])))
    batch = batch_of(1, 2, 3)
    batch.input_ids = torch.tensor([7, -2, 0])
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [7, 0, 0]
    again = batch_of(1, 2, 3)
    again.input_ids = torch.tensor([7, 8, 0])
    relay.resolve_future(again)  # only real tokens: nothing consumed, nothing raised
    assert again.input_ids.tolist() == [7, 8, 0]


def test_schedule_lane_value_is_consumed_once() -> None:
    """resolve_seq_lens_cpu poisons the rows it read, so stale lengths cannot be read again."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.publish(slots(1, 2), torch.tensor([10, 20]))
    batch = batch_of(2, 1)
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu.tolist() == [20, 10] and batch.seq_lens_sum == 30
    assert relay.new_seq_lens_buf[[1, 2]].tolist() == [-1, -1]
    relay.publish(slots(1), torch.tensor([11]))
    with pytest.raises(RuntimeError, match=r"DecodeFutureMap\.new_seq_lens"):
        relay.resolve_seq_lens_cpu(batch_of(1, 2))  # slot 2 was not published again


def test_resolve_seq_lens_cpu_without_a_publish_is_a_debug_error() -> None:
    """A schedule-side resolve with no publish before it raises RelayDebugError (stale fence)."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    with pytest.raises(RelayDebugError, match=r"DecodeFutureMap\.resolve_seq_lens_cpu.*publish"):
        relay.resolve_seq_lens_cpu(batch_of(1))


def test_second_wait_without_a_new_publish_is_a_debug_error() -> None:
    """Each publish allows one wait per consumer; the next wait needs a new publish."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.publish(slots(1), torch.tensor([3]))
    relay.resolve_seq_lens_cpu(batch_of(1))
    with pytest.raises(RelayDebugError, match="no publish since the last wait"):
        relay.resolve_seq_lens_cpu(batch_of(1))
    relay.publish(slots(1), torch.tensor([4]))
    batch = batch_of(1)
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu.tolist() == [4]


def test_fence_freshness_is_tracked_per_consumer() -> None:
    """One publish lets each schedule-side resolve wait once, independently."""
    relay = EagleConfidenceFutureMap("cpu", POOL, topk=1, draft_tokens=2, debug=True)
    relay.publish(slots(1), torch.tensor([5]), torch.tensor([[0.5, 0.25]]))
    batch = batch_of(1)
    relay.resolve_draft_confidence_cpu(batch)
    relay.resolve_seq_lens_cpu(batch)
    assert batch.draft_confidence_cpu.tolist() == [[0.5, 0.25]] and batch.seq_lens_sum == 5
    with pytest.raises(RelayDebugError, match="resolve_draft_confidence_cpu"):
        relay.resolve_draft_confidence_cpu(batch)


def test_invalidate_with_the_scratch_slot_is_caught() -> None:
    """Slot 0 would give placeholder 0, indistinguishable from token 0: debug mode refuses it."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    batch = batch_of(0, 3)
    with pytest.raises(RuntimeError, match=r"DecodeFutureMap\.invalidate.*>= 1"):
        relay.invalidate(batch, batch.req_pool_indices)


def test_slot_released_between_stash_and_resolve_is_caught() -> None:
    """A slot whose request ended (release) and was reused cannot read the old request's value."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(slots(3), DecodePayload(next_token_ids=torch.tensor([9])))
    relay.release(slots(3))
    batch = batch_of(3)
    relay.invalidate(batch, batch.req_pool_indices)
    with pytest.raises(RuntimeError, match="released and reused"):
        relay.resolve_future(batch)


def test_stash_after_release_is_read_normally() -> None:
    """A stash made after the release belongs to the new request and resolves fine."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(slots(3), DecodePayload(next_token_ids=torch.tensor([9])))
    relay.release(slots(3))
    relay.stash(slots(3), DecodePayload(next_token_ids=torch.tensor([10])))
    batch = batch_of(3)
    relay.invalidate(batch, batch.req_pool_indices)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [10]


def test_forward_lane_read_on_another_stream_is_caught() -> None:
    """resolve_future on a different stream than the stash is a debug error (no fence there)."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    with thread_streams("fwd") as (stream,):
        stream.submit(lambda: relay.stash(slots(1), DecodePayload(next_token_ids=torch.tensor([2]))))
        stream.synchronize()
    batch = batch_of(1)
    relay.invalidate(batch, batch.req_pool_indices)
    with pytest.raises(RelayDebugError, match=r"resolve_future.*stream"):
        relay.resolve_future(batch)


def test_debug_off_checks_nothing_and_values_can_be_re_read() -> None:
    """Without debug, buffers start at zero, values can be read twice and no check fires."""
    relay = EagleConfidenceFutureMap("cpu", POOL, topk=1, draft_tokens=1)
    assert bool((relay.output_tokens_buf == 0).all())
    assert not any(math.isnan(v) for v in relay.topk_p_buf.flatten().tolist())
    relay.resolve_seq_lens_cpu(batch_of(1))  # no publish yet: no freshness check
    relay.stash(
        slots(1),
        EagleConfidencePayload(
            bonus_tokens=torch.tensor([6]), topk_p=torch.rand(1, 1), topk_index=torch.zeros(1, 1)
        ),
    )
    for _ in range(2):
        batch = batch_of(1)
        relay.invalidate(batch, batch.req_pool_indices)
        relay.resolve_future(batch)
        assert batch.input_ids.tolist() == [6]
    relay.publish(slots(1), torch.tensor([8]), torch.tensor([[0.5]]))
    for _ in range(2):
        batch = batch_of(1)
        relay.resolve_seq_lens_cpu(batch)
        assert batch.seq_lens_sum == 8
    relay.release(slots(1))
    relay.resolve_future(batch_of(1))  # slot reuse is not checked either
    zero = batch_of(0)
    relay.invalidate(zero, zero.req_pool_indices)
    assert zero.input_ids.tolist() == [0]


def test_debug_off_allocates_no_debug_state() -> None:
    """Debug mode is free when off: no generation stamps are allocated by a normal step."""
    relay = DecodeFutureMap("cpu", POOL)
    relay.stash(slots(1), DecodePayload(next_token_ids=torch.tensor([2])))
    relay.publish(slots(1), torch.tensor([2]))
    relay.resolve_future(batch_of(1))
    relay.resolve_seq_lens_cpu(batch_of(1))
    relay.release(slots(1))
    assert relay._debug._generation is None and relay._debug._stamps == {}


def test_debug_resolve_future_with_an_empty_placeholder_target() -> None:
    """Debug mode resolves a batch whose placeholder target holds nothing, like debug off."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay.stash(slots(1), eagle_payload(1, TOPK, base=1))
    batch = batch_of(1)
    batch.input_ids = torch.empty(0, dtype=torch.int64)
    relay.resolve_future(batch)
    assert batch.input_ids.numel() == 0
    assert batch.spec_info.topk_index.tolist() == [[1, 2]]


def test_forward_lane_read_on_the_stashing_stream_is_allowed() -> None:
    """Stash and resolve_future on the same ThreadStream pass the stream-order check."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    batch = batch_of(1)
    with thread_streams("fwd") as (stream,):
        stream.submit(lambda: relay.stash(slots(1), DecodePayload(next_token_ids=torch.tensor([2]))))
        relay.invalidate(batch, batch.req_pool_indices)
        stream.submit(lambda: relay.resolve_future(batch))
        stream.synchronize()
    assert batch.input_ids.tolist() == [2]


def test_slot_released_between_publish_and_schedule_resolve_is_caught() -> None:
    """The generation check covers the schedule lane too: a released slot's length is stale."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.publish(slots(2), torch.tensor([6]))
    relay.release(slots(2))
    with pytest.raises(RuntimeError, match="released and reused"):
        relay.resolve_seq_lens_cpu(batch_of(2))
