"""Planted bugs of an sglang-0.5.23-style loop driving the faithful maps: each hands
the next step a wrong value with debug off (the sglang model says which), and debug
mode names it, the field, the slot and the request (by the ``rid`` of the batch's
``reqs``, as sglang's batches hold them; a beam member's slot past them as a member row
of its leader's request); the same loop without the plant runs clean."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

from relay import RelayDebugError
from relay.maps.sglang_decode import SglangDecodeFutureMap, SglangDecodePayload
from relay.maps.sglang_eagle import SglangEagleFutureMap, SglangEaglePayload
from relay.maps.sglang_ngram import SglangNgramFutureMap, SglangNgramPayload
from relay.testing.sglang_reference import BeamTail, Req, SglangRelay, beam_rows

POOL = 6
TABLE = torch.arange(POOL * 64).reshape(POOL, 64)


def _slots(*values: int) -> Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _reqs(*slots: int, rids: Sequence[str] = ()) -> list[Req]:
    """The batch's requests: ``rids``, else ``req<slot>`` for each slot."""
    return [Req(rid) for rid in rids] or [Req(f"req{slot}") for slot in slots]


def _batch(*slots: int, rids: Sequence[str] = ()) -> SimpleNamespace:
    indices = _slots(*slots)
    info = SimpleNamespace(
        future_indices=indices, future_dsa_topk_indices_available=False
    )
    return SimpleNamespace(
        req_pool_indices=indices,
        spec_info=info,
        req_to_token=TABLE,
        reqs=_reqs(*slots, rids=rids),
    )


def _payload(
    n: int, *, topk: bool = True, bonus: Tensor | None = None
) -> SglangEaglePayload:
    return SglangEaglePayload(
        bonus_tokens=torch.arange(10, 10 + n) if bonus is None else bonus,
        topk_p=torch.rand(n, 2) if topk else None,
        topk_index=torch.randint(0, 9, (n, 2)) if topk else None,
    )


def _adopted() -> dict[str, Tensor]:
    return {
        "output_tokens_buf": torch.zeros(POOL, dtype=torch.int64),
        "new_seq_lens_buf": torch.zeros(POOL, dtype=torch.int64),
    }


def _graph_step(
    relay: SglangEagleFutureMap, buffers: dict[str, Tensor], *, planted: bool
) -> None:
    """Step 1 verifies slots 1 and 2 through the captured graph, which scatters the
    lengths and bonus tokens into the adopted buffers; publish and stash skip them.
    The plant: the graph's replay is skipped (the engine took another path) while
    publish and stash still pass ``None``."""
    slots = _slots(1, 2)
    if not planted:
        buffers["new_seq_lens_buf"][slots] = torch.tensor([5, 7])
        buffers["output_tokens_buf"][slots] = torch.tensor([11, 12])
        relay.graph_wrote(slots)
    relay.publish(slots, None)
    relay.stash(slots, SglangEaglePayload(bonus_tokens=None))


@pytest.mark.parametrize("planted", [False, True])
def test_a_graph_written_row_read_before_the_graph_ran(planted: bool) -> None:
    """Debug off, the skipped replay hands the scheduler the adopted buffer's stale
    zeros as lengths; debug on names the field, the slot and the request."""
    buffers = _adopted()
    quiet = SglangEagleFutureMap("cpu", POOL, **buffers)
    _graph_step(quiet, buffers, planted=planted)
    batch = _batch(1, 2)
    quiet.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == ([0, 0] if planted else [5, 7])
    buffers = _adopted()
    checked = SglangEagleFutureMap("cpu", POOL, debug=True, **buffers)
    _graph_step(checked, buffers, planted=planted)
    if not planted:
        checked.resolve_seq_lens_cpu(_batch(1, 2))
        return
    with pytest.raises(
        RelayDebugError,
        match=r"new_seq_lens: slot 1: .*graph.* \(read for request 'req1', position 0\)",
    ):
        checked.resolve_seq_lens_cpu(_batch(1, 2))


