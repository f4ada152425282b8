"""The debug-off common case (Note [One body], Note [Slots on the host] in runtime.py,
Note [Bare CPU fence]): what its gate does not take goes to the checked path, which
refuses it before any write, and the bare fence orders as the chained one."""

from __future__ import annotations

import math
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
from relay.schema import Field, Lane, Schema
from relay.testing import load_map_class

POOL = 9
TOPK = 2


def resolved(relay: Any, indices: torch.Tensor) -> Batch:
    """Resolve a batch whose slots tensor is ``indices`` itself."""
    batch = Batch(req_pool_indices=indices)
    relay.resolve_future(batch)
    return batch


@pytest.mark.parametrize("edit", ["in place", "through .data", "through numpy"])
def test_slots_edited_after_a_resolve_are_checked_again(edit: str) -> None:
    """The slots resolve_future gathered with, then set to a slot outside the pool
    (where no version counter sees it, too), are refused by stash and publish with
    nothing written."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    indices = slots(1, 2)
    resolved(relay, indices)
    relay.stash(indices, eagle_payload(2, TOPK, base=3))
    assert relay.output_tokens_buf[1:3].tolist() == [3, 4]
    if edit == "in place":
        indices[1] = POOL
    elif edit == "through .data":
        indices.data[1] = POOL
    else:
        indices.numpy()[1] = POOL
    before = buffer_copies(relay)
    with pytest.raises(
        SlotError, match=r"^EagleFutureMap\.stash: slot 9 at position 1"
    ):
        relay.stash(indices, eagle_payload(2, TOPK, base=5))
    with pytest.raises(SlotError, match=r"^EagleFutureMap\.publish: slot 9"):
        relay.publish(indices, torch.tensor([4, 4]))
    assert buffers_unchanged(relay, before)


def test_inference_tensor_slots_are_checked_like_any() -> None:
    """Slots made under inference_mode (no version counter) are read on the host too."""
    relay = DecodeFutureMap("cpu", POOL)
    with torch.inference_mode():
        indices = torch.tensor([1, POOL + 3])
    with pytest.raises(IndexError):  # index_select refuses the gather itself
        resolved(relay, indices)
    with torch.inference_mode():
        good = torch.tensor([1, 2])
    resolved(relay, good)
    assert runtime.write_rows(relay._state, good) == (
        2,
    )  # read on the host: in the pool
    before = buffer_copies(relay)
    with pytest.raises(SlotError, match=r"^DecodeFutureMap\.stash: slot 12"):
        relay.stash(indices, DecodePayload(next_token_ids=slots(5, 6)))
    assert buffers_unchanged(relay, before)


@pytest.mark.parametrize("n", [3, 40], ids=["listed", "aminmax"])
def test_a_slot_outside_the_pool_in_a_long_batch_writes_nothing(n: int) -> None:
    """Both host checks (a list up to 32 slots, one aminmax above) see the last slot."""
    relay = DecodeFutureMap("cpu", 64)
    indices = torch.arange(1, n + 1)
    indices[-1] = 64
    with pytest.raises(SlotError, match=rf"slot 64 at position {n - 1}"):
        relay.stash(indices, DecodePayload(next_token_ids=torch.arange(n)))
    assert not relay.output_tokens_buf.any()


@pytest.mark.parametrize(
    ("shape", "taken"),
    [((1,), True), ((32,), True), ((33,), True), ((0,), False), ((1, 1), False)],
    ids=["one", "listed-most", "aminmax-least", "none", "two-dim"],
)
def test_the_gate_takes_one_dim_slots_on_either_side_of_the_list(
    shape: tuple[int, ...], taken: bool
) -> None:
    """The gate passes 1-D slots as they are, read as a list up to 32 and by aminmax
    above; none, or a 2-D tensor of one slot, go to the checked path."""
    relay = DecodeFutureMap("cpu", 64)
    indices = (torch.arange(math.prod(shape)) + 1).reshape(shape)
    got = runtime.write_rows(relay._state, indices)
    assert got == (indices.shape if taken else None)


def test_int32_slots_are_cast_on_every_write() -> None:
    """Int32 slots take the checked path, which casts and checks them, and still
    refuses a bad later field with nothing written."""
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
    "first field on another device": (
        2,
        lambda: _eagle(2, bonus_tokens=torch.ones(2, dtype=torch.int64, device="meta")),
    ),
    "later field on another device": (
        2,
        lambda: _eagle(2, topk_p=torch.ones(2, TOPK, device="meta")),
    ),
    "last field on another device": (
        2,
        lambda: _eagle(2, hidden_states=torch.ones(2, 4, device="meta")),
    ),
    "later field requires grad": (
        2,
        lambda: _eagle(2, topk_p=torch.ones(2, TOPK, requires_grad=True)),
    ),
    # The hidden state's dtype is the payload's: its buffer's is known once it exists.
    "payload-dtype field requires grad": (
        2,
        lambda: _eagle(2, hidden_states=torch.ones(2, 4, requires_grad=True)),
    ),
}


@pytest.mark.parametrize("case", sorted(FAST_CASES))
def test_the_fast_path_does_what_the_checked_path_does(case: str) -> None:
    """A stash through the generated gate accepts, casts or refuses (with the same
    message, nothing written) exactly as the runtime's checked path does: a refused
    later field never follows a written first one."""
    n, make = FAST_CASES[case]
    outcomes = []
    for path in ("generated", "checked"):
        relay = EagleFutureMap("cpu", POOL, topk=TOPK)
        relay.stash(slots(1, 2, 3), eagle_payload(3, TOPK, hidden=torch.zeros(3, 4)))
        indices = slots(*range(1, n + 1))
        before = buffer_copies(relay)
        try:
            if path == "generated":
                relay.stash(indices, make())
            else:
                runtime.stash(relay._state, indices, make())
        except RelayError as error:
            outcome: object = str(error)
            assert buffers_unchanged(relay, before), outcome
        else:
            outcome = {k: v.tolist() for k, v in buffer_copies(relay).items()}
            assert not any(b.requires_grad for b in buffer_copies(relay).values())
        outcomes.append(outcome)
    assert outcomes[0] == outcomes[1]


def test_a_payload_that_requires_grad_chains_no_graph_through_the_map() -> None:
    """Values that require grad are written detached: the buffers and what a resolve
    hands over carry no autograd graph from one step into the next."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    topk_p = torch.ones(2, TOPK, requires_grad=True) * 0.5
    relay.stash(slots(1, 2), _eagle(2, topk_p=topk_p))
    assert not relay.topk_p_buf.requires_grad
    batch = resolved(relay, slots(1, 2))
    assert batch.spec_info.topk_p.grad_fn is None
    assert batch.spec_info.topk_p.tolist() == [[0.5] * TOPK] * 2


