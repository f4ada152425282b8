"""What sglang 0.5.23 decides per algorithm or per staged request, as the faithful maps
declare it: extras a map is built not to relay, a staged request's fresh draft input,
n-gram's lack of a bonus token (so of a mixed batch), and how batches name every
row's request (a beam member's by its leader)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

from relay import RelayDebugError
from relay.maps.sglang_decode import (
    SglangDecodeBatch,
    SglangDecodeFutureMap,
    SglangDecodePayload,
)
from relay.maps.sglang_eagle import (
    SglangEagleBatch,
    SglangEagleFutureMap,
    SglangEaglePayload,
)
from relay.maps.sglang_ngram import (
    SglangNgramBatch,
    SglangNgramFutureMap,
    SglangNgramPayload,
)
from relay.testing.model import ModelError
from relay.testing.sglang_reference import Req, SglangRelay, beam_rows

POOL = 6


def _slots(*values: int) -> Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _info(*slots: int, dsa: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        future_indices=_slots(*slots),
        future_dsa_topk_indices_available=dsa,
        bonus_tokens=None,
        topk_p=None,
        topk_index=None,
        hidden_states=None,
        draft_probs=None,
        dsa_topk_indices=None,
    )


def _everything(bonus: int) -> dict[str, Tensor]:
    """One request's payload carrying every extra."""
    return {
        "bonus_tokens": torch.tensor([bonus]),
        "topk_p": torch.full((1, 2), 0.5),
        "topk_index": torch.ones(1, 2, dtype=torch.int64),
        "hidden_states": torch.ones(1, 3, dtype=torch.bfloat16),
        "draft_probs": torch.full((1, 4), 0.25),
        "dsa_topk_indices": torch.ones(1, 2, dtype=torch.int32),
    }


@pytest.mark.parametrize(
    ("switches", "handed"),
    [
        ({}, {"topk_p", "topk_index", "hidden_states", "draft_probs"}),
        ({"need_hidden_states": False}, {"topk_p", "topk_index", "draft_probs"}),
        ({"need_topk": False}, {"hidden_states"}),
        ({"need_topk": False, "need_hidden_states": False}, set()),
    ],
)
def test_a_map_relays_only_the_extras_its_algorithm_needs(
    switches: dict[str, bool], handed: set[str]
) -> None:
    """Payloads carry every extra; the map allocates, writes and hands over only those
    it is built to relay, as sglang's model does (draft probabilities are kept without
    top-k and never handed), and debug mode is silent."""
    relay = SglangEagleFutureMap("cpu", POOL, debug=True, **switches)
    model = SglangRelay("eagle", **switches)
    payload = _everything(4)
    relay.stash(_slots(2), SglangEaglePayload(**payload))
    model.stash([2], payload)
    got = SimpleNamespace(spec_info=_info(2), reqs=[Req("a")])
    want = SimpleNamespace(spec_info=_info(2), reqs=[Req("a")])
    relay.resolve_future(got)
    model.resolve_spec_extras(want)
    for name in ("topk_p", "topk_index", "hidden_states", "draft_probs"):
        value, expected = getattr(got.spec_info, name), getattr(want.spec_info, name)
        assert (value is not None) == (name in handed), name
        assert (expected is not None) == (name in handed), name
        if value is not None:
            assert torch.equal(value, expected)
    assert (relay.hidden_states_buf is None) == (
        switches.get("need_hidden_states") is False
    )
    assert (relay.topk_p_buf is None) == (switches.get("need_topk") is False)
    assert relay.draft_probs_buf is not None  # sglang allocates it whatever top-k does


def test_a_switch_takes_a_bool() -> None:
    """A switch given anything but a bool is refused at construction, named."""
    with pytest.raises(
        TypeError,
        match=r"SglangEagleFutureMap: need_topk must be a bool saying whether this map "
        r"relays the fields switched by it \(got 1 of type int\); pass need_topk=True "
        r"or need_topk=False",
    ):
        SglangEagleFutureMap("cpu", POOL, need_topk=1)  # type: ignore[arg-type]