def _staging(relay: SglangEagleFutureMap | SglangRelay, *, planted: bool) -> None:
    """Slot 3's request verifies (top-k stashed) and its next step reads it; it ends and
    a new request takes slot 3, whose prefill stashes no top-k (the plant: the engine
    drops the kept field from that stash), and rides in a mixed batch with overlap off,
    its last token stashed alone (sglang's ``stash_bonus_tokens``)."""
    first = {
        "bonus_tokens": torch.tensor([4]),
        "topk_p": torch.ones(1, 2),
        "topk_index": torch.ones(1, 2, dtype=torch.int64),
    }
    second = {
        "bonus_tokens": torch.tensor([5]),
        "topk_p": None if planted else torch.zeros(1, 2),
        "topk_index": None if planted else torch.zeros(1, 2, dtype=torch.int64),
    }
    if isinstance(relay, SglangRelay):
        relay.stash([3], first)
        relay.resolve_spec_extras(_batch(3))
        relay.stash([3], second)
        relay.stash_bonus_tokens([3], torch.tensor([6]))
        return
    old, new = _reqs(rids=["old3"]), _reqs(rids=["new3"])
    relay.stash(_slots(3), SglangEaglePayload(**first), owners=old)
    relay.resolve_future(_batch(3, rids=["old3"]))
    relay.release(_slots(3))
    relay.stash(_slots(3), SglangEaglePayload(**second), owners=new)
    # The running batch's requests, at hand where sglang stashes their last tokens.
    relay.stash_partial(_slots(3), torch.tensor([6]), owners=new)


@pytest.mark.parametrize("planted", [False, True])
def test_a_partial_stash_that_drops_a_kept_field(planted: bool) -> None:
    """Debug off, the new request's draft reads the previous owner's top-k (as sglang
    would); debug on reports the kept row at the partial stash, naming the request."""
    model = SglangRelay("eagle")
    _staging(model, planted=planted)
    quiet = SglangEagleFutureMap("cpu", POOL)
    _staging(quiet, planted=planted)
    got, want = _batch(3, rids=["new3"]), _batch(3, rids=["new3"])
    quiet.resolve_future(got)
    model.resolve_spec_extras(want)
    assert torch.equal(got.spec_info.topk_p, want.spec_info.topk_p)
    assert torch.equal(
        got.spec_info.topk_p, torch.ones(1, 2) if planted else torch.zeros(1, 2)
    )
    checked = SglangEagleFutureMap("cpu", POOL, debug=True)
    if not planted:
        _staging(checked, planted=False)
        checked.resolve_future(_batch(3, rids=["new3"]))
        return
    with pytest.raises(
        RelayDebugError,
        match=r"topk_p: slot 3: stash_partial keeps .* "
        r"\(for request 'new3', position 0\)",
    ):
        _staging(checked, planted=True)


def _mixed(relay: SglangEagleFutureMap, *, planted: bool) -> SimpleNamespace:
    """Slot 2 decodes (the scheduler resolves its lengths); the next batch is mixed,
    slot 2 a decode tail. The plant: the tails are bound before the in-flight step
    publishes slot 2's new length, from the row the scheduler already consumed."""
    relay.publish(_slots(2), torch.tensor([9]))
    relay.stash(_slots(2), _payload(1))
    relay.resolve_seq_lens_cpu(_batch(2))
    relay.resolve_future(_batch(2))
    mixed = _batch(4, 2)
    mixed.mix_running_indices = _slots(2)
    mixed.seq_lens = torch.tensor([3, 9])
    mixed.seq_lens_cpu = mixed.seq_lens.clone()
    mixed.seq_lens_sum = 12
    mixed.prefix_lens = [2, 8]
    mixed.out_cache_loc = torch.tensor([100, 101])
    if not planted:
        relay.publish(_slots(2), torch.tensor([11]))
    relay.resolve_tails(mixed)
    return mixed


