"""A scatter that declares its batch rows (``Scatter(rows=BatchRows(...))``) refuses a
span that runs out of its own row, onto the next row's first token (a prefill row, which
no handed-over span covers), before the target changes: on the CPU in both modes,
naming the map, the field, the request, the row and the fix; off the CPU by a
device-side assert (Note [Row-bounded scatters] in relay/runtime.py). The bundled vLLM
maps declare it."""

from __future__ import annotations

import importlib
from typing import Any

import attrs
import pytest
import torch

from relay import RelayError, runtime
from relay.maps.vllm_v1_drafts import VllmV1DraftsFutureMap, VllmV1DraftsPayload
from relay.maps.vllm_v2_drafts import VllmV2DraftsFutureMap, VllmV2DraftsPayload
from relay.opcount import count_ops
from relay.schema import BatchRows, Field, Guard, Lane, Scatter, Schema
from relay.schemas.vllm_v1_drafts import SCHEMA as V1_SCHEMA
from relay.testing import Namespace, load_map_class

PAD = -1
PROMPT = [501, 502, 503]
MODES = pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
SCATTER = {
    "lane": Lane.FORWARD,
    "dtype": torch.int64,
    "target": "input_ids",
    "guard": Guard.NON_NEGATIVE,
}


def _chain(index: str | None) -> Schema:
    """A token, then up to 3 counted drafts, each request's span inside its row."""
    return Schema(
        name="BoundedFutureMap",
        fields=[
            Field(
                "tok",
                resolve=Scatter(
                    offsets="starts",
                    rows=BatchRows(starts="row_starts", index=index),
                ),
                **SCATTER,
            ),
            Field(
                "drafts",
                shape=(3,),
                resolve=Scatter(offsets="starts", lengths="counts", after="tok"),
                **SCATTER,
            ),
        ],
    )


def _bounded(debug: bool, index: str | None, counts: list[int]) -> tuple[Any, Any]:
    """Two requests in slots 2 and 4 stash a token and 3 drafts; the next batch lays
    request 0 in row 0 (positions 0 to 3) and request 1 in row 1 (4 to 6); then, with
    ``index``, row 2 is a prefill row the scatter does not write (7 to 9); without, the
    target holds nothing past the last row."""
    cls = load_map_class(_chain(index))
    payload = importlib.import_module(cls.__module__).BoundedPayload
    relay = cls("cpu", 8, debug=debug)
    relay.stash(
        torch.tensor([2, 4]),
        payload(
            tok=torch.tensor([10, 20]),
            drafts=torch.tensor([[11, 12, 13], [21, 22, 23]]),
            counts=torch.tensor([3, 3]),
        ),
    )
    batch = Namespace(
        req_pool_indices=torch.tensor([2, 4]),
        starts=torch.tensor([0, 4]),
        counts=torch.tensor(counts),
        row_starts=torch.tensor([0, 4, 7, 10] if index else [0, 4, 7]),
        input_ids=torch.tensor([PAD] * 7 + PROMPT),
    )
    if index is not None:
        batch.rows = torch.tensor([0, 1])
    return relay, batch


INDEXED = pytest.mark.parametrize(
    "index", ["rows", None], ids=["rows-named", "request-i-is-row-i"]
)


@MODES
@INDEXED
def test_spans_inside_their_rows_are_laid_in(debug: bool, index: str | None) -> None:
    """The counts each row was laid out for: every value in place, in both modes."""
    relay, batch = _bounded(debug, index, [3, 2])
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [10, 11, 12, 13, 20, 21, 22, *PROMPT]


@MODES
@INDEXED
def test_a_span_onto_the_next_rows_first_token_is_refused(
    debug: bool, index: str | None
) -> None:
    """Request 1's third draft, where its row holds two, would land on position 7, the
    next row's first token: refused in both modes, with no position changed."""
    relay, batch = _bounded(debug, index, [3, 3])
    with pytest.raises(RelayError) as raised:
        relay.resolve_future(batch)
    message = str(raised.value)
    past = "batch row 2's first, another request's" if index else "in no row"
    assert message.startswith(
        "BoundedFutureMap.drafts: the request in row 1 (slot 4) would lay its 3 "
        "value(s) at positions 5 to 7, outside its batch row 1 (positions 4 to 6 by "
        f"batch.row_starts): position 7 is {past}"
    ), message
    assert "Lay out each request's row for the values it is handed" in message
    assert message.endswith("Nothing was written")
    assert batch.input_ids.tolist() == [PAD] * 7 + PROMPT


