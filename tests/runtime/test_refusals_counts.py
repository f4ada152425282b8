"""Counts, spans, adopted buffers and tails refused the same way in both modes, before
anything changes, with relay's messages naming the map and the field or attribute:
a counted scatter's count outside its row or a span running into another request's,
an adopted buffer sharing storage with another or requiring grad, a tail that would
read column -1, and the inputs that used to reach the user as a torch error."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from relay import RelayDebugError, RelayError, runtime
from relay.maps.vllm_drafts import VllmDraftsFutureMap, VllmDraftsPayload
from relay.schema import Field, Guard, HostCopy, Lane, Scatter, Schema, Tails, TailsKv
from relay.testing import Namespace, load_map_class

PAD = -1
MODES = pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
SCATTER = {
    "lane": Lane.FORWARD,
    "dtype": torch.int64,
    "target": "input_ids",
    "guard": Guard.NON_NEGATIVE,
}
CHAIN = Schema(
    name="ChainFutureMap",
    fields=[
        Field("tok", resolve=Scatter(offsets="starts"), **SCATTER),
        Field(
            "drafts",
            shape=(3,),
            resolve=Scatter(offsets="starts", lengths="counts", after="tok"),
            **SCATTER,
        ),
        Field(
            "pair",
            shape=(2,),
            resolve=Scatter(offsets="starts", after="drafts"),
            **SCATTER,
        ),
    ],
)


def _chain(debug: bool) -> tuple[Any, Namespace]:
    """Two requests in slots 2 and 4, each a token, 3 drafts made, a pair; request 0's
    span is 1 + 2 + 2 positions from 0, request 1's 1 + 1 + 2 from 5."""
    cls = load_map_class(CHAIN)
    payload = importlib.import_module(cls.__module__).ChainPayload
    relay = cls("cpu", 8, debug=debug)
    relay.stash(
        torch.tensor([2, 4]),
        payload(
            tok=torch.tensor([10, 20]),
            drafts=torch.tensor([[11, 12, 13], [21, 22, 23]]),
            pair=torch.tensor([[18, 19], [28, 29]]),
            counts=torch.tensor([3, 3]),
        ),
    )
    batch = Namespace(
        req_pool_indices=torch.tensor([2, 4]),
        starts=torch.tensor([0, 5]),
        counts=torch.tensor([2, 1]),
        input_ids=torch.full((9,), PAD),
    )
    return relay, batch


@MODES
def test_a_chain_lays_each_request_in_its_span(debug: bool) -> None:
    """The token, the counted drafts, then the pair, in both modes."""
    relay, batch = _chain(debug)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [10, 11, 12, 18, 19, 20, 21, 28, 29]


@MODES
@pytest.mark.parametrize(
    ("count", "why"),
    [
        (4, r"count of 4 value\(s\), outside \[0, 3\]"),
        (-1, r"count of -1 value\(s\), outside \[0, 3\]"),
    ],
    ids=["above the width", "negative"],
)
def test_a_count_outside_its_row_is_refused_in_both_modes(
    debug: bool, count: int, why: str
) -> None:
    """Above the width the pair would leave a gap; -1 would lay the pair over the
    token: refused, naming the map, field and request, with nothing written."""
    relay, batch = _chain(debug)
    batch.counts = torch.tensor([2, count])
    batch.input_ids = torch.full((12,), PAD)
    with pytest.raises(RelayError, match=why) as raised:
        relay.resolve_future(batch)
    assert str(raised.value).startswith(
        "ChainFutureMap.drafts: the request in row 1 (slot 4) has a count"
    )
    assert batch.input_ids.tolist() == [PAD] * 12


@MODES
def test_a_span_running_into_the_next_requests_span_is_refused(debug: bool) -> None:
    """A count within the width whose span reaches the next request's start: refused
    in both modes, naming both requests, with nothing written."""
    relay, batch = _chain(debug)
    batch.counts = torch.tensor(
        [3, 1]
    )  # request 0 now ends at 6, request 1 starts at 5
    batch.input_ids = torch.full((9,), PAD)
    with pytest.raises(RelayError, match=r"request in row 0 \(slot 2\)") as raised:
        relay.resolve_future(batch)
    assert "request in row 1 (slot 4)" in str(raised.value)
    assert batch.input_ids.tolist() == [PAD] * 9


@MODES
def test_requests_out_of_start_order_are_taken_when_apart(debug: bool) -> None:
    """Starts need not rise with the rows: spans apart in any order are laid in."""
    relay, batch = _chain(debug)
    batch.starts = torch.tensor([4, 0])
    batch.counts = torch.tensor([2, 1])
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [20, 21, 28, 29, 10, 11, 12, 18, 19]


