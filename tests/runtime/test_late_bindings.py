"""Graph-written buffers, partial stashes, stream-ordered reads and late-bound tails, on
the generated map of tests/golden/schemas/late.py: what each hands over, what it costs,
and the planted bug debug mode names for each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from relay.codegen.loader import load_schema
from relay.debug.checks import DebugCheckFailed
from relay.device import Fence
from relay.errors import RelayError
from relay.opcount import count_ops
from relay.testing import check_lockstep
from relay.testing.lockstep import Namespace, load_map_class

SCHEMA = load_schema(
    Path(__file__).resolve().parents[1] / "golden" / "schemas" / "late.py",
    "tests/golden/schemas/late.py",
)
LATE = load_map_class(SCHEMA)
PAYLOAD = __import__(LATE.__module__).LatePayload
POOL = 9
SLOTS = torch.tensor([2, 5])
RIDS = [20, 50]


def new_map(debug: bool, **buffers: torch.Tensor) -> Any:
    """A late map of ``POOL`` rows, top-k 2."""
    return LATE("cpu", POOL, topk=2, debug=debug, **buffers)


def payload(bonus: torch.Tensor | None, topk: float, **extra: Any) -> Any:
    """A stash payload for ``SLOTS``."""
    return PAYLOAD(bonus_tokens=bonus, topk_p=torch.full((2, 2), topk), **extra)


def batch(**extra: Any) -> Namespace:
    """A batch of ``SLOTS``."""
    return Namespace(req_pool_indices=SLOTS, rids=RIDS, spec_info=Namespace(), **extra)


def test_a_step_the_graph_wrote_dispatches_no_scatter_for_it() -> None:
    """The adopted buffer is the engine's; with the graph's value left out (None) the
    stash dispatches one index_copy_ fewer and the map reads what the graph wrote."""
    engine_buf = torch.zeros(POOL, dtype=torch.int64)
    relay = new_map(False, output_tokens_buf=engine_buf)
    assert relay.output_tokens_buf is engine_buf
    full = count_ops(lambda: relay.stash(SLOTS, payload(torch.tensor([1, 2]), 0.5)))
    engine_buf[SLOTS] = torch.tensor([7, 8])  # the graph's scatter
    relay.graph_wrote(SLOTS)
    left = count_ops(lambda: relay.stash(SLOTS, payload(None, 0.5)))
    assert full.data.count("index_copy_") == left.data.count("index_copy_") + 1
    b = batch()
    relay.resolve_future(b)
    assert b.spec_info.bonus_tokens.tolist() == [7, 8]
    lens_buf = torch.zeros(POOL, dtype=torch.int64)
    relay = new_map(False, new_seq_lens_buf=lens_buf)
    ops = count_ops(lambda: relay.publish(SLOTS, None))
    assert "index_copy_" not in ops.data


@pytest.mark.parametrize(
    ("buf", "why"),
    [
        (torch.zeros(POOL, dtype=torch.int32), "must be a torch.int64 tensor"),
        (torch.zeros(POOL + 1, dtype=torch.int64), "of shape (9,)"),
    ],
)
def test_an_adopted_buffer_that_does_not_fit_is_refused(
    buf: torch.Tensor, why: str
) -> None:
    """A buffer of another dtype or shape is refused at construction, naming the field."""
    with pytest.raises(RelayError, match=r"LateFutureMap.output_tokens") as caught:
        new_map(False, output_tokens_buf=buf)
    assert why in str(caught.value)


def test_debug_mode_poisons_an_adopted_buffer_in_place() -> None:
    """The graph's captured address stays the buffer: debug mode fills it, it is not
    replaced."""
    engine_buf = torch.zeros(POOL, dtype=torch.int64)
    relay = new_map(True, output_tokens_buf=engine_buf)
    assert relay.output_tokens_buf is engine_buf
    assert engine_buf.tolist() == [-1] * POOL


def test_planted_bug_a_graph_written_row_read_before_the_graph_ran() -> None:
    """The stash left the bonus token to the graph, and the resolve came before
    graph_wrote: debug mode names it; in the right order the read passes."""
    relay = new_map(True)
    relay.stash(SLOTS, payload(torch.tensor([1, 2]), 0.5), owners=RIDS)
    relay.resolve_future(batch())
    relay.stash(SLOTS, payload(None, 0.25), owners=RIDS)
    with pytest.raises(DebugCheckFailed, match="graph_wrote") as caught:
        relay.resolve_future(batch())
    assert str(caught.value).startswith(
        "LateFutureMap.output_tokens: slot 2: resolve_future reads a row a captured "
        "graph writes, but it holds no value to take (its value was already read)"
    )
    relay = new_map(True)
    relay.stash(SLOTS, payload(None, 0.25), owners=RIDS)
    relay.output_tokens_buf[SLOTS] = torch.tensor([3, 4])
    relay.graph_wrote(SLOTS, owners=RIDS)
    b = batch()
    relay.resolve_future(b)
    assert b.spec_info.bonus_tokens.tolist() == [3, 4]


def test_a_partial_stash_keeps_the_kept_fields() -> None:
    """stash_partial writes the bonus token and keeps top-k and hidden states; an
    optional kept field left out of a full stash is kept too, not handed over as None."""
    for debug in (False, True):
        relay = new_map(debug)
        hidden = torch.ones(2, 3)
        relay.stash(SLOTS, payload(torch.tensor([1, 2]), 0.5, hidden_states=hidden))
        relay.stash_partial(SLOTS, torch.tensor([5, 6]))
        b = batch()
        relay.resolve_future(b)
        assert b.spec_info.bonus_tokens.tolist() == [5, 6]
        assert b.spec_info.topk_p.tolist() == [[0.5, 0.5]] * 2
        assert b.spec_info.hidden_states.tolist() == [[1.0] * 3] * 2
        relay.stash(SLOTS, payload(torch.tensor([1, 2]), 0.5, hidden_states=hidden * 2))
        relay.stash(SLOTS, payload(torch.tensor([1, 2]), 0.75))  # hidden left out
        relay.resolve_future(b)
        assert b.spec_info.hidden_states.tolist() == [[2.0] * 3] * 2
        assert b.spec_info.topk_p.tolist() == [[0.75, 0.75]] * 2


def test_planted_bug_a_partial_stash_that_drops_a_kept_field() -> None:
    """A partial stash over rows whose kept values were already read would hand the
    next resolve stale top-k: debug mode names it before anything is written."""
    relay = new_map(True)
    relay.stash(SLOTS, payload(torch.tensor([1, 2]), 0.5), owners=RIDS)
    relay.resolve_future(batch())
    before = relay.output_tokens_buf.clone()
    with pytest.raises(DebugCheckFailed) as caught:
        relay.stash_partial(SLOTS, torch.tensor([5, 6]), owners=RIDS)
    assert str(caught.value).startswith(
        "LateFutureMap.topk_p: slot 2: stash_partial keeps this field's row, but it "
        "holds no value to keep (its value was already read)"
    )
    assert torch.equal(relay.output_tokens_buf, before)


def mixed(prefill: int = 2) -> Namespace:
    """A mixed batch: ``prefill`` prefill rows, then the decode rows of ``SLOTS``."""
    n = prefill + len(SLOTS)
    return Namespace(
        req_pool_indices=SLOTS,
        rids=RIDS,
        mix_running_indices=SLOTS,
        seq_lens=torch.full((n,), 9),
        seq_lens_cpu=torch.full((n,), 9),
        seq_lens_sum=9 * n,
        out_cache_loc=torch.arange(n, dtype=torch.int32),
        req_to_token=torch.arange(POOL * 100).reshape(POOL, 100),
        prefix_lens=[8] * n,
    )


def test_tails_are_bound_from_the_published_lengths() -> None:
    """The decode rows' lengths become published + 1, their KV locations
    req_to_token[slot, published], the host copy and sum follow, and their prefix
    lengths the published ones; the prefill rows and the batch's own tensors and list
    are left alone."""
    for debug in (False, True):
        relay = new_map(debug)
        relay.publish(SLOTS, torch.tensor([30, 40]), owners=RIDS)
        b = mixed()
        own, own_prefix = b.seq_lens, b.prefix_lens
        relay.resolve_tails(b)
        assert b.seq_lens.tolist() == [9, 9, 31, 41]
        assert b.seq_lens_cpu.tolist() == [9, 9, 31, 41]
        assert b.seq_lens_sum == 90
        assert b.out_cache_loc.tolist() == [0, 1, 230, 540]
        assert b.out_cache_loc.dtype == torch.int32
        assert own.tolist() == [9, 9, 9, 9]
        assert b.prefix_lens == [8, 8, 30, 40]
        assert own_prefix == [8, 8, 8, 8]
        relay.resolve_seq_lens_cpu(batch(seq_lens=None, seq_lens_cpu=None))


def test_a_refused_tail_leaves_the_batch_as_it_was() -> None:
    """A tail that cannot be bound (the batch's KV locations shorter than its decode
    rows) is refused before any of the batch's attributes is rebound."""
    relay = new_map(False)
    relay.publish(SLOTS, torch.tensor([30, 40]))
    b = mixed()
    b.out_cache_loc = torch.arange(1, dtype=torch.int32)
    before = dict(vars(b))
    with pytest.raises(
        RelayError,
        match=r"^LateFutureMap\.new_seq_lens: batch\.out_cache_loc has 1 entries, but "
        "resolve_tails binds 2 decode rows",
    ):
        relay.resolve_tails(b)
    assert vars(b) == before  # the very same objects
    assert b.seq_lens.tolist() == [9, 9, 9, 9]