@MODES
def test_a_span_onto_the_previous_row_is_refused(debug: bool) -> None:
    """An offset one early puts request 1's token on row 0's last position."""
    relay, batch = _bounded(debug, "rows", [2, 2])
    batch.starts = torch.tensor([0, 3])
    with pytest.raises(RelayError, match="position 3 is inside batch row 0, another"):
        relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [PAD] * 7 + PROMPT


@MODES
@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ([1, 3], r"is paired with batch row 3 \(batch\.rows\), but batch\.row_starts "),
        ([1, 1], r"are both paired with batch row 1 \(batch\.rows\)"),
    ],
    ids=["a row past the batch", "one row for two requests"],
)
def test_a_request_paired_with_no_row_of_its_own_is_refused(
    debug: bool, rows: list[int], why: str
) -> None:
    """A row the batch does not have, or one two requests share: refused, nothing
    written."""
    relay, batch = _bounded(debug, "rows", [0, 0])
    batch.starts = torch.tensor([4, 5])  # apart, both inside row 1
    batch.rows = torch.tensor(rows)
    with pytest.raises(RelayError, match=why) as raised:
        relay.resolve_future(batch)
    assert str(raised.value).startswith("BoundedFutureMap.tok: ")
    assert batch.input_ids.tolist() == [PAD] * 7 + PROMPT


@MODES
def test_row_starts_that_are_not_one_per_request_are_refused(debug: bool) -> None:
    """Without ``index``, request ``i`` is row ``i``: the starts hold one more."""
    relay, batch = _bounded(debug, None, [2, 2])
    batch.row_starts = torch.tensor([0, 4, 7, 10])
    with pytest.raises(
        RelayError,
        match=r"BoundedFutureMap\.tok: batch\.row_starts must hold a start per "
        r"request \(2\) and the last row's end",
    ):
        relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [PAD] * 7 + PROMPT


def test_off_the_host_a_span_out_of_its_row_is_a_device_assert() -> None:
    """Off the CPU the rows are not read back: ``torch._assert_async`` refuses a span
    outside its row, a row outside the batch or taken by two requests, and row starts
    out of order, on the device (it raises at once on the CPU)."""
    starts = torch.tensor([0, 4, 7, 10])
    at = torch.tensor([0, 4])
    runtime.assert_rows(at, torch.tensor([4, 3]), (starts, torch.tensor([0, 1])), "M")
    runtime.assert_rows(at, torch.tensor([4, 3]), (starts[:3], None), "M")
    runtime.assert_rows(at, torch.tensor([4, 0]), (starts, torch.tensor([0, 9])), "M")
    for span, rows in (([4, 4], [0, 1]), ([4, 3], [0, 3]), ([4, 3], [1, 1])):
        with pytest.raises(RuntimeError, match=r"M: a request's span runs outside"):
            runtime.assert_rows(
                at, torch.tensor(span), (starts, torch.tensor(rows)), "M"
            )
    # Both inside row 1, apart: still one row for two requests.
    two = (starts, torch.tensor([1, 1]))
    with pytest.raises(RuntimeError, match=r"or is another request's"):
        runtime.assert_rows(torch.tensor([4, 5]), torch.tensor([1, 1]), two, "M")
    runtime.assert_rows(torch.tensor([4, 5]), torch.tensor([1, 0]), two, "M")
    # Row starts out of order: rows that are not a partition of the target.
    shuffled = (torch.tensor([0, 8, 4, 10]), torch.tensor([0, 2]))
    with pytest.raises(RuntimeError, match=r"the rows' starts are out of order"):
        runtime.assert_rows(torch.tensor([0, 4]), torch.tensor([4, 2]), shuffled, "M")


# --- the bundled vLLM maps ----------------------------------------------------------------