def test_an_extra_draft_over_a_prefill_token_is_named_in_debug_mode() -> None:
    """vllm_drafts: the running request's count says 2 drafts where its span holds 1,
    so its second draft would land on the next (prefill) row's first token: debug mode
    names the position (it holds a token, not a placeholder), with nothing written."""
    relay = VllmDraftsFutureMap("cpu", 8, num_speculative_tokens=3, debug=True)
    relay.stash(
        torch.tensor([3]),
        VllmDraftsPayload(
            sampled_token_ids=torch.tensor([30]),
            draft_token_ids=torch.tensor([[31, 32, 33]]),
            num_draft_tokens=torch.tensor([3]),
        ),
    )
    prompt = [501, 502, 503]
    batch = Namespace(
        slots=torch.tensor([3]),
        req_ids=None,
        query_starts=torch.tensor([0], dtype=torch.int32),
        num_draft_tokens=torch.tensor([2], dtype=torch.int32),
        input_ids=torch.tensor([PAD, PAD, *prompt], dtype=torch.int32),
    )
    with pytest.raises(RelayDebugError, match=r"position 2, which holds 501") as raised:
        relay.resolve_future(batch)
    assert str(raised.value).startswith(
        "VllmDraftsFutureMap.draft_tokens: the request in row 0"
    )
    assert batch.input_ids.tolist() == [PAD, PAD, *prompt]


def test_off_the_host_a_count_outside_its_row_is_a_device_assert() -> None:
    """Off the CPU the counts are not read back: ``torch._assert_async`` refuses a count
    outside the row on the device, before the scatter (it raises at once on the CPU)."""
    runtime.assert_counts(torch.tensor([0, 3]), 3, "M.f")
    for bad in ([0, 4], [-1, 0]):
        with pytest.raises(RuntimeError, match=r"M\.f: a count is outside"):
            runtime.assert_counts(torch.tensor(bad), 3, "M.f")


# --- adopted buffers ---------------------------------------------------------------------

ADOPTED = Schema(
    name="AdoptFutureMap",
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="bonus_tokens",
            target="bonus_tokens",
            graph_written=True,
        ),
        Field(
            "confidence",
            lane=Lane.SCHEDULE,
            dtype=torch.float32,
            target="confidence",
            graph_written=True,
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            graph_written=True,
        ),
    ],
)
POOL = 6


def _adopt(debug: bool = False, **buffers: torch.Tensor) -> Any:
    return load_map_class(ADOPTED)("cpu", POOL, debug=debug, **buffers)


@pytest.mark.parametrize("how", ["one tensor", "overlapping views"])
def test_adopted_buffers_sharing_storage_are_refused(how: str) -> None:
    """One tensor, or overlapping views of one storage, as two fields' buffers: refused
    naming both fields, and neither buffer zeroed."""
    if how == "one tensor":
        tokens = lens = torch.full((POOL,), 40)
        storage = tokens
    else:
        storage = torch.full((2 * POOL,), 40)
        tokens, lens = storage[:POOL], storage[POOL - 1 : 2 * POOL - 1]
    with pytest.raises(RelayError) as raised:
        _adopt(True, output_tokens_buf=tokens, new_seq_lens_buf=lens)
    message = str(raised.value)
    assert message.startswith("AdoptFutureMap.new_seq_lens: ")
    assert "AdoptFutureMap.output_tokens" in message and "storage" in message
    assert storage.tolist() == [40] * storage.numel()


def test_views_of_one_storage_that_do_not_overlap_are_adopted() -> None:
    """Two fields' buffers may be disjoint parts of one allocation."""
    storage = torch.full((2 * POOL,), 40)
    relay = _adopt(output_tokens_buf=storage[:POOL], new_seq_lens_buf=storage[POOL:])
    assert relay.output_tokens_buf.data_ptr() == storage.data_ptr()
    assert relay.new_seq_lens_buf.data_ptr() == storage[POOL:].data_ptr()


def test_an_adopted_buffer_that_requires_grad_is_refused() -> None:
    """A float buffer requiring grad: refused naming the field, not filled."""
    confidence = torch.full((POOL,), 0.5, requires_grad=True)
    with pytest.raises(RelayError, match=r"requires grad") as raised:
        _adopt(True, confidence_buf=confidence)
    assert str(raised.value).startswith("AdoptFutureMap.confidence: ")
    assert confidence.tolist() == [0.5] * POOL


def test_a_later_refused_buffer_leaves_the_earlier_one_unfilled() -> None:
    """The constructor checks every handed buffer before it fills any (debug mode
    would poison the first)."""
    tokens = torch.full((POOL,), 7)
    with pytest.raises(RelayError, match=r"AdoptFutureMap.new_seq_lens"):
        _adopt(
            True,
            output_tokens_buf=tokens,
            new_seq_lens_buf=torch.zeros(POOL, dtype=torch.int32),
        )
    assert tokens.tolist() == [7] * POOL