def test_a_prefix_list_shorter_than_the_decode_rows_is_refused() -> None:
    """The prefix list is the batch's too: shorter than its decode rows, refused with
    the batch as it was."""
    relay = new_map(False)
    relay.publish(SLOTS, torch.tensor([30, 40]))
    b = mixed()
    b.prefix_lens = [8]
    before = dict(vars(b))
    with pytest.raises(
        RelayError,
        match=r"^LateFutureMap\.new_seq_lens: batch\.prefix_lens has 1 entries, but "
        "resolve_tails binds 2 decode rows",
    ):
        relay.resolve_tails(b)
    assert vars(b) == before


def test_planted_bug_a_stale_tail() -> None:
    """Tails bound after the schedule resolve consumed the lengths would carry a stale
    length: debug mode names it."""
    relay = new_map(True)
    relay.publish(SLOTS, torch.tensor([30, 40]), owners=RIDS)
    relay.resolve_seq_lens_cpu(batch(seq_lens=None, seq_lens_cpu=None))
    with pytest.raises(DebugCheckFailed) as caught:
        relay.resolve_tails(mixed())
    assert str(caught.value).startswith(
        "LateFutureMap.new_seq_lens: slot 2: resolve_tails binds a decode tail from a "
        "row that holds no published value to take (its value was already read)"
    )