def test_a_refused_publish_writes_nothing() -> None:
    """publish's gate: a (n, 1) value is refused as the checked path refuses it."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    indices = slots(1, 2)
    resolved(relay, indices)
    before = buffer_copies(relay)
    with pytest.raises(
        RelayError, match=r"^EagleFutureMap\.new_seq_lens: got a tensor"
    ):
        relay.publish(indices, torch.tensor([[4], [5]]))
    assert buffers_unchanged(relay, before) and not relay._state.fence.created
    relay.publish(indices, torch.tensor([4, 5]))
    assert relay.new_seq_lens_buf[1:3].tolist() == [4, 5] and relay._state.fence.created


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


def test_the_gates_value_shape_follows_the_count_and_an_adopted_buffer() -> None:
    """The gate reads a value's shape by the slots' count (Note [Value shapes]): each
    count its own, and a buffer adopted with another row width makes them anew."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    state, topk_p = relay._state, 1
    for n in (2, 3, 2):
        relay.stash(slots(*range(1, n + 1)), eagle_payload(n, TOPK))
    assert dict(state.shapes[topk_p]) == {(2,): (2, TOPK), (3,): (3, TOPK)}
    with pytest.raises(
        RelayError, match=r"^EagleFutureMap\.topk_p: got a tensor of shape"
    ):
        relay.stash(
            slots(1, 2),
            attrs.evolve(eagle_payload(2, TOPK), topk_p=torch.ones(2, 3, 1)),
        )
    fresh = runtime.MapState(state.table, torch.device("cpu"), POOL, False)
    fresh.adopt(topk_p, torch.zeros(POOL, TOPK))
    assert fresh.shapes[topk_p][torch.Size([2])] == (2, TOPK)
    fresh.adopt(topk_p, torch.zeros(POOL, TOPK + 1, 2))
    assert dict(fresh.shapes[topk_p]) == {}
    assert fresh.shapes[topk_p][torch.Size([2])] == (2, TOPK + 1, 2)


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
    assert isinstance(relay._state.fence, CpuFence) and not relay._state.fence.created
    relay.publish(slots(1), torch.tensor([4]))
    record, wait = relay._state.fence.record, relay._state.fence.wait
    assert isinstance(record.__self__, CpuEvent)  # type: ignore[attr-defined]
    assert record.__func__ is CpuEvent.record  # type: ignore[attr-defined]
    assert wait.__func__ is CpuEvent.synchronize  # type: ignore[attr-defined]
    batch = Batch(req_pool_indices=slots(1))
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_sum == 4
    assert (
        type(EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)._state.fence) is Fence
    )


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
    assert type(relay._state.fence) is Fence and calls == ["record"]


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