# --- tails --------------------------------------------------------------------------------


def _tails_schema(add: int) -> Schema:
    return Schema(
        name="TailsFutureMap",
        fields=[
            Field(
                "new_seq_lens",
                lane=Lane.SCHEDULE,
                dtype=torch.int64,
                target="seq_lens",
                host=HostCopy(mirror="seq_lens_cpu"),
                guard=Guard.NON_NEGATIVE,
                tails=Tails(
                    rows="mix_running_indices",
                    kv=TailsKv(locations="out_cache_loc", table="req_to_token"),
                    add=add,
                ),
            )
        ],
    )


def _tails(debug: bool, published: list[int], add: int = 0) -> tuple[Any, Namespace]:
    relay = load_map_class(_tails_schema(add))("cpu", 8, debug=debug)
    relay.publish(torch.tensor([2, 5]), torch.tensor(published))
    batch = Namespace(
        req_pool_indices=torch.tensor([2, 5]),
        mix_running_indices=torch.tensor([2, 5]),
        seq_lens=torch.tensor([9, 9, 9]),
        seq_lens_cpu=torch.tensor([9, 9, 9]),
        out_cache_loc=torch.tensor([-3, -3, -3]),
        req_to_token=torch.arange(8 * 10).reshape(8, 10),
    )
    return relay, batch


@MODES
def test_a_tail_at_column_minus_one_is_refused(debug: bool) -> None:
    """With no length added, a published length of 0 would read req_to_token[slot, -1],
    the row's last column: refused naming the map, table and request; batch as was."""
    relay, batch = _tails(debug, [4, 0])
    before = dict(vars(batch))
    with pytest.raises(RelayError, match=r"column -1") as raised:
        relay.resolve_tails(batch)
    message = str(raised.value)
    assert message.startswith("TailsFutureMap.new_seq_lens: batch.req_to_token")
    assert "decode row 1 (slot 5)" in message
    assert vars(batch) == before


@MODES
def test_a_tail_past_the_tables_width_is_refused(debug: bool) -> None:
    """A length past req_to_token's 10 columns: relay's error, not an IndexError."""
    relay, batch = _tails(debug, [4, 11])
    before = dict(vars(batch))
    with pytest.raises(RelayError, match=r"column 10 of its 10") as raised:
        relay.resolve_tails(batch)
    assert str(raised.value).startswith(
        "TailsFutureMap.new_seq_lens: batch.req_to_token"
    )
    assert vars(batch) == before


@MODES
def test_a_table_with_fewer_rows_than_a_slot_is_refused(debug: bool) -> None:
    """req_to_token with fewer rows than the pool: slot 5 has no row there."""
    relay, batch = _tails(debug, [4, 3])
    batch.req_to_token = torch.arange(4 * 10).reshape(4, 10)
    before = dict(vars(batch))
    with pytest.raises(RelayError, match=r"slot 5, but the table has 4 rows") as raised:
        relay.resolve_tails(batch)
    assert str(raised.value).startswith(
        "TailsFutureMap.new_seq_lens: batch.req_to_token"
    )
    assert vars(batch) == before


@MODES
def test_in_range_tails_are_bound(debug: bool) -> None:
    """Lengths 4 and 3 with nothing added: columns 3 and 2 of slots 2 and 5."""
    relay, batch = _tails(debug, [4, 3])
    relay.resolve_tails(batch)
    assert batch.out_cache_loc.tolist() == [-3, 23, 52]
    assert batch.seq_lens.tolist() == [9, 4, 3]


@MODES
def test_a_batch_tensor_shorter_than_its_decode_rows_names_map_and_attribute(
    debug: bool,
) -> None:
    """The message names the map, the field and the batch attribute."""
    relay, batch = _tails(debug, [4, 3])
    batch.out_cache_loc = torch.tensor([0])
    before = dict(vars(batch))
    with pytest.raises(RelayError) as raised:
        relay.resolve_tails(batch)
    assert str(raised.value).startswith(
        "TailsFutureMap.new_seq_lens: batch.out_cache_loc has 1 entries, but "
        "resolve_tails binds 2 decode rows"
    )
    assert vars(batch) == before


@MODES
def test_a_host_mirror_of_none_is_refused_by_name(debug: bool) -> None:
    """``seq_lens_cpu=None`` is relay's error naming the attribute, not AttributeError."""
    relay, batch = _tails(debug, [4, 3])
    batch.seq_lens_cpu = None
    before = dict(vars(batch))
    with pytest.raises(RelayError, match=r"batch\.seq_lens_cpu must be") as raised:
        relay.resolve_tails(batch)
    assert str(raised.value).startswith("TailsFutureMap.new_seq_lens: ")
    assert vars(batch) == before


