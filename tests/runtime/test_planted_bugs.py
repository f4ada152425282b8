"""Planted bugs: one small driver per class of relay misuse, each with the bug planted, and
debug mode reporting it clearly (field, slot, operations, streams). Where a driver plants
an ordering bug, the same driver without the plant runs clean, so the report is the bug's.
Every test runs with threads free and in each of 20 seeded schedules (Note [Seeded
schedules] in relay/cpu_stream.py)."""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from relay_runtime_support import GUARD_S, thread_streams
from schedule_support import SEEDS, replaying, seed_id

from relay import RelayDebugError, RelayError
from relay.cpu_stream import Gate, ThreadStream
from relay.debug import check_resolved
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.eagle import EagleFutureMap, EaglePayload
from relay.schema import Field, Lane, Resolve, Schema
from relay.testing import Namespace, load_map_class

# The ordering checks need the clocks, which an engine installs (a debug map does not).
pytestmark = pytest.mark.usefixtures("clocks_on", "schedule")


@pytest.fixture(params=[None, *SEEDS], ids=seed_id)
def schedule(request: pytest.FixtureRequest) -> Iterator[None]:
    """The test run with threads free, then in each seeded schedule (a failure's
    captured output names the seed)."""
    with replaying(request.param):
        if request.param is not None:
            print(f"seeded schedule {request.param}")
        yield


POOL = 9
TOPK = 2


def slots(*values: int) -> torch.Tensor:
    """An int64 index tensor of request-pool slots."""
    return torch.tensor(values, dtype=torch.int64)


def batch(*values: int) -> Namespace:
    """A batch of the given slots, with a ``spec_info`` to resolve into."""
    return Namespace(req_pool_indices=slots(*values), spec_info=Namespace())


def eagle_payload(n: int, *, hidden: bool = True) -> EaglePayload:
    """An EAGLE payload for ``n`` requests, hidden states carried or left out."""
    return EaglePayload(
        bonus_tokens=torch.arange(1, n + 1),
        topk_p=torch.full((n, TOPK), 0.5),
        topk_index=torch.ones(n, TOPK, dtype=torch.int64),
        hidden_states=torch.ones(n, 4) if hidden else None,
    )


def tokens(*values: int) -> DecodePayload:
    """A decode payload of the given tokens."""
    return DecodePayload(next_token_ids=torch.tensor(values))


def on(stream: ThreadStream, fn: Callable[[], None]) -> Gate:
    """Queue ``fn`` on ``stream``; the returned gate opens once it ran. The gate orders
    nothing as far as the checker can tell (a seeded schedule sees it as a wait)."""
    done = Gate()

    def task() -> None:
        try:
            fn()
        finally:
            done.set()

    stream.submit(task)
    return done


@contextmanager
def ran(stream: ThreadStream, fn: Callable[[], None]) -> Iterator[None]:
    """``fn`` has run on ``stream`` inside the block (waited for on an unseen gate)."""
    assert on(stream, fn).wait(GUARD_S), "the task never ran"
    yield


def test_resolve_with_no_stash() -> None:
    """A resolve of a slot nothing stashed names the field, the slot and the cause."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    with pytest.raises(
        RelayDebugError,
        match=r"DecodeFutureMap\.output_tokens: slot 4: resolve_future reads a row that was never written",
    ):
        relay.resolve_future(batch(4))


def test_slot_reused_between_stash_and_resolve() -> None:
    """The request in slot 2 ended and the slot went to a new one before the resolve."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(slots(2), tokens(7))
    relay.release(slots(2))
    with pytest.raises(
        RelayDebugError,
        match=r"slot 2: resolve_future: the slot was released and reused",
    ):
        relay.resolve_future(batch(2))


def _publish_then_resolve(relay: EagleFutureMap) -> None:
    with thread_streams("forward") as (forward,):
        with ran(forward, lambda: relay.publish(slots(3), torch.tensor([5]))):
            relay.resolve_seq_lens_cpu(batch(3))


def test_schedule_side_read_with_no_fence_wait() -> None:
    """A schedule resolve whose fence wait is missing reads rows the forward stream wrote
    with nothing ordering it after them: reported naming both streams."""
    _publish_then_resolve(EagleFutureMap("cpu", POOL, topk=TOPK, debug=True))  # clean
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay._state.fence.wait = lambda: None  # type: ignore[method-assign]  # the planted bug
    with pytest.raises(
        RelayDebugError,
        match=r"new_seq_lens: slot 3: resolve_seq_lens_cpu on host thread .* reads the value "
        r"publish wrote on ThreadStream\('forward'\), but nothing orders the read",
    ):
        _publish_then_resolve(relay)


