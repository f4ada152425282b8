"""The debug-off common case (Note [One body], Note [Gathered slots] in runtime.py,
Note [Bare CPU fence]): whatever its gate lets through untested is refused on the
checked path, before any write, and the bare fence orders as the chained one."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import attrs
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
from relay import RelayError, runtime
from relay.cpu_stream import CpuEvent
from relay.device import CpuFence, CpuPolicy, Fence
from relay.errors import SlotError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.eagle import EagleFutureMap, EaglePayload

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
    """Slots made under inference_mode keep no version counter: never taken as they
    are past the gate's own host check."""
    relay = DecodeFutureMap("cpu", POOL)
    with torch.inference_mode():
        indices = torch.tensor([1, POOL + 3])
    with pytest.raises(IndexError):  # index_select refuses the gather itself
        resolved(relay, indices)
    with torch.inference_mode():
        good = torch.tensor([1, 2])
    resolved(relay, good)
    assert runtime.write_rows(relay, good) == (2,)  # read on the host: in the pool
    before = buffer_copies(relay)
    with pytest.raises(SlotError, match=r"^DecodeFutureMap\.stash: slot 12"):
        relay.stash(indices, DecodePayload(next_token_ids=slots(5, 6)))
    assert buffers_unchanged(relay, before)


def test_int32_gathered_slots_are_cast_on_every_write() -> None:
    """Int32 slots resolve_future gathered with are refused by the fast path's
    ``index_copy_`` before it writes; the checked path casts and checks them, and
    still refuses a bad later field with nothing written."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    indices = torch.tensor([3, 4], dtype=torch.int32)
    resolved(relay, indices)
    relay.stash(indices, eagle_payload(2, TOPK, base=7))
    assert relay.output_tokens_buf[3:5].tolist() == [7, 8]
    before = buffer_copies(relay)
    bad = attrs.evolve(eagle_payload(2, TOPK, base=9), topk_p=torch.ones(2, 1))
    with pytest.raises(RelayError, match=r"^EagleFutureMap\.topk_p: got a tensor"):
        relay.stash(indices, bad)
    assert buffers_unchanged(relay, before)


# -- Note [Fast writes] ------------------------------------------------------------------


def _eagle(n: int, **change: object) -> EaglePayload:
    """An EAGLE payload for ``n`` slots with the given fields replaced."""
    payload = eagle_payload(n, TOPK, base=5, hidden=torch.ones(n, 4))
    return attrs.evolve(payload, **change)


#: Payloads for slots (1, 2) (one slot where the case says so): what the steady state
#: (slots vouched for) must do exactly as the checked path does.
FAST_CASES: dict[str, tuple[int, Callable[[], EaglePayload]]] = {
    "accepted": (2, lambda: _eagle(2)),
    "first field cast from int32": (
        2,
        lambda: _eagle(2, bonus_tokens=torch.tensor([7, 8], dtype=torch.int32)),
    ),
    "later field cast from float64": (
        2,
        lambda: _eagle(2, topk_p=torch.ones(2, TOPK, dtype=torch.float64)),
    ),
    "hidden state omitted": (2, lambda: _eagle(2, hidden_states=None)),
    "first field 0-dim for one slot": (1, lambda: _eagle(1, bonus_tokens=slots(7)[0])),
    "first field a list": (2, lambda: _eagle(2, bonus_tokens=[7, 8])),
    "first field fractional floats": (
        2,
        lambda: _eagle(2, bonus_tokens=torch.tensor([7.5, 8.0])),
    ),
    "first field one row short": (2, lambda: _eagle(2, bonus_tokens=slots(7))),
    "later field (n, 1) for top-k 2": (2, lambda: _eagle(2, topk_p=torch.ones(2, 1))),
    "later field float into int": (
        2,
        lambda: _eagle(2, topk_index=torch.full((2, TOPK), 0.5)),
    ),
    "last field another width": (2, lambda: _eagle(2, hidden_states=torch.ones(2, 5))),
    "last field a tuple": (2, lambda: _eagle(2, hidden_states=(1.0, 2.0))),
}


def _outcome(relay: Any, indices: torch.Tensor, payload: EaglePayload) -> object:
    """What a stash did: the error message, or the buffers it left."""
    try:
        relay.stash(indices, payload)
    except RelayError as error:
        return str(error)
    return {k: v.tolist() for k, v in buffer_copies(relay).items()}


@pytest.mark.parametrize("case", sorted(FAST_CASES))
def test_the_fast_path_does_what_the_checked_path_does(case: str) -> None:
    """With slots resolve_future vouched for, a stash accepts, casts or refuses (with
    the same message, nothing written) exactly as with slots it did not: a refused
    later field never follows a written first one."""
    n, make = FAST_CASES[case]
    outcomes = []
    for vouched in (True, False):
        relay = EagleFutureMap("cpu", POOL, topk=TOPK)
        relay.stash(slots(1, 2, 3), eagle_payload(3, TOPK, hidden=torch.zeros(3, 4)))
        indices = slots(*range(1, n + 1))
        resolved(relay, indices if vouched else slots(*range(1, n + 1)))
        assert (relay._gathered is indices) is vouched
        before = buffer_copies(relay)
        outcome = _outcome(relay, indices, make())
        if isinstance(outcome, str):
            assert buffers_unchanged(relay, before), outcome
        outcomes.append(outcome)
    assert outcomes[0] == outcomes[1]


def test_a_refused_publish_on_vouched_slots_writes_nothing() -> None:
    """publish's fast path: a (n, 1) value is refused as the checked path refuses it."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    indices = slots(1, 2)
    resolved(relay, indices)
    before = buffer_copies(relay)
    with pytest.raises(
        RelayError, match=r"^EagleFutureMap\.new_seq_lens: got a tensor"
    ):
        relay.publish(indices, torch.tensor([[4], [5]]))
    assert buffers_unchanged(relay, before) and not relay._fence.created
    relay.publish(indices, torch.tensor([4, 5]))
    assert relay.new_seq_lens_buf[1:3].tolist() == [4, 5] and relay._fence.created