# --- the other inputs torch used to refuse -----------------------------------------------


def _drafts(debug: bool) -> tuple[VllmDraftsFutureMap, Namespace]:
    relay = VllmDraftsFutureMap("cpu", 8, num_speculative_tokens=3, debug=debug)
    relay.stash(
        torch.tensor([4, 2]),
        VllmDraftsPayload(
            sampled_token_ids=torch.tensor([10, 20]),
            draft_token_ids=torch.tensor([[11, 12, 13], [21, 22, 23]]),
            num_draft_tokens=torch.tensor([3, 3]),
        ),
    )
    batch = Namespace(
        slots=torch.tensor([4, 2]),
        req_ids=None,
        query_starts=torch.tensor([0, 3], dtype=torch.int32),
        num_draft_tokens=torch.tensor([2, 1], dtype=torch.int32),
        input_ids=torch.full((5,), PAD, dtype=torch.int32),
    )
    return relay, batch


@MODES
def test_a_scatter_target_of_another_dtype_is_refused(debug: bool) -> None:
    """int64 input_ids where the map lays its int64 tokens in as int32 (vLLM's
    input_ids, its ``Scatter(cast=torch.int32)``): relay's error, nothing written."""
    relay, batch = _drafts(debug)
    batch.input_ids = torch.full((5,), PAD)
    with pytest.raises(RelayError, match=r"batch\.input_ids") as raised:
        relay.resolve_future(batch)
    message = str(raised.value)
    assert message.startswith("VllmDraftsFutureMap.")
    assert "torch.int32" in message and "torch.int64" in message
    assert "Scatter(cast=...)" in message
    assert batch.input_ids.tolist() == [PAD] * 5


TWO_TARGETS = Schema(
    name="TwoTargetsFutureMap",
    fields=[
        Field("tok", resolve=Scatter(offsets="starts"), **SCATTER),
        Field(
            "pos",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            resolve=Scatter(offsets="pos_starts"),
            target="positions",
        ),
    ],
)


@MODES
def test_with_two_scatter_targets_a_refused_second_leaves_the_first(
    debug: bool,
) -> None:
    """Every target's positions are checked before the first is written."""
    cls = load_map_class(TWO_TARGETS)
    payload = importlib.import_module(cls.__module__).TwoTargetsPayload
    relay = cls("cpu", 8, debug=debug)
    relay.stash(
        torch.tensor([2, 4]),
        payload(tok=torch.tensor([1, 2]), pos=torch.tensor([5, 6])),
    )
    batch = Namespace(
        req_pool_indices=torch.tensor([2, 4]),
        starts=torch.tensor([0, 1]),
        pos_starts=torch.tensor([0, 2]),  # past the end of a 2-long target
        input_ids=torch.full((2,), PAD),
        positions=torch.full((2,), PAD),
    )
    with pytest.raises(RelayError, match=r"TwoTargetsFutureMap\.pos"):
        relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [PAD, PAD]
    assert batch.positions.tolist() == [PAD, PAD]


@MODES
def test_slots_on_another_device_are_refused_by_name(debug: bool) -> None:
    """Meta-device slots given to a CPU map's writes: relay's error naming the map."""
    relay, _ = _drafts(debug)
    meta = torch.tensor([1, 2], device="meta")
    with pytest.raises(RelayError, match=r"on meta, not on the map's device cpu"):
        relay.stash(
            meta,
            VllmDraftsPayload(
                sampled_token_ids=torch.tensor([1, 2]),
                draft_token_ids=torch.zeros(2, 3, dtype=torch.int64),
                num_draft_tokens=torch.tensor([0, 0]),
            ),
        )
    with pytest.raises(RelayError, match=r"on meta, not on the map's device cpu"):
        relay.publish(meta, torch.tensor([0, 0]))


def test_slots_on_another_device_are_refused_by_a_debug_resolve() -> None:
    """Debug mode's resolve checks the slots' device before it reads them."""
    relay, batch = _drafts(True)
    batch.input_ids = torch.full((5,), PAD)
    batch.slots = torch.tensor([4, 2], device="meta")
    with pytest.raises(RelayError, match=r"VllmDraftsFutureMap.resolve_future: .*meta"):
        relay.resolve_future(batch)


def test_a_partial_stash_at_the_pools_size_is_a_slot_outside_the_pool() -> None:
    """Debug mode names slot ``pool_size`` as outside the pool, not as a stale row."""
    from relay.maps.sglang_eagle import SglangEagleFutureMap

    relay = SglangEagleFutureMap("cpu", 8, debug=True)
    with pytest.raises(RelayError, match=r"slot 8 .*outside the pool") as raised:
        relay.stash_partial(torch.tensor([8]), torch.tensor([1]))
    assert "stale" not in str(raised.value)