def _unchained_record(relay: Any) -> Callable[[], None]:
    """The fence's record without Note [Fence chaining]: the bug of sglang #30435."""
    fence = relay._state.fence

    def record() -> None:
        policy = fence._policy
        stream = policy.current_stream()
        event = fence._event if fence._event is not None else fence._get_event()
        policy.record(event, stream)
        fence._stream, fence._recorded = stream, True

    return record


def _publish_from_two_streams(relay: EagleFutureMap) -> None:
    with thread_streams("forward", "draft") as (forward, draft):
        with ran(forward, lambda: relay.publish(slots(1), torch.tensor([4]))):
            with ran(draft, lambda: relay.publish(slots(2), torch.tensor([6]))):
                b = batch(1, 2)
                relay.resolve_seq_lens_cpu(b)
                assert b.seq_lens.tolist() == [4, 6]


def test_a_second_publishing_stream_without_chaining() -> None:
    """Two streams publish; the fence forgets the first record: its rows are unordered."""
    _publish_from_two_streams(
        EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    )  # chained
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay._state.fence.record = _unchained_record(relay)  # type: ignore[method-assign]
    with pytest.raises(
        RelayDebugError,
        match=r"new_seq_lens: slot 1: resolve_seq_lens_cpu .* publish wrote on "
        r"ThreadStream\('forward'\), but nothing orders the read",
    ):
        _publish_from_two_streams(relay)


def test_a_placeholder_reaching_a_host_consumer() -> None:
    """Host code reading a placeholder target before the resolve sees ``-slot``: check_resolved
    names the position and the slot; after resolve_future the same check passes."""
    schema = Schema(
        name="PlaceholderFutureMap",
        fields=[
            Field(
                "output_tokens",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                source="tokens",
                target="input_ids",
                resolve=Resolve.PLACEHOLDER,
            ),
        ],
    )
    cls = load_map_class(schema)
    relay = cls("cpu", POOL, debug=True)
    payload_cls = typing.get_type_hints(cls.stash)["payload"]
    relay.stash(slots(2, 5), payload_cls(tokens=torch.tensor([11, 12])))
    b = batch(2, 5)
    relay.invalidate(b, b.req_pool_indices)
    with pytest.raises(
        RelayDebugError,
        match=r"repetition penalty: position 0 holds the placeholder -2 \(slot 2\)",
    ):
        check_resolved(b.input_ids, "repetition penalty")  # the planted host read
    relay.resolve_future(b)
    check_resolved(b.input_ids, "repetition penalty")
    assert b.input_ids.tolist() == [11, 12]


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        (
            {"bonus_tokens": torch.tensor([1.5])},
            r"EagleFutureMap\.output_tokens: got torch\.float32 values for a torch\.int64 field",
        ),
        (
            {"topk_p": torch.zeros(1, TOPK + 1)},
            r"EagleFutureMap\.topk_p: got a tensor of shape \(1, 3\) for 1 slot",
        ),
    ],
)
def test_wrong_dtype_or_row_shape(mistake: dict[str, torch.Tensor], match: str) -> None:
    """A payload of the wrong dtype or row shape is refused before any field is written."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    good = eagle_payload(1)
    fields = {
        name: getattr(good, name)
        for name in ("bonus_tokens", "topk_p", "topk_index", "hidden_states")
    }
    with pytest.raises(RelayError, match=match):
        relay.stash(slots(3), EaglePayload(**{**fields, **mistake}))
    with pytest.raises(
        RelayDebugError,
        match="slot 3: resolve_future reads a row that was never written",
    ):
        relay.resolve_future(batch(3))  # nothing of the refused stash was written


@pytest.mark.parametrize("bad", [POOL, -1])
def test_an_index_outside_the_pool(bad: int) -> None:
    """A slot >= pool_size or negative is refused before any write, naming the slot."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    with pytest.raises(
        RelayDebugError,
        match=rf"DecodeFutureMap\.stash: slots must be in \[0, {POOL}\); slot {bad} at position 1 is not",
    ):
        relay.stash(slots(3, bad), tokens(1, 2))
    assert relay.output_tokens_buf[3].item() == -1  # still the poison: nothing written