class _Policy:
    """A device policy that records which wait it was asked for."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def current_stream(self) -> str:
        return "stream"

    def new_event(self) -> object:
        return object()

    def record(self, event: object, stream: object) -> None:
        self.calls.append("record")

    def stream_wait(self, stream: object, event: object) -> None:
        self.calls.append("stream_wait")

    def wait(self, event: object) -> None:
        self.calls.append("wait")


def test_a_stream_ordered_read_waits_on_the_stream() -> None:
    """stream_ordered=True asks the fence for a device-side wait of the calling stream
    (never the policy's own wait, which blocks the host on HIP); without it the usual
    wait; the tails always wait on the stream."""
    relay = new_map(False)
    fence = Fence(torch.device("cpu"))
    policy = fence._policy = _Policy()  # type: ignore[assignment]
    relay._state.fence = fence
    relay.publish(SLOTS, torch.tensor([30, 40]))
    relay.resolve_seq_lens_cpu(batch(), stream_ordered=True)
    relay.resolve_seq_lens_cpu(batch())
    relay.resolve_tails(mixed())
    assert policy.calls == ["record", "stream_wait", "wait", "stream_wait"]


def test_the_late_schema_runs_in_lockstep_with_the_model() -> None:
    """Graph steps, partial stashes, stream-ordered reads and tails, against the
    reference model, debug on."""
    assert check_lockstep(SCHEMA, LATE, operations=600, shrink=False) == 600