def test_a_lazy_fields_first_value_on_another_device_is_refused() -> None:
    """Before its buffer exists, a lazy field's value must be on the map's device: its
    buffer would be allocated there otherwise. Refused with nothing written."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    before = buffer_copies(relay)
    hidden = torch.ones(2, 4, device="meta")
    with pytest.raises(RelayError, match=r"hidden_states: got a tensor on meta"):
        relay.stash(slots(1, 2), _eagle(2, hidden_states=hidden))
    assert buffers_unchanged(relay, before) and relay.hidden_states_buf is None


def test_owners_of_the_wrong_length_are_refused_before_any_write() -> None:
    """owners= names one request per row (debug mode reads them; debug off, a write
    ignores them): a list of another length is refused with nothing written."""
    cls = load_map_class(
        Schema(
            name="OwnedFutureMap",
            owners="rids",
            fields=[Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="t")],
        )
    )
    relay = cls("cpu", POOL, debug=True)
    before = buffer_copies(relay)
    payload = sys.modules[cls.__module__].OwnedPayload(tok=slots(5, 6))
    with pytest.raises(RelayError, match=r"owners must name one request per row"):
        relay.stash(slots(1, 2), payload, owners=[7])
    assert buffers_unchanged(relay, before)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int8, torch.uint8, torch.int32])
def test_narrow_integer_slots_resolve_as_int64_ones_do(dtype: torch.dtype) -> None:
    """Slots of any integer dtype a write takes are taken by the resolves too (debug off:
    ``index_select`` itself takes only int32 and int64)."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    relay.stash(slots(3, 4).to(dtype), eagle_payload(2, TOPK, base=7))
    relay.publish(slots(3, 4).to(dtype), torch.tensor([5, 6]))
    batch = resolved(relay, slots(4, 3).to(dtype))
    relay.resolve_seq_lens_cpu(batch)
    assert batch.spec_info.bonus_tokens.tolist() == [8, 7]
    assert batch.seq_lens.tolist() == [6, 5] and batch.seq_lens_sum == 11


def test_a_0_dim_slot_is_one_slot_on_every_path() -> None:
    """A 0-dim slot takes the one-row value its resolve hands back, whether or not a
    resolve used it first; a value shaped like one row alone is refused before any
    write."""
    for first_resolved in (False, True):
        relay = EagleFutureMap("cpu", POOL, topk=TOPK)
        slot = torch.tensor(3)
        if first_resolved:
            resolved(relay, slot)
        relay.stash(slot, eagle_payload(1, TOPK, base=7))
        batch = resolved(relay, slot)
        assert batch.spec_info.bonus_tokens.tolist() == [7]
        before = buffer_copies(relay)
        flat = EaglePayload(
            bonus_tokens=torch.tensor(5),
            topk_p=torch.ones(TOPK),
            topk_index=torch.ones(TOPK, dtype=torch.int64),
        )
        with pytest.raises(RelayError, match=r"output_tokens: got a tensor of shape"):
            relay.stash(slot, flat)
        assert buffers_unchanged(relay, before)
