"""Debug mode (``debug=True``) through the generated maps: poisoned buffers, consume-once
resolves with the state kept apart from the values, fence freshness, slot checks,
generation stamps and stream order; and that none of it runs when off."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from debug_support import (
    batch,
    payload_of,
    placeholder_map_class,
    slots,
)
from relay_runtime_support import GUARD_S, thread_streams

from relay import RelayDebugError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.eagle import EagleFutureMap, EaglePayload
from relay.testing import Namespace

# The ordering checks need the clocks, which an engine installs (a debug map does not).
pytestmark = pytest.mark.usefixtures("clocks_on")

POOL = 9
TOPK = 2


def eagle_payload(
    n: int, *, base: int = 1, hidden: torch.Tensor | None = None
) -> EaglePayload:
    """A distinguishable EAGLE payload for ``n`` requests (values grow from ``base``)."""
    return EaglePayload(
        bonus_tokens=torch.arange(base, base + n),
        topk_p=torch.arange(n * TOPK, dtype=torch.float32).reshape(n, TOPK) / 100
        + base,
        topk_index=torch.arange(n * TOPK).reshape(n, TOPK) + base,
        hidden_states=hidden,
    )


def seq_lens_map(debug: bool = True) -> object:
    """The bundled map with a schedule lane of lengths (``decode_seq_lens``)."""
    module = pytest.importorskip("relay.maps.decode_seq_lens")
    return module.DecodeSeqLensFutureMap("cpu", POOL, debug=debug)


def test_buffers_start_poisoned() -> None:
    """Eager buffers start at -1 (ints) or NaN (floats), so a stray read looks wrong."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    assert bool((relay.output_tokens_buf == -1).all()) and bool(
        (relay.topk_index_buf == -1).all()
    )
    assert bool(torch.isnan(relay.topk_p_buf).all())


def test_rows_read_are_poisoned_again() -> None:
    """A resolve hands over the stash, then fills the rows it consumed with the poison."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    payload = eagle_payload(2, base=3)
    relay.stash(slots(4, 6), payload)
    b = batch(6, 4)
    relay.resolve_future(b)
    assert b.spec_info.bonus_tokens.tolist() == [4, 3]
    assert torch.equal(b.spec_info.topk_p, payload.topk_p[[1, 0]])
    assert relay.output_tokens_buf[[4, 6]].tolist() == [-1, -1]
    assert bool(torch.isnan(relay.topk_p_buf[[4, 6]]).all())


def test_a_value_is_consumed_once() -> None:
    """A second resolve of the same stash names the field, the slot and the cause."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay.stash(slots(1), eagle_payload(1))
    relay.resolve_future(batch(1))
    with pytest.raises(
        RelayDebugError,
        match=r"EagleFutureMap\.output_tokens: slot 1: resolve_future reads a row that was not "
        r"written since it was last consumed",
    ):
        relay.resolve_future(batch(1))


def test_values_equal_to_the_poison_are_handed_over() -> None:
    """NaN in a float payload and -1 in an unguarded int field are legal values, not reports."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    payload = eagle_payload(1)
    nan_p = EaglePayload(
        bonus_tokens=payload.bonus_tokens,
        topk_p=torch.full((1, TOPK), math.nan),
        topk_index=payload.topk_index,
        hidden_states=torch.full((1, 3), -1.0),
    )
    relay.stash(slots(2), nan_p)
    b = batch(2)
    relay.resolve_future(b)
    assert bool(torch.isnan(b.spec_info.topk_p).all())
    assert b.spec_info.hidden_states.tolist() == [[-1.0, -1.0, -1.0]]


def test_int32_indices_work_in_debug_mode() -> None:
    """int32 slots stash, resolve and are checked like int64 ones."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(
        slots(3, 5, dtype=torch.int32),
        DecodePayload(next_token_ids=torch.tensor([7, 8])),
    )
    b = batch(5, 3)
    b.req_pool_indices = b.req_pool_indices.int()
    relay.resolve_future(b)
    assert b.input_ids.tolist() == [8, 7]
    with pytest.raises(RelayDebugError, match="slot 5"):
        relay.resolve_future(b)


