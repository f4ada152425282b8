"""Every scatter destination is checked before anything is written (Note [Scatter
destinations] in relay/runtime.py): offsets of the wrong type, length or range are
refused naming the map, field and request; int32 offsets are taken; in debug mode
overlapping rows and a placeholder left in the target are reported."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest
import torch

from relay import RelayDebugError, RelayError
from relay.schema import Field, Guard, Lane, Scatter, Schema
from relay.testing import Namespace, load_map_class

FLAT = Schema(
    name="ScatterFutureMap",
    fields=[
        Field(
            "tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=(2,),
            target="input_ids",
            resolve=Scatter(offsets="starts"),
            guard=Guard.NON_NEGATIVE,
        )
    ],
)


def _stashed(debug: bool) -> Any:
    cls = load_map_class(FLAT)
    payload = importlib.import_module(cls.__module__).ScatterPayload
    relay = cls("cpu", 8, debug=debug)
    relay.stash(
        torch.tensor([2, 4]), payload(tokens=torch.tensor([[10, 11], [20, 21]]))
    )
    return relay


def _batch(starts: object, size: int = 6) -> Namespace:
    return Namespace(
        req_pool_indices=torch.tensor([2, 4]),
        starts=starts,
        input_ids=torch.full((size,), -1),
    )


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_int64_and_int32_offsets_scatter_each_request_at_its_start(
    debug: bool, dtype: torch.dtype
) -> None:
    """vLLM's ``query_start_loc`` is int32: taken as int64 offsets are."""
    batch = _batch(torch.tensor([3, 0], dtype=dtype), size=5)
    batch.input_ids[2] = 7  # a prefill token the scatter leaves alone
    _stashed(debug).resolve_future(batch)
    assert batch.input_ids.tolist() == [20, 21, 7, 10, 11]


OVERLAP = (
    r"the request in row 1 \(slot 4\) starts at 1, inside the 2 position\(s\) of "
    r"the request in row 0 \(slot 2\) from 0"
)

BAD_OFFSETS = {
    "floats": (
        torch.tensor([0.0, 3.0]),
        r"got a torch\.float32 tensor of shape \(2,\)",
    ),
    "a list": ([0, 3], r"got a list"),
    "one short": (torch.tensor([0]), r"one integer start offset per request \(2"),
    "negative": (
        torch.tensor([-1, 3]),
        r"the request in row 0 \(slot 2\) starts at -1",
    ),
    "one past the end": (
        torch.tensor([0, 5]),
        r"the request in row 1 \(slot 4\) starts at 5",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_OFFSETS))
def test_bad_offsets_are_refused_before_anything_is_written(case: str) -> None:
    """Debug off, on the CPU: refused with relay's message, the target untouched."""
    offsets, message = BAD_OFFSETS[case]
    batch = _batch(offsets)
    with pytest.raises(
        RelayError, match=r"^ScatterFutureMap\.tokens: batch\.starts"
    ) as raised:
        _stashed(False).resolve_future(batch)
    assert re.search(message, str(raised.value)), str(raised.value)
    assert batch.input_ids.tolist() == [-1] * 6


@pytest.mark.parametrize(
    ("starts", "message"),
    [
        (
            [0, 1],
            OVERLAP,
        ),
        ([3, 3], r"inside the 2 position\(s\) of the request in row 0"),
        (
            [0, 5],
            (
                r"the request in row 1 \(slot 4\) starts at 5, so its 2 value\(s\) "
                r"would not fit"
            ),
        ),
    ],
    ids=["overlapping", "repeated", "one past the end"],
)
def test_debug_mode_names_overlapping_and_outside_rows(
    starts: list[int], message: str
) -> None:
    """Debug mode, every device: two requests' rows that overlap, or a row outside the
    target, reported before the scatter, naming both requests."""
    batch = _batch(torch.tensor(starts))
    with pytest.raises(RelayDebugError, match=message):
        _stashed(True).resolve_future(batch)
    assert batch.input_ids.tolist() == [-1] * 6


def test_debug_mode_names_a_placeholder_left_in_the_target() -> None:
    """Offsets one short of the target's end leave vLLM's ``-1`` behind: reported at the
    position (the field is guarded non-negative)."""
    batch = _batch(torch.tensor([0, 2]), size=5)
    with pytest.raises(
        RelayDebugError,
        match=r"after the scatter, position 4 of the target still holds -1",
    ):
        _stashed(True).resolve_future(batch)
