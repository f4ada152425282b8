"""Runtime inputs that used to pass silently or fail obscurely: float and bool indices,
payload values that are not tensors, and NaN/inf values in debug mode."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from relay_runtime_support import (
    batch_of,
    buffer_copies,
    buffers_unchanged,
    eagle_payload,
    load_generated,
    slots,
)

from relay import RelayError
from relay.maps.decode_seq_lens import DecodeSeqLensFutureMap, DecodeSeqLensPayload
from relay.maps.eagle import EagleFutureMap, EaglePayload
from relay.opcount import count_ops
from relay.runtime import check_rows
from relay.schema import Field, Guard, Lane, Schema

POOL = 9
TOPK = 2


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_non_integer_indices_are_refused_before_any_write(
    debug: bool, dtype: torch.dtype
) -> None:
    """A float or bool slots tensor is refused naming the map and field, not truncated."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=debug)
    before = buffer_copies(relay)
    indices = torch.tensor([1.7, 2.2]).to(dtype)
    with pytest.raises(
        RelayError,
        match=rf"^EagleFutureMap\.output_tokens: indices must be integer slots, got a "
        rf"{dtype} tensor, which a write would truncate",
    ):
        relay.stash(indices, eagle_payload(2, TOPK, base=5))
    with pytest.raises(
        RelayError, match=r"^EagleFutureMap\.new_seq_lens: indices must be integer"
    ):
        relay.publish(indices, torch.tensor([3, 4]))
    assert buffers_unchanged(relay, before)


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_values_that_are_not_tensors_are_refused_naming_the_field(debug: bool) -> None:
    """A list in a payload or a Python int to publish is a RelayError, not an AttributeError."""
    relay = DecodeSeqLensFutureMap("cpu", POOL, debug=debug)
    before = buffer_copies(relay)
    with pytest.raises(
        RelayError,
        match=r"^DecodeSeqLensFutureMap\.output_tokens: got \[4, 5\] of type list, not "
        r"a tensor; payload values and publish arguments are torch\.Tensors",
    ):
        relay.stash(slots(1, 2), DecodeSeqLensPayload(next_token_ids=[4, 5]))  # type: ignore[arg-type]
    with pytest.raises(
        RelayError,
        match=r"^DecodeSeqLensFutureMap\.new_seq_lens: got 5 of type int, not a tensor",
    ):
        relay.publish(slots(1), 5)  # type: ignore[arg-type]
    with pytest.raises(
        RelayError,
        match=r"^DecodeSeqLensFutureMap\.output_tokens: indices must be a tensor of "
        r"request-pool slots \(got a list\)",
    ):
        relay.stash([1, 2], DecodeSeqLensPayload(next_token_ids=slots(4, 5)))  # type: ignore[arg-type]
    assert buffers_unchanged(relay, before)


def test_integer_index_dtypes_are_all_still_taken() -> None:
    """Every integer index dtype torch writes with is still accepted as slots."""
    for dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        relay = DecodeSeqLensFutureMap("cpu", POOL)
        relay.stash(
            torch.tensor([3], dtype=dtype),
            DecodeSeqLensPayload(next_token_ids=slots(8)),
        )
        assert relay.output_tokens_buf[3] == 8


def test_the_input_checks_dispatch_no_op() -> None:
    """check_rows on an accepted value reads types, shapes and dtypes only: no torch op."""
    value, indices, buf = torch.zeros(4, 2), slots(1, 2, 3, 4), torch.zeros(POOL, 2)
    counts = count_ops(lambda: check_rows("M.f", value, indices, buf))
    assert counts.data == () and counts.views == ()

    floats = indices.float()

    def refused() -> None:
        with pytest.raises(RelayError):
            check_rows("M.f", value, floats, buf)

    counts = count_ops(refused)
    assert counts.data == () and counts.views == ()


@pytest.mark.usefixtures("clocks_on")
@pytest.mark.parametrize(
    "special", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"]
)
def test_non_finite_values_are_handed_over_as_written_in_debug_mode(
    special: float,
) -> None:
    """NaN and +-inf in a float field (eager and lazy) are values, never a missing stash."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    hidden = torch.tensor([[special, 1.0, special], [2.0, special, 3.0]])
    payload = eagle_payload(2, TOPK, base=1, hidden=hidden)
    topk_p = torch.full((2, TOPK), special)
    relay.stash(
        slots(3, 5),
        EaglePayload(
            bonus_tokens=payload.bonus_tokens,
            topk_p=topk_p,
            topk_index=payload.topk_index,
            hidden_states=hidden,
        ),
    )
    batch = batch_of(3, 5)
    relay.resolve_future(batch)
    assert torch.equal(batch.spec_info.topk_p.isnan(), topk_p.isnan())
    assert torch.equal(batch.spec_info.topk_p.nan_to_num(0.5), topk_p.nan_to_num(0.5))
    assert batch.spec_info.hidden_states is not None
    assert torch.equal(
        batch.spec_info.hidden_states.nan_to_num(0.5), hidden.nan_to_num(0.5)
    )
    # Consumed once: the next read is reported as a second read, not as never written.
    with pytest.raises(RelayError, match="not written since it was last consumed"):
        relay.resolve_future(batch_of(3))


@pytest.mark.usefixtures("clocks_on")
@pytest.mark.parametrize("guard", [Guard.NON_NEGATIVE, Guard.POSITIVE])
def test_a_guard_on_a_float_field_lets_nan_through_and_refuses_what_it_says(
    tmp_path: Path, guard: Guard
) -> None:
    """NaN is not below a guard's bound: only Guard.FINITE refuses it; -1.0 is refused."""
    module = load_generated(
        Schema(
            name="ScoreFutureMap",
            fields=[
                Field(
                    "score",
                    lane=Lane.FORWARD,
                    dtype=torch.float32,
                    target="score",
                    guard=guard,
                )
            ],
        ),
        tmp_path,
        f"score_{guard.name.lower()}",
    )
    relay = module.ScoreFutureMap("cpu", POOL, debug=True)
    relay.stash(slots(1, 2), module.ScorePayload(score=torch.tensor([math.nan, 2.0])))
    batch = batch_of(1, 2)
    relay.resolve_future(batch)
    assert batch.score[0].isnan() and batch.score[1] == 2.0  # type: ignore[attr-defined]
    bound = ">= 0" if guard is Guard.NON_NEGATIVE else "> 0"
    with pytest.raises(
        RuntimeError,
        match=rf"ScoreFutureMap\.score: guard failed, values must be {bound}",
    ):
        relay.stash(slots(3), module.ScorePayload(score=torch.tensor([-1.0])))