def test_a_slot_twice_in_one_stash_is_reported() -> None:
    """Last-write-wins on a repeated slot would drop a request's value: reported, nothing written."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    with pytest.raises(
        RelayDebugError, match=r"DecodeFutureMap\.stash: slot 2 appears twice"
    ):
        relay.stash(slots(2, 2), DecodePayload(next_token_ids=torch.tensor([1, 2])))
    assert relay.output_tokens_buf[2].item() == -1


def test_schedule_lane_value_is_consumed_once() -> None:
    """resolve_seq_lens_cpu poisons the rows it read, so stale lengths cannot be read again."""
    relay = seq_lens_map()
    relay.publish(slots(1, 2), torch.tensor([10, 20]))  # type: ignore[attr-defined]
    b = batch(2, 1)
    relay.resolve_seq_lens_cpu(b)  # type: ignore[attr-defined]
    assert b.seq_lens_cpu.tolist() == [20, 10] and b.seq_lens_sum == 30
    relay.publish(slots(1), torch.tensor([11]))  # type: ignore[attr-defined]
    with pytest.raises(
        RelayDebugError, match=r"new_seq_lens: slot 2: .*not written since"
    ):
        relay.resolve_seq_lens_cpu(batch(1, 2))  # type: ignore[attr-defined]


def test_a_schedule_resolve_without_a_publish_is_a_debug_error() -> None:
    """A schedule-side resolve with no publish before it: the fence is stale."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    with pytest.raises(
        RelayDebugError,
        match=r"EagleFutureMap\.resolve_seq_lens_cpu: fence waited on with no publish",
    ):
        relay.resolve_seq_lens_cpu(batch(1))


def test_each_publish_allows_one_wait_per_consumer() -> None:
    """The next wait needs a new publish; each schedule resolve waits independently."""
    from relay.maps.eagle_confidence import EagleConfidenceFutureMap

    relay = EagleConfidenceFutureMap("cpu", POOL, topk=1, draft_tokens=2, debug=True)
    relay.publish(slots(1), torch.tensor([5]), torch.tensor([[0.5, 0.25]]))
    b = batch(1)
    relay.resolve_draft_confidence_cpu(b)  # type: ignore[arg-type]
    relay.resolve_seq_lens_cpu(b)  # type: ignore[arg-type]
    assert b.seq_lens_sum == 5
    with pytest.raises(
        RelayDebugError,
        match="resolve_draft_confidence_cpu: fence waited on with no publish since the last wait",
    ):
        relay.resolve_draft_confidence_cpu(b)  # type: ignore[arg-type]


def test_fence_freshness_is_kept_per_consumer() -> None:
    """One consumer waiting twice on one publish is stale even while the other has not
    waited yet: freshness is each reader's own, not a count of waits per publish."""
    from relay.maps.eagle_confidence import EagleConfidenceFutureMap

    relay = EagleConfidenceFutureMap("cpu", POOL, topk=1, draft_tokens=2, debug=True)
    relay.publish(slots(1, 2), torch.tensor([5, 6]), torch.tensor([[0.5, 0.25]] * 2))
    relay.resolve_seq_lens_cpu(batch(1))  # type: ignore[arg-type]
    with pytest.raises(
        RelayDebugError,
        match="resolve_seq_lens_cpu: fence waited on with no publish since the last wait",
    ):
        relay.resolve_seq_lens_cpu(batch(2))  # type: ignore[arg-type]
    b = batch(1)
    relay.resolve_draft_confidence_cpu(b)  # type: ignore[arg-type]
    assert b.draft_confidence_cpu.tolist() == [[0.5, 0.25]]


def test_a_resolve_under_a_skipped_optional_parent_consumes_nothing() -> None:
    """A prefill batch of the n-gram map has ``spec_info=None``: the resolve leaves the
    fields under it alone, and debug mode must not count it as a read, so the next
    resolve of the same slots, with a ``spec_info``, still takes the values."""
    from relay.maps.ngram import NgramFutureMap, NgramPayload

    relay = NgramFutureMap("cpu", POOL, draft_token_num=2, debug=True)
    relay.stash(
        slots(3, 4),
        NgramPayload(
            bonus_tokens=torch.tensor([11, 12]),
            accept_tokens=torch.tensor([[1, 2], [3, 4]]),
            accept_lens=torch.tensor([2, 1], dtype=torch.int32),
        ),
    )
    prefill = Namespace(req_pool_indices=slots(3, 4), spec_info=None, rids=[7, 8])
    relay.resolve_future(prefill)  # type: ignore[arg-type]
    assert prefill.spec_info is None
    b = batch(3, 4)
    b.rids = [7, 8]
    # The packed layout of the accepted drafts: 2 then 1, placeholders where they go.
    info = b.spec_info
    info.accept_lens, info.accept_rows = torch.tensor([2, 1]), torch.tensor([0, 2, 3])
    info.accept_starts = info.accept_rows[:2]
    info.accept_tokens = torch.tensor([-1, -1, -1, 0])
    relay.resolve_future(b)  # type: ignore[arg-type]
    assert b.spec_info.bonus_tokens.tolist() == [11, 12]
    assert b.spec_info.accept_tokens.tolist() == [1, 2, 3, 0]