def _v1(debug: bool, scheduled: int) -> tuple[VllmV1DraftsFutureMap, Namespace]:
    """vLLM V1: 'req-a' sampled 7 and proposed 3 drafts in step N; step N+1 schedules
    it first with 2 drafts (row 0: positions 0 to 2) and a new request's prefill after
    it (row 1: 3 to 5); ``scheduled`` drafts are handed to the map."""
    relay = VllmV1DraftsFutureMap("cpu", 4, num_speculative_tokens=3, debug=debug)
    relay.stash(
        torch.tensor([1]),
        VllmV1DraftsPayload(
            sampled_token_ids=torch.tensor([7], dtype=torch.int32),
            draft_token_ids=torch.tensor([[31, 32, 33]], dtype=torch.int32),
            num_draft_tokens=torch.tensor([3], dtype=torch.int32),
        ),
        owners=["req-a"],
    )
    batch = Namespace(
        slots=torch.tensor([1]),
        req_ids=["req-a"],
        token_positions=torch.tensor([0], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 3, 6], dtype=torch.int32),
        token_rows=torch.tensor([0], dtype=torch.int32),
        num_draft_tokens=torch.tensor([scheduled], dtype=torch.int32),
        input_ids=torch.tensor([55, PAD, PAD, *PROMPT], dtype=torch.int32),
    )
    return relay, batch


@MODES
def test_vllm_v1_an_extra_draft_onto_the_next_prefill_row_is_refused(
    debug: bool,
) -> None:
    """A draft count one above what the batch laid out would put the third draft on
    the prefill row's first token, in both modes (the map's other positions are the
    engine's, so debug mode's placeholder check does not run there): refused, naming
    the map, the field, the request's id and the fix; ``input_ids`` untouched."""
    relay, batch = _v1(debug, 2)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [7, 31, 32, *PROMPT]
    relay, batch = _v1(debug, 3)
    with pytest.raises(RelayError) as raised:
        relay.resolve_future(batch)
    message = str(raised.value)
    assert message.startswith(
        "VllmV1DraftsFutureMap.draft_tokens: request 'req-a' (row 0, slot 1) would "
        "lay its 3 value(s) at positions 1 to 3, outside its batch row 0 (positions 0 "
        "to 2 by batch.query_start_loc): position 3 is batch row 1's first, another "
        "request's"
    ), message
    assert batch.input_ids.tolist() == [55, PAD, PAD, *PROMPT]


def _v2(debug: bool, scheduled: int) -> tuple[VllmV2DraftsFutureMap, Namespace]:
    """vLLM V2: 'req-a' (slot 1) decodes with 1 draft laid out (row 0: 0 to 1), 'req-b'
    (slot 2) is mid-prefill (row 1: 2 to 4)."""
    relay = VllmV2DraftsFutureMap("cpu", 4, num_speculative_tokens=3, debug=debug)
    for slot, rid in ((1, "req-a"), (2, "req-b")):
        relay.seed(
            torch.tensor([slot]),
            VllmV2DraftsPayload(
                sampled_token_ids=torch.tensor([7], dtype=torch.int32),
                draft_token_ids=torch.tensor([[31, 32, 33]], dtype=torch.int32),
                num_draft_tokens=torch.tensor([3], dtype=torch.int32),
            ),
            owners=[rid],
        )
    batch = Namespace(
        slots=torch.tensor([1, 2]),
        req_ids=["req-a", "req-b"],
        logits_starts=torch.tensor([1 - scheduled, 4], dtype=torch.int32),
        sampled_ready=torch.tensor([True, False]),
        query_start_loc=torch.tensor([0, 2, 5], dtype=torch.int32),
        num_draft_tokens=torch.tensor([scheduled, 0], dtype=torch.int32),
        input_ids=torch.tensor([PAD, PAD, *PROMPT], dtype=torch.int32),
    )
    return relay, batch


@MODES
def test_vllm_v2_a_span_longer_than_its_row_is_refused(debug: bool) -> None:
    """Two drafts scheduled where the row laid out one: the token's position falls
    before the row, onto nothing of its own; refused in both modes."""
    relay, batch = _v2(debug, 1)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [7, 31, *PROMPT]
    relay, batch = _v2(debug, 2)
    batch.logits_starts = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(RelayError) as raised:
        relay.resolve_future(batch)
    assert str(raised.value).startswith(
        "VllmV2DraftsFutureMap.draft_tokens: request 'req-a' (row 0, slot 1) would "
        "lay its 2 value(s) at positions 1 to 2, outside its batch row 0 (positions 0 "
        "to 1 by batch.query_start_loc)"
    ), raised.value
    assert batch.input_ids.tolist() == [PAD, PAD, *PROMPT]