@pytest.mark.parametrize("planted", [False, True])
def test_a_stale_tail(planted: bool) -> None:
    """Debug off, the tail binds the old length (9, so position 9 of the table, not
    11); debug on names the field, the slot and the tail's request at resolve_tails
    (the batch's last request: the tails are its last rows)."""
    quiet = _mixed(SglangEagleFutureMap("cpu", POOL), planted=planted)
    length = 9 if planted else 11
    assert quiet.seq_lens.tolist() == [3, length + 1]
    assert quiet.out_cache_loc.tolist() == [100, int(TABLE[2, length])]
    assert quiet.prefix_lens == [2, length]
    checked = SglangEagleFutureMap("cpu", POOL, debug=True)
    if not planted:
        _mixed(checked, planted=False)
        return
    with pytest.raises(
        RelayDebugError,
        match=r"new_seq_lens: slot 2: resolve_tails binds .* "
        r"\(for request 'req2', position 0\)",
    ):
        _mixed(checked, planted=True)


def _reused(relay: SglangEagleFutureMap, *, flag: bool) -> SimpleNamespace:
    """Slot 3's request stashes sparse indices and its next step reads them; it ends,
    and a new request in slot 3 stashes none (its prefill). The plant: the engine sets
    the draft input's flag from "the buffer exists", not from what the step stashed."""
    dsa = torch.ones(1, 2, dtype=torch.int32)
    relay.stash(_slots(3), SglangEaglePayload(**_extras(4), dsa_topk_indices=dsa))
    first = _batch(3, rids=["old3"])
    first.spec_info.future_dsa_topk_indices_available = True
    relay.resolve_future(first)
    relay.release(_slots(3))
    relay.stash(_slots(3), SglangEaglePayload(**_extras(5)))
    batch = _batch(3, rids=["new3"])
    batch.spec_info.future_dsa_topk_indices_available = flag
    relay.resolve_future(batch)
    return batch


def _extras(bonus: int) -> dict[str, Tensor]:
    return {
        "bonus_tokens": torch.tensor([bonus]),
        "topk_p": torch.ones(1, 2),
        "topk_index": torch.ones(1, 2, dtype=torch.int64),
    }


@pytest.mark.parametrize("planted", [False, True])
def test_a_reused_slot_read_through_a_flag_set_for_the_buffer(planted: bool) -> None:
    """As sglang sets it, the flag is unset for the new request and the map hands None
    (debug mode silent); set because the buffer exists, debug off hands the previous
    request's indices (the -1 poison aside), and debug on names the field, the slot
    and the new request."""
    quiet = _reused(SglangEagleFutureMap("cpu", POOL), flag=planted)
    if not planted:
        assert quiet.spec_info.dsa_topk_indices is None
        _reused(SglangEagleFutureMap("cpu", POOL, debug=True), flag=False)
        return
    assert quiet.spec_info.dsa_topk_indices.tolist() == [[1, 1]]
    with pytest.raises(
        RelayDebugError,
        match=r"dsa_topk_indices: slot 3: resolve_future reads a row that was not "
        r"written since it was last consumed .*\(read for request 'new3', position 0\)",
    ):
        _reused(SglangEagleFutureMap("cpu", POOL, debug=True), flag=True)


def _probs_step(relay: SglangEagleFutureMap, *, topk: bool) -> SimpleNamespace:
    """Slot 3's request stashes draft probabilities (beside top-k or alone) and its
    next step reads its draft input."""
    probs = torch.full((1, 5), 0.25)
    extras = _extras(4) if topk else {"bonus_tokens": torch.tensor([4])}
    relay.stash(_slots(3), SglangEaglePayload(**extras, draft_probs=probs))
    batch = _batch(3)
    relay.resolve_future(batch)
    return batch


