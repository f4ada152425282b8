"""vLLM's tokens are int64 (its drafter's argmax, V2's request state) and its
``input_ids`` int32: the bundled maps declare ``Scatter(cast=torch.int32)`` and lay
them in as vLLM does, ``draft_token_ids.to(torch.int32)`` scattered (Note [Casting
scatters] in relay/runtime.py). Debug mode names a stashed value int32 cannot hold; a
target of another dtype than the one declared is refused with relay's error."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from relay import RelayError
from relay.maps.vllm_v1_drafts import VllmV1DraftsFutureMap, VllmV1DraftsPayload
from relay.maps.vllm_v2_drafts import VllmV2DraftsFutureMap, VllmV2DraftsPayload
from relay.schema import Field, Guard, Lane, Scatter, Schema
from relay.testing import Namespace, load_map_class

MODES = pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
TOP = 2**31 - 1  # the largest token id int32 input_ids hold


def _v1(debug: bool, drafts: list[list[int]]) -> tuple[Any, Namespace]:
    """Two requests stashed with int32 tokens and int64 drafts, as V1 makes them, and
    the next step's batch: request b's row first, a's after a prefill row."""
    relay = VllmV1DraftsFutureMap("cpu", 8, num_speculative_tokens=3, debug=debug)
    relay.stash(
        torch.tensor([4, 2]),
        VllmV1DraftsPayload(
            sampled_token_ids=torch.tensor([10, TOP], dtype=torch.int32),
            draft_token_ids=torch.tensor(drafts, dtype=torch.int64),
            num_draft_tokens=torch.tensor([2, 1], dtype=torch.int32),
        ),
        owners=["a", "b"],
    )
    batch = Namespace(
        slots=torch.tensor([2, 4]),
        req_ids=["b", "a"],
        token_positions=torch.tensor([0, 5], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 2, 5, 8], dtype=torch.int32),
        token_rows=torch.tensor([0, 2], dtype=torch.int32),
        num_draft_tokens=torch.tensor([1, 2], dtype=torch.int32),
        input_ids=torch.tensor([-7, -1, 501, 502, 503, -7, -1, -1], dtype=torch.int32),
    )
    return relay, batch


@MODES
def test_int64_drafts_land_in_int32_input_ids_as_vllm_casts_them(debug: bool) -> None:
    """The values vLLM's scatter writes (``draft_token_ids.to(torch.int32)``), the
    largest id int32 holds included; ``input_ids`` stays vLLM's int32 tensor."""
    drafts = [[11, 12, 13], [TOP, 22, 23]]
    relay, batch = _v1(debug, drafts)
    target = batch.input_ids
    relay.resolve_future(batch)
    assert batch.input_ids is target and target.dtype is torch.int32
    cast = torch.tensor(drafts).to(torch.int32).tolist()
    want = [TOP, cast[1][0], 501, 502, 503, 10, cast[0][0], cast[0][1]]
    assert target.tolist() == want
    assert relay.draft_tokens_buf.dtype is torch.int64  # kept as the drafter made them


def test_debug_mode_names_a_draft_int32_cannot_hold() -> None:
    """A counted draft past int32's range is named at the stash, with the map, the
    field, the target and the fix; the same value past the row's count is no value
    and passes (vLLM leaves the tail unread)."""
    _v1(True, [[11, 12, TOP + 1], [21, 22, 23]])  # the tail of a row counted 2
    with pytest.raises(RuntimeError) as raised:
        _v1(True, [[11, TOP + 1, 13], [21, 22, 23]])
    assert str(raised.value).startswith(
        "VllmV1DraftsFutureMap.draft_tokens: a value does not fit torch.int32, the "
        "dtype Scatter(cast=...) lays it into batch.input_ids as"
    )
    assert "Stash values torch.int32 holds" in str(raised.value)


def test_with_debug_off_a_value_out_of_range_wraps_as_torch_casts() -> None:
    """Debug off checks no value (that is debug mode's cost): the draft is laid in
    as ``Tensor.to(torch.int32)`` makes it, which is what vLLM's own cast writes."""
    relay, batch = _v1(False, [[11, TOP + 5, 13], [21, 22, 23]])
    relay.resolve_future(batch)
    wrapped = int(torch.tensor(TOP + 5).to(torch.int32))
    assert batch.input_ids.tolist()[5:8] == [10, 11, wrapped]


@MODES
def test_a_target_of_another_dtype_than_the_cast_is_refused(debug: bool) -> None:
    """V2's map lays int32: an int64 ``input_ids`` is relay's error naming the map,
    the field and the dtype, with nothing written."""
    relay = VllmV2DraftsFutureMap("cpu", 8, num_speculative_tokens=2, debug=debug)
    relay.stash(
        torch.tensor([3]),
        VllmV2DraftsPayload(
            sampled_token_ids=torch.tensor([7]),
            draft_token_ids=torch.tensor([[8, -1]]),
            num_draft_tokens=torch.tensor([1]),
        ),
        owners=["r"],
    )
    batch = Namespace(
        slots=torch.tensor([3]),
        req_ids=["r"],
        logits_starts=torch.tensor([0]),
        sampled_ready=torch.tensor([True]),
        query_start_loc=torch.tensor([0, 2]),
        num_draft_tokens=torch.tensor([1]),
        input_ids=torch.full((2,), -1),
    )
    with pytest.raises(RelayError) as raised:
        relay.resolve_future(batch)
    assert str(raised.value).startswith(
        "VllmV2DraftsFutureMap.last_sampled: batch.input_ids must be a flat "
        "torch.int32 tensor on cpu to scatter the field into, got a torch.int64 tensor"
    )
    assert batch.input_ids.tolist() == [-1, -1]
    batch.input_ids = torch.full((2,), -1, dtype=torch.int32)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [7, 8]


def _one_token(cast: torch.dtype | None) -> type[Any]:
    scatter = Scatter(offsets="starts", cast=cast)
    token = Field(
        "token",
        lane=Lane.FORWARD,
        dtype=torch.int64,
        target="input_ids",
        resolve=scatter,
        guard=Guard.NON_NEGATIVE,
    )
    name = "CastTokenFutureMap" if cast else "TokenFutureMap"
    return load_map_class(Schema(name, [token], indices="slots"))


@MODES
def test_a_one_value_scatter_casts_too(debug: bool) -> None:
    """One token per request (no span): laid in as int32 where declared; without
    ``cast``, an int32 target is refused, relay's error naming the map and field
    and the fix."""
    for cls in (_one_token(torch.int32), _one_token(None)):
        relay = cls("cpu", 4, debug=debug)
        relay.stash(torch.tensor([1, 2]), Namespace(token=torch.tensor([5, TOP])))
        batch = Namespace(
            slots=torch.tensor([2, 1]),
            starts=torch.tensor([2, 0]),
            input_ids=torch.tensor([-1, 9, -1], dtype=torch.int32),
        )
        if cls.__name__ == "TokenFutureMap":
            with pytest.raises(RelayError) as raised:
                relay.resolve_future(batch)
            message = str(raised.value)
            assert message.startswith(
                "TokenFutureMap.token: batch.input_ids must be a flat torch.int64 tensor"
            )
            assert "Scatter(cast=<the target's dtype>)" in message
            assert batch.input_ids.tolist() == [-1, 9, -1]
        else:
            relay.resolve_future(batch)
            assert batch.input_ids.tolist() == [5, 9, TOP]