def _lines_run(call: Callable[[], None], code: Any) -> set[int]:
    """The line numbers of ``code`` that ``call`` runs."""
    lines: set[int] = set()

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not code:
            return None
        if event == "line":
            lines.add(frame.f_lineno)
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return lines


@pytest.mark.parametrize("relay_map", ["decode", "eagle"])
def test_the_steady_state_write_takes_the_common_case(
    relay_map: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stash with the slots tensor resolve_future gathered with never reaches the
    runtime's checked path; a value to cast does."""
    if relay_map == "decode":
        relay: Any = DecodeFutureMap("cpu", POOL)
        payload: Any = DecodePayload(next_token_ids=slots(7, 8))
        cast: Any = DecodePayload(next_token_ids=slots(7, 8).int())
    else:
        relay = EagleFutureMap("cpu", POOL, topk=TOPK)
        payload = _eagle(2)
        relay.stash(slots(1, 2), payload)  # the hidden state's buffer exists
        cast = attrs.evolve(payload, bonus_tokens=payload.bonus_tokens.int())
    checked: list[object] = []
    real = runtime.stash
    monkeypatch.setattr(
        runtime, "stash", lambda *args: checked.append(args) or real(*args)
    )
    indices = slots(1, 2)
    resolved(relay, indices)
    relay.stash(indices, payload)
    assert checked == []
    relay.stash(indices, cast)
    assert len(checked) == 1
    given = cast.next_token_ids if relay_map == "decode" else cast.bonus_tokens
    assert relay.output_tokens_buf[1:3].tolist() == given.tolist()


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


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_slots_are_refused_before_any_write(
    dtype: torch.dtype, debug: bool
) -> None:
    """Unsigned slots wider than a byte (torch indexes with none of them) are refused
    with relay's message and nothing written, the second slot outside the pool or not;
    uint8 slots are cast and written."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=debug)
    before = buffer_copies(relay)
    for values in ([4, 13], [4, 5]):
        with pytest.raises(RelayError, match="indices must be integer slots"):
            relay.stash(torch.tensor(values, dtype=dtype), eagle_payload(2, TOPK))
        assert buffers_unchanged(relay, before)
    relay.stash(torch.tensor([4, 5], dtype=torch.uint8), eagle_payload(2, TOPK, base=3))
    assert relay.output_tokens_buf[4:6].tolist() == [3, 4]