@pytest.mark.parametrize("planted", [False, True])
def test_draft_probs_stashed_without_topk(planted: bool) -> None:
    """sglang reads the draft probabilities only beside top-k: stashed alone, the map
    hands None and debug mode is silent. The plant: a run with top-k whose loop drops
    a reused slot's new probabilities; debug mode names the field, the slot and the
    new request."""
    alone = _probs_step(SglangEagleFutureMap("cpu", POOL, debug=True), topk=False)
    assert alone.spec_info.draft_probs is None
    model = SglangRelay("eagle", req_to_token=TABLE, confidence=False)
    model.stash(
        [3], {"bonus_tokens": torch.tensor([4]), "draft_probs": torch.ones(1, 5)}
    )
    want = _batch(3)
    model.resolve_spec_extras(want)  # the draft input's own default stays: None
    assert getattr(want.spec_info, "draft_probs", None) is None
    relay = SglangEagleFutureMap("cpu", POOL, debug=True)
    beside = _probs_step(relay, topk=True)
    assert beside.spec_info.draft_probs.tolist() == [[0.25] * 5]
    relay.release(_slots(3))
    probs = None if planted else torch.ones(1, 5)
    relay.stash(_slots(3), SglangEaglePayload(**_extras(5), draft_probs=probs))
    if not planted:
        relay.resolve_future(_batch(3, rids=["new3"]))
        return
    with pytest.raises(
        RelayDebugError,
        match=r"draft_probs: slot 3: resolve_future reads a row that was not "
        r"written since it was last consumed .*\(read for request 'new3', position 0\)",
    ):
        relay.resolve_future(_batch(3, rids=["new3"]))


def _mixed_then_decode(
    relay: SglangEagleFutureMap, *, planted: bool
) -> tuple[SimpleNamespace, SimpleNamespace]:
    """Slot 3's verify stashes its bonus token and top-k; a mixed batch gathers its
    decode token (a partial read: sglang's mixed path reads no extra); a partial stash
    refreshes the token, keeping top-k; the next decode reads both. The plant: the
    partial stash is skipped, so the decode reads the token the mixed batch consumed."""
    relay.stash(_slots(3), SglangEaglePayload(**_extras(4)))
    mixed = _batch(3)
    relay.resolve_future(mixed, partial=True)
    if not planted:
        relay.stash_partial(_slots(3), torch.tensor([5]))
    decode = _batch(3)
    relay.resolve_future(decode)
    return mixed, decode


@pytest.mark.parametrize("planted", [False, True])
def test_a_mixed_batch_reads_only_its_decode_tokens(planted: bool) -> None:
    """The mixed batch is handed the token and no extra, and the kept top-k reaches the
    next decode with debug mode silent; a full read there would consume top-k, which
    debug mode then reports at the partial stash. Planted, debug mode names the bonus
    token, the slot and the request."""
    if planted:
        with pytest.raises(
            RelayDebugError,
            match=r"output_tokens: slot 3: resolve_future reads a row that was not "
            r"written since it was last consumed .*"
            r"\(read for request 'req3', position 0\)",
        ):
            _mixed_then_decode(
                SglangEagleFutureMap("cpu", POOL, debug=True), planted=True
            )
        return
    relay = SglangEagleFutureMap("cpu", POOL, debug=True)
    mixed, decode = _mixed_then_decode(relay, planted=False)
    assert mixed.spec_info.bonus_tokens.tolist() == [4]
    assert mixed.spec_info.topk_p is None and mixed.spec_info.topk_index is None
    assert decode.spec_info.bonus_tokens.tolist() == [5]
    assert decode.spec_info.topk_p.tolist() == [[1.0, 1.0]]
    full = SglangEagleFutureMap("cpu", POOL, debug=True)
    full.stash(_slots(3), SglangEaglePayload(**_extras(4)))
    full.resolve_future(_batch(3))
    with pytest.raises(RelayDebugError, match=r"topk_p: slot 3: stash_partial keeps"):
        full.stash_partial(_slots(3), torch.tensor([5]))