def test_an_empty_batch_touching_lazy_allocation() -> None:
    """An idle rank hands zero slots with a one-row dummy payload: refused, and the lazy
    buffer is not allocated from it; a truly empty payload is a no-op."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    with pytest.raises(
        RelayError, match=r"got a tensor of shape \(1,\) for 0 slot\(s\)"
    ):
        relay.stash(slots(), eagle_payload(1))
    relay.stash(slots(), eagle_payload(0))
    assert relay.hidden_states_buf is None


def test_two_unordered_stashing_streams() -> None:
    """Two streams stash slot 4 with nothing ordering them: a write-write race, reported."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    errors: list[BaseException] = []

    def second_stash() -> None:
        try:
            relay.stash(slots(4), tokens(2))
        except RelayDebugError as error:
            errors.append(error)

    with thread_streams("forward", "other") as (forward, other):
        with ran(forward, lambda: relay.stash(slots(4), tokens(1))):
            with ran(other, second_stash):
                pass
    assert len(errors) == 1, "the race was not reported"
    assert (
        "DecodeFutureMap.output_tokens: slot 4: stash on ThreadStream('other') overwrites the "
        "value stash wrote on ThreadStream('forward'), and nothing orders the two writes"
    ) in str(errors[0])


def test_an_optional_field_omitted_then_read() -> None:
    """Slot 1's latest stash left hidden states out; a later stash carried them for slot 2;
    a resolve of both would hand slot 1 a value it never got: reported."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay.stash(slots(1), eagle_payload(1, hidden=False))
    relay.stash(slots(2), eagle_payload(1, hidden=True))
    with pytest.raises(
        RelayDebugError,
        match=r"EagleFutureMap\.hidden_states: slot 1: resolve_future reads the optional field, "
        r"but the latest stash of this slot left it out",
    ):
        relay.resolve_future(batch(1, 2))


# -- with no gates: the schedule alone picks the order ---------------------------------


def _publish_from_two_streams_at_will(relay: EagleFutureMap) -> list[str]:
    """Both streams publish, in whichever order the threads run; the host waits on the
    fence and resolves both slots. Returns the streams in the order they published."""
    order: list[str] = []

    def publish(name: str, slot: int, length: int) -> None:
        relay.publish(slots(slot), torch.tensor([length]))
        order.append(name)

    with thread_streams("forward", "draft") as (forward, draft):
        forward.submit(lambda: publish("forward", 1, 4))
        draft.submit(lambda: publish("draft", 2, 6))
        b = batch(1, 2)
        relay.resolve_seq_lens_cpu(b)
        assert b.seq_lens.tolist() == [4, 6]
    return order


def test_two_publishing_streams_in_any_order() -> None:
    """Two streams publish in the order the schedule picks, the chain wait planted out:
    the record the fence forgot is reported, whichever stream it was. (The chained
    fence runs clean only where the streams publish in host order:
    tests/runtime/test_seeded_schedules.py, a known issue of ``Fence.record``.)"""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay._state.fence.record = _unchained_record(relay)  # type: ignore[method-assign]
    with pytest.raises(
        RelayDebugError,
        match=r"new_seq_lens: slot [12]: resolve_seq_lens_cpu .* publish wrote on "
        r"ThreadStream\('(forward|draft)'\), but nothing orders the read",
    ):
        _publish_from_two_streams_at_will(relay)


def test_two_unordered_stashing_streams_in_any_order() -> None:
    """Two streams stash slot 4 in the order the schedule picks: the second write is
    reported, whichever stream made it."""
    relay = DecodeFutureMap("cpu", POOL, debug=True)
    errors: list[BaseException] = []

    def stash(value: int) -> None:
        try:
            relay.stash(slots(4), tokens(value))
        except RelayDebugError as error:
            errors.append(error)

    with thread_streams("forward", "other") as (forward, other):
        forward.submit(lambda: stash(1))
        other.submit(lambda: stash(2))
        forward.synchronize()
        other.synchronize()
    assert len(errors) == 1, "the race was not reported"
    assert re.search(
        r"slot 4: stash on ThreadStream\('(forward|other)'\) overwrites the value stash "
        r"wrote on ThreadStream\('(forward|other)'\), and nothing orders the two writes",
        str(errors[0]),
    ), errors[0]