def _staged(relay: SglangEagleFutureMap, *, dsa_in_prefill: bool) -> SimpleNamespace:
    """Slot 3's first request (``r1``) stashes and reads its sparse indices, then ends.
    A new request in slot 3 (``r2``) is prefilled (its payload carrying the indices or
    not), waits in the staging area, and leaves it: its last token stashed alone, a
    fresh draft input from ``make_staged_spec_input``, then the decode's read."""
    first, second = [Req("r1")], [Req("r2")]
    relay.stash(_slots(3), SglangEaglePayload(**_everything(4)), owners=first)
    relay.resolve_future(SimpleNamespace(spec_info=_info(3, dsa=True), reqs=first))
    relay.release(_slots(3))
    prefill = _everything(5)
    if not dsa_in_prefill:
        del prefill["dsa_topk_indices"]
    relay.stash(_slots(3), SglangEaglePayload(**prefill), owners=second)
    last = SglangEaglePayload(bonus_tokens=torch.tensor([6]))
    relay.stash(_slots(3), last, owners=second)
    handle = SimpleNamespace(**vars(_info()))
    handle.future_indices = None
    relay.make_staged_spec_input(_slots(3), handle)
    batch = SimpleNamespace(spec_info=handle, reqs=second)
    relay.resolve_future(batch)
    return batch


def test_a_staged_draft_input_says_the_buffer_exists() -> None:
    """The fresh input holds the slots and flags the sparse indices where the map
    carries them, as sglang's does; the decode reads the request's rows."""
    batch = _staged(SglangEagleFutureMap("cpu", POOL, debug=True), dsa_in_prefill=True)
    info = batch.spec_info
    assert info.future_indices.tolist() == [3]
    assert info.future_dsa_topk_indices_available is True
    assert info.bonus_tokens.tolist() == [6]
    assert info.topk_p.tolist() == [[0.5, 0.5]]
    fresh = SglangEagleFutureMap("cpu", POOL)
    handle = _info()
    fresh.make_staged_spec_input(_slots(1), handle)
    assert handle.future_dsa_topk_indices_available is False
    model = SglangRelay("eagle")
    assert not model.make_staged_spec_input(_slots(1)).future_dsa_topk_indices_available
    with pytest.raises(ModelError, match="EAGLE-family draft inputs only"):
        SglangRelay("ngram").make_staged_spec_input(_slots(1))


def test_a_staged_request_whose_prefill_held_no_sparse_indices() -> None:
    """sglang's fresh input flags the indices because the buffer exists. sglang never
    stages such a request (one worker setting decides both that the buffer exists and
    that every prefill carries the indices; docs/sglang.md), so this is an engine that
    dropped them: it is handed the slot's earlier request's rows, debug off as in
    sglang, and debug mode names the field, the slot and the request."""
    quiet = _staged(SglangEagleFutureMap("cpu", POOL), dsa_in_prefill=False)
    assert quiet.spec_info.dsa_topk_indices.tolist() == [[1, 1]]
    with pytest.raises(
        RelayDebugError,
        match=r"dsa_topk_indices: slot 3: resolve_future reads a row that was not "
        r"written since it was last consumed .*\(read for request 'r2', position 0\)",
    ):
        _staged(SglangEagleFutureMap("cpu", POOL, debug=True), dsa_in_prefill=False)