def _swapped(relay: SglangEagleFutureMap, *, planted: bool) -> SimpleNamespace:
    """Requests ``req1`` and ``req2`` verify in slots 1 and 2, each stash naming its
    requests; the next batch filters its requests. The plant: the filter reorders
    ``reqs`` but not the draft input's ``future_indices``, so each request's row
    goes to the other: fresh values, each the wrong one."""
    relay.stash(_slots(1, 2), _payload(2), owners=_reqs(1, 2))
    batch = _batch(1, 2)
    if planted:
        batch.reqs = _reqs(rids=["req2", "req1"])
    relay.resolve_future(batch)
    return batch


@pytest.mark.parametrize("planted", [False, True])
def test_two_requests_handed_each_others_rows(planted: bool) -> None:
    """Debug off, each request drafts from the other's bonus token (sglang's gather
    by slot does the same); each value is fresh, so only the request ids tell: debug
    mode names both requests."""
    quiet = _swapped(SglangEagleFutureMap("cpu", POOL), planted=planted)
    assert quiet.spec_info.bonus_tokens.tolist() == [10, 11]
    checked = SglangEagleFutureMap("cpu", POOL, debug=True)
    if not planted:
        _swapped(checked, planted=False)
        return
    with pytest.raises(
        RelayDebugError,
        match=r"output_tokens: slot 1: resolve_future reads it for request 'req2' "
        r"\(position 0\), but stash wrote it for request 'req1'",
    ):
        _swapped(checked, planted=True)


def _ngram_steps(relay: SglangNgramFutureMap, *, planted: bool) -> SimpleNamespace:
    """Slot 2's request verifies, and its next step reads the accepted drafts; that
    step verifies again and the one after reads. The plant: the second verify's stash
    is lost (the engine skipped ``stash`` for a step)."""
    payload = SglangNgramPayload(
        accept_tokens=torch.tensor([[7, 8, 9]]), accept_lens=torch.tensor([2])
    )
    relay.stash(_slots(2), payload)
    relay.resolve_future(_batch(2))
    if not planted:
        again = SglangNgramPayload(
            accept_tokens=torch.tensor([[4, 5, 6]]), accept_lens=torch.tensor([1])
        )
        relay.stash(_slots(2), again)
    batch = _batch(2)
    relay.resolve_future(batch)
    return batch


@pytest.mark.parametrize("planted", [False, True])
def test_an_ngram_step_read_without_its_stash(planted: bool) -> None:
    """Debug off, the request reads the drafts it already consumed (sglang's gather
    hands the same); debug mode names the field, the slot and the request."""
    quiet = _ngram_steps(SglangNgramFutureMap("cpu", POOL), planted=planted)
    lens = quiet.spec_info.accept_lens.tolist()
    assert lens == ([2] if planted else [1])
    checked = SglangNgramFutureMap("cpu", POOL, debug=True)
    if not planted:
        _ngram_steps(checked, planted=False)
        return
    with pytest.raises(
        RelayDebugError,
        match=r"accept_tokens: slot 2: resolve_future reads a row that "
        r"was not written since it was last consumed .*"
        r"\(read for request 'req2', position 0\)",
    ):
        _ngram_steps(checked, planted=True)


# -- plain decoding, beam search included (sglang_decode) ---------------------------------
def _decode_batch(
    slots: Sequence[int], reqs: Sequence[str], tail: BeamTail | None = None
) -> SimpleNamespace:
    """A decode batch as sglang builds it: ``reqs`` one per leading row, then any
    beam members' slots (``tail``)."""
    return SimpleNamespace(
        req_pool_indices=_slots(*slots),
        reqs=[Req(rid) for rid in reqs],
        beam_tail=tail,
        input_ids=None,
    )