@MODES
@pytest.mark.parametrize(
    "index", ["rows", None], ids=["rows-named", "request-i-is-row-i"]
)
def test_many_requests_are_checked_the_same(debug: bool, index: str | None) -> None:
    """Above ``HOST_POSITIONS_IN_PYTHON_MAX`` requests the host check reads through
    numpy: the same spans pass, and the same one past its row is refused."""
    n = runtime.HOST_POSITIONS_IN_PYTHON_MAX + 12
    cls = load_map_class(_chain(index))
    payload = importlib.import_module(cls.__module__).BoundedPayload
    relay = cls("cpu", n + 1, debug=debug)
    slots = torch.arange(1, n + 1)
    relay.stash(
        slots,
        payload(
            tok=torch.arange(n),
            drafts=torch.arange(3 * n).reshape(n, 3),
            counts=torch.full((n,), 3),
        ),
    )
    # Every request's row is 4 positions: its token and 3 drafts; a prefill row of 2
    # follows the last when ``index`` names the rows.
    ends = torch.arange(0, 4 * n + 1, 4)
    batch = Namespace(
        req_pool_indices=slots,
        starts=ends[:-1].clone(),
        counts=torch.full((n,), 3),
        row_starts=torch.cat([ends, torch.tensor([4 * n + 2])]) if index else ends,
        input_ids=torch.tensor([PAD] * 4 * n + PROMPT[:2]),
    )
    if index is not None:
        batch.rows = torch.arange(n)
    relay.resolve_future(batch)
    assert batch.input_ids[:8].tolist() == [0, 0, 1, 2, 1, 3, 4, 5]
    relay.stash(
        slots,
        payload(
            tok=torch.arange(n),
            drafts=torch.arange(3 * n).reshape(n, 3),
            counts=torch.full((n,), 3),
        ),
    )
    batch.input_ids = torch.tensor([PAD] * 4 * n + PROMPT[:2])
    batch.starts = batch.starts.clone()
    batch.starts[n - 1] += 1  # its last draft past its row, on the prefill's token
    with pytest.raises(RelayError, match=rf"row {n - 1} \(slot {n}\) would lay"):
        relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [PAD] * 4 * n + PROMPT[:2]


def _resolve_ops(cls: Any) -> tuple[str, ...]:
    """The data ops of ``cls``'s resolve of ``_v1``'s batch, 2 drafts scheduled."""
    payload = importlib.import_module(cls.__module__).__dict__[
        cls.__name__.replace("FutureMap", "Payload")
    ]
    relay = cls("cpu", 4, num_speculative_tokens=3)
    relay.stash(
        torch.tensor([1]),
        payload(
            sampled_token_ids=torch.tensor([7], dtype=torch.int32),
            draft_token_ids=torch.tensor([[31, 32, 33]], dtype=torch.int32),
            num_draft_tokens=torch.tensor([3], dtype=torch.int32),
        ),
        owners=["req-a"],
    )
    _, batch = _v1(False, 2)
    ops = count_ops(lambda: relay.resolve_future(batch)).data
    assert batch.input_ids.tolist() == [7, 31, 32, *PROMPT]
    return ops


def test_the_row_check_dispatches_no_op_on_the_cpu() -> None:
    """With debug off the CPU check reads the int32 row starts and rows as they are:
    the bounded V1 map's resolve dispatches exactly the data ops of the same map
    without ``rows``."""
    first = V1_SCHEMA.fields[0]
    assert first.scatter is not None and first.scatter.rows is not None
    unbounded = attrs.evolve(
        V1_SCHEMA,
        name="UnboundedV1FutureMap",
        fields=[
            attrs.evolve(first, resolve=attrs.evolve(first.scatter, rows=None)),
            *V1_SCHEMA.fields[1:],
        ],
    )
    bounded = _resolve_ops(VllmV1DraftsFutureMap)
    assert bounded == _resolve_ops(load_map_class(unbounded))