def test_ngram_relays_no_bonus_token_and_runs_no_mixed_batch() -> None:
    """sglang's n-gram stash carries no bonus token and its server arguments turn
    mixed chunked prefill off (the mixed batch's token gather would find none): the
    faithful map has neither, and the model refuses a mixed batch."""
    assert "bonus_tokens" not in SglangNgramPayload.__annotations__
    assert not hasattr(SglangNgramFutureMap, "resolve_tails")
    assert not hasattr(SglangNgramFutureMap, "stash_partial")
    model = SglangRelay("ngram", req_to_token=torch.zeros(POOL, 8, dtype=torch.int64))
    mixed = SimpleNamespace(
        prefill_input_ids=torch.tensor([1, 2]),
        mix_running_indices=_slots(2),
        spec_info=None,
    )
    with pytest.raises(ModelError, match="no mixed batch with n-gram"):
        model.resolve_forward_inputs(mixed)
    with pytest.raises(ModelError, match="no mixed batch with n-gram"):
        model.resolve_mixed_spec_tails(mixed)


def test_plain_decoding_names_beam_rows_by_their_leader() -> None:
    """Under beam search sglang's decode batch appends its beam members' slots after
    the rows of its ``reqs`` (stashed apart, by the beam coordinator) and lists them in
    ``beam_tail``: ``sglang_decode`` declares both, reads such a batch with debug mode
    silent, and takes a member row's request to be its leader's."""
    relay = SglangDecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(
        _slots(1, 2),
        SglangDecodePayload(bonus_tokens=torch.tensor([6, 7])),
        owners=[Req("r1"), Req("beam")],
    )
    relay.stash(
        _slots(2, 4, 5),
        SglangDecodePayload(bonus_tokens=torch.tensor([7, 8, 9])),
        owners=[Req("beam")] * 3,
    )
    rows, tail = beam_rows([1, 2], {2: [4, 5]})
    assert rows == [1, 2, 4, 5]
    batch = SimpleNamespace(
        req_pool_indices=_slots(*rows),
        reqs=[Req("r1"), Req("beam")],
        beam_tail=tail,
        input_ids=None,
    )
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [6, 7, 8, 9]
    assert "reqs" in SglangDecodeBatch.__dict__
    assert "beam_tail" in SglangDecodeBatch.__dict__
    assert "beam_tail" not in SglangEagleBatch.__dict__
    assert "beam_tail" not in SglangNgramBatch.__dict__


def test_a_beam_tail_that_misses_rows_is_refused() -> None:
    """Rows past the batch's requests that the tail does not list, or a tail whose
    entries do not follow the rows, are refused by name in debug mode; a map whose
    owners are a plain path keeps one request per row (sglang's speculative maps)."""
    relay = SglangDecodeFutureMap("cpu", POOL, debug=True)
    relay.stash(_slots(1, 4), SglangDecodePayload(bonus_tokens=torch.tensor([6, 8])))
    batch = SimpleNamespace(
        req_pool_indices=_slots(1, 4), reqs=[Req("r1")], beam_tail=None, input_ids=None
    )
    with pytest.raises(
        RelayDebugError,
        match=r"SglangDecodeFutureMap.resolve_future: owners must name one request "
        r"per row: 2 rows, but the requests name 1 and the tail 0 member row\(s\)",
    ):
        relay.resolve_future(batch)
    _, tail = beam_rows([1], {1: [4]})
    assert tail is not None
    tail.entries = [tail.entries[0]._replace(start=1, end=2)]
    batch.beam_tail = tail
    with pytest.raises(
        RelayDebugError,
        match=r"SglangDecodeFutureMap.resolve_future: the member tail's entry 0 "
        r"\(leader_idx=0, start=1, end=2\) does not follow its rows",
    ):
        relay.resolve_future(batch)
    eagle = SglangEagleFutureMap("cpu", POOL, debug=True)
    eagle.stash(_slots(1, 4), SglangEaglePayload(bonus_tokens=torch.tensor([6, 8])))
    info = SimpleNamespace(
        future_indices=_slots(1, 4), future_dsa_topk_indices_available=False
    )
    with pytest.raises(
        RelayDebugError, match=r"owners must name one request per row: 2 rows, 1 owners"
    ):
        eagle.resolve_future(SimpleNamespace(spec_info=info, reqs=[Req("r1")]))