def _decode(relay: SglangDecodeFutureMap | SglangRelay, batch: SimpleNamespace) -> None:
    if isinstance(relay, SglangRelay):
        relay.resolve_forward_inputs(batch)
    else:
        relay.resolve_future(batch)


def _stash(
    relay: SglangDecodeFutureMap | SglangRelay,
    slots: Sequence[int],
    tokens: Sequence[int],
    rids: Sequence[str],
) -> None:
    """A stash of ``tokens`` into ``slots``, naming ``rids`` (the map's debug mode)."""
    if isinstance(relay, SglangRelay):
        relay.stash(list(slots), {"bonus_tokens": torch.tensor(tokens)})
        return
    payload = SglangDecodePayload(bonus_tokens=torch.tensor(tokens))
    relay.stash(_slots(*slots), payload, owners=[Req(rid) for rid in rids])


#: A plain-decoding schedule run on a relay (sglang's or relay's), planted or not.
DecodeSteps = Callable[..., SimpleNamespace]


def _decode_plant(
    steps: DecodeSteps, planted: bool, tokens: list[int] | None, match: str
) -> None:
    """Debug off, relay's map hands ``steps``' batches the tokens sglang's relay hands
    (``tokens``, where given); debug on, the unplanted run is clean and the planted one
    is reported as ``match`` says."""
    want = steps(SglangRelay("decode"), planted=planted)
    got = steps(SglangDecodeFutureMap("cpu", POOL), planted=planted)
    assert torch.equal(got.input_ids, want.input_ids)
    if tokens is not None:
        assert got.input_ids.tolist() == tokens
    checked = SglangDecodeFutureMap("cpu", POOL, debug=True)
    if not planted:
        steps(checked, planted=False)
        return
    with pytest.raises(RelayDebugError, match=match):
        steps(checked, planted=True)


def _lost_stash(
    relay: SglangDecodeFutureMap | SglangRelay, *, planted: bool
) -> SimpleNamespace:
    """``r1`` (slot 1) and ``r2`` (slot 2) decode twice. The plant: the first decode's
    stash skips slot 2 (its sampled token dropped before the relay)."""
    _stash(relay, [1, 2], [5, 6], ["r1", "r2"])
    _decode(relay, _decode_batch([1, 2], ["r1", "r2"]))
    if planted:
        _stash(relay, [1], [7], ["r1"])
    else:
        _stash(relay, [1, 2], [7, 8], ["r1", "r2"])
    batch = _decode_batch([1, 2], ["r1", "r2"])
    _decode(relay, batch)
    return batch


@pytest.mark.parametrize("planted", [False, True])
def test_a_decode_step_read_without_its_token(planted: bool) -> None:
    """Debug off, ``r2`` decodes its previous token again (sglang's gather does the
    same); debug mode names the field, the slot and the request."""
    _decode_plant(
        _lost_stash,
        planted,
        ([7, 6] if planted else [7, 8]),
        r"output_tokens: slot 2: resolve_future reads a row that was not written "
        r"since it was last consumed .*\(read for request 'r2', position 1\)",
    )


def _beam_steps(
    relay: SglangDecodeFutureMap | SglangRelay, *, planted: bool
) -> SimpleNamespace:
    """``r1`` (slot 1) decodes beside the beam leader ``b`` (slot 2, members in slots
    4 and 5): each batch carries the members after its ``reqs``, its stash covers the
    ``reqs`` rows, and the group's selection overwrites the group's rows. The plant:
    the selection of the first decode is not relayed (the coordinator's hook returned
    early), so the members' rows hold nothing new."""
    rows, tail = beam_rows([1, 2], {2: [4, 5]})
    _stash(relay, [1, 2], [5, 6], ["r1", "b"])
    _stash(relay, [2, 4, 5], [6, 16, 26], ["b", "b", "b"])  # the leader's prefill
    _decode(relay, _decode_batch(rows, ["r1", "b"], tail))
    _stash(relay, [1, 2], [7, 8], ["r1", "b"])
    if not planted:
        _stash(relay, [2, 4, 5], [9, 19, 29], ["b", "b", "b"])
    batch = _decode_batch(rows, ["r1", "b"], tail)
    _decode(relay, batch)
    return batch