def test_placeholder_positions_holding_real_tokens_are_not_reads() -> None:
    """In a mixed batch only placeholder positions consume; real tokens (0 included) stay."""
    cls = placeholder_map_class()
    relay = cls("cpu", POOL, debug=True)
    relay.stash(slots(2), payload_of(cls, tokens=torch.tensor([0])))
    b = batch(1, 2, 3)
    b.input_ids = torch.tensor([7, -2, 0])
    relay.resolve_future(b)
    assert b.input_ids.tolist() == [7, 0, 0]
    again = batch(1, 2, 3)
    again.input_ids = torch.tensor([7, 8, 0])
    relay.resolve_future(again)  # only real tokens: nothing consumed, nothing reported
    assert again.input_ids.tolist() == [7, 8, 0]


def test_invalidate_with_the_scratch_slot_is_caught() -> None:
    """Slot 0 would give placeholder 0, indistinguishable from token 0: refused."""
    relay = placeholder_map_class()("cpu", POOL, debug=True)
    b = batch(0, 3)
    with pytest.raises(
        RelayDebugError,
        match=r"invalidate: slots must be in \[1, 9\).*slot 0 at position 0 is not",
    ):
        relay.invalidate(b, b.req_pool_indices)


def test_a_slot_released_between_stash_and_resolve_is_caught() -> None:
    """The value of a slot's previous request is never handed to the next one."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(slots(3), DecodePayload(next_token_ids=torch.tensor([9])))
    relay.release(slots(3))
    with pytest.raises(RelayDebugError, match="released and reused"):
        relay.resolve_future(batch(3))


def test_a_stash_after_release_is_read_normally() -> None:
    """A stash made after the release belongs to the new request and resolves fine."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(slots(3), DecodePayload(next_token_ids=torch.tensor([9])))
    relay.release(slots(3))
    relay.stash(slots(3), DecodePayload(next_token_ids=torch.tensor([10])))
    b = batch(3)
    relay.resolve_future(b)
    assert b.input_ids.tolist() == [10]


def test_a_slot_released_between_publish_and_schedule_resolve_is_caught() -> None:
    """The generation check covers the schedule lane too."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay.publish(slots(2), torch.tensor([6]))
    relay.release(slots(2))
    with pytest.raises(RelayDebugError, match="released and reused"):
        relay.resolve_seq_lens_cpu(batch(2))


def test_a_forward_lane_read_not_ordered_after_its_stash_is_caught() -> None:
    """resolve_future on the host after a stash on a forward stream, with nothing but an
    unseen gate between them: the forward lane has no fence, so it is reported."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    stashed = threading.Event()

    def stash() -> None:
        relay.stash(slots(1), DecodePayload(next_token_ids=torch.tensor([2])))
        stashed.set()

    with thread_streams("fwd") as (stream,):
        stream.submit(stash)
        assert stashed.wait(GUARD_S)
        with pytest.raises(
            RelayDebugError,
            match=r"resolve_future on host thread .* ThreadStream\('fwd'\)",
        ):
            relay.resolve_future(batch(1))


def test_a_forward_lane_read_on_the_stashing_stream_is_allowed() -> None:
    """Stash and resolve_future on the same ThreadStream are ordered by the stream."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    b = batch(1)
    with thread_streams("fwd") as (stream,):
        stream.submit(
            lambda: relay.stash(
                slots(1), DecodePayload(next_token_ids=torch.tensor([2]))
            )
        )
        stream.submit(lambda: relay.resolve_future(b))
        stream.synchronize()
    assert b.input_ids.tolist() == [2]


def test_debug_off_checks_nothing_and_values_can_be_re_read() -> None:
    """Without debug, buffers start at zero, values can be read twice and no check fires."""
    relay = EagleFutureMap("cpu", POOL, topk=1)
    assert bool((relay.output_tokens_buf == 0).all())
    relay.resolve_seq_lens_cpu(batch(1))  # no publish yet: no freshness check
    relay.stash(
        slots(1),
        EaglePayload(
            bonus_tokens=torch.tensor([6]),
            topk_p=torch.rand(1, 1),
            topk_index=torch.zeros(1, 1, dtype=torch.int64),
        ),
    )
    for _ in range(2):
        b = batch(1)
        relay.resolve_future(b)
        assert b.spec_info.bonus_tokens.tolist() == [6]
    relay.release(slots(1))
    relay.resolve_future(batch(1))  # slot reuse is not checked either


def test_debug_off_allocates_no_debug_state() -> None:
    """Debug mode is free when off: the map holds no DebugChecks at all."""
    relay = DecodeFutureMap("cpu", POOL)
    relay.stash(slots(1), DecodePayload(next_token_ids=torch.tensor([2])))
    relay.resolve_future(batch(1))
    relay.release(slots(1))
    assert relay._state.debug is None