@pytest.mark.parametrize("planted", [False, True])
def test_a_beam_selection_not_relayed(planted: bool) -> None:
    """Debug off, the members decode their previous tokens again and the leader its
    sampled one, not the selection's; debug mode names the field, the member's slot,
    and the row as a member of the leader's request."""
    _decode_plant(
        _beam_steps,
        planted,
        ([7, 8, 16, 26] if planted else [7, 9, 19, 29]),
        r"output_tokens: slot 4: resolve_future reads a row that was not written "
        r"since it was last consumed .*"
        r"\(read for a member row of request 'b', position 2\)",
    )


def _overshoot(
    relay: SglangDecodeFutureMap | SglangRelay, *, planted: bool
) -> SimpleNamespace:
    """The beam leader ``b`` (slot 1, member in slot 3) finishes: the group's member
    slot is released and freed, and ``r2`` is admitted into slot 3 (its prefill
    stashes its first token). Under overlap the finished leader rides one more
    decode. The plant: that batch's tail still lists the retired group's member."""
    _stash(relay, [1, 3], [6, 16], ["b", "b"])
    rows, tail = beam_rows([1], {1: [3]})
    _decode(relay, _decode_batch(rows, ["b"], tail))
    _stash(relay, [1, 3], [7, 17], ["b", "b"])
    if isinstance(relay, SglangDecodeFutureMap):
        relay.release(_slots(3))  # the group ends; its member slot is freed
    _stash(relay, [3], [40], ["r2"])
    rows, tail = beam_rows([1], {1: [3]} if planted else {})
    batch = _decode_batch(rows, ["b"], tail)
    _decode(relay, batch)
    return batch


@pytest.mark.parametrize("planted", [False, True])
def test_a_retired_beam_group_rides_into_a_reused_slot(planted: bool) -> None:
    """Debug off, the overshoot step decodes ``r2``'s first token as the old member's
    (and its forward would write the member's KV into ``r2``'s row); debug mode names
    the slot, the reader as a member row of ``b`` and the writer ``r2``."""
    _decode_plant(
        _overshoot,
        planted,
        ([7, 40] if planted else [7]),
        r"output_tokens: slot 3: resolve_future reads it for a member row of "
        r"request 'b' \(position 1\), but stash wrote it for request 'r2'",
    )


def _filtered(
    relay: SglangDecodeFutureMap | SglangRelay, *, planted: bool
) -> SimpleNamespace:
    """``r1`` (slot 1) and the beam leader ``b`` (slot 2, member in slot 4) decode;
    the next batch is filtered. The plant: the filter reorders ``reqs`` but not
    ``req_pool_indices``, so each request's row goes to the other."""
    _stash(relay, [1, 2], [5, 6], ["r1", "b"])
    _stash(relay, [2, 4], [6, 16], ["b", "b"])
    rows, tail = beam_rows([1, 2], {2: [4]})
    reqs = ["b", "r1"] if planted else ["r1", "b"]
    batch = _decode_batch(rows, reqs, tail)
    _decode(relay, batch)
    return batch


@pytest.mark.parametrize("planted", [False, True])
def test_two_decode_requests_handed_each_others_rows(planted: bool) -> None:
    """Debug off, each request decodes the other's token (sglang's gather by slot does
    the same); the values are fresh, so only the request ids tell: debug mode names
    both requests."""
    _decode_plant(
        _filtered,
        planted,
        None,
        r"output_tokens: slot 1: resolve_future reads it for request 'b' "
        r"\(position 0\), but stash wrote it for request 'r1'",
    )
