"""Lines of relay that no test failed without: each test here fails when its line is
changed (a fence wait that does not wait, an adopted buffer left unzeroed, a seed's
counts not recorded, a wait not reported to the checker, generated seeds and reads that
move) and passes as relay is."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from relay_runtime_support import load_generated, thread_streams
from schedule_support import SEEDS, replaying

from relay import RelayDebugError
from relay.codegen.loader import load_schema
from relay.cpu_stream import CpuEvent, current_cpu_stream
from relay.maps.eagle import EagleFutureMap
from relay.schema import Field, IfNone, Lane, Schema, Unwritten
from relay.testing import Namespace, load_map_class

POOL = 6
SLOTS = torch.tensor([2, 5])

LATE = load_map_class(
    load_schema(
        Path(__file__).resolve().parents[1] / "golden" / "schemas" / "late.py",
        "tests/golden/schemas/late.py",
    )
)


def _late_batch() -> Namespace:
    return Namespace(req_pool_indices=SLOTS, rids=[20, 50], spec_info=Namespace())


def _mixed() -> Namespace:
    """A mixed batch whose decode rows, the last two, are ``SLOTS``."""
    return Namespace(
        req_pool_indices=SLOTS,
        rids=[20, 50],
        mix_running_indices=SLOTS,
        seq_lens=torch.full((3,), 9),
        seq_lens_cpu=torch.full((3,), 9),
        seq_lens_sum=27,
        out_cache_loc=torch.arange(3, dtype=torch.int32),
        req_to_token=torch.arange(POOL * 100).reshape(POOL, 100),
        prefix_lens=[8] * 3,
    )


def _stream_ordered_reads(relay: Any) -> list[list[int]]:
    """Publishes queued on a forward stream, each read at once by a stream-ordered
    resolve on the host (the first before the map's fence exists), then by the tails;
    what each read."""
    got = []
    with thread_streams("forward") as (forward,):
        for step, lens in enumerate(([30, 40], [31, 41], [32, 42])):
            value = torch.tensor(lens)
            forward.submit(lambda value=value: relay.publish(SLOTS, value))
            if step < 2:
                b = _late_batch()
                relay.resolve_seq_lens_cpu(b, stream_ordered=True)
                got.append(b.seq_lens.tolist())
            else:
                m = _mixed()
                relay.resolve_tails(m)
                got.append(m.seq_lens_cpu[-2:].tolist())
    return got


@pytest.mark.parametrize("debug", [False, True], ids=["CpuFence", "Fence"])
def test_stream_ordered_reads_wait_for_a_publish_launched_before_them(
    debug: bool,
) -> None:
    """``wait_on_stream`` on the CPU waits for a publish queued on a worker, also the
    first wait, before any publish ran and before the fence's event exists: in every
    seeded schedule the reads see each publish."""
    for seed in SEEDS:
        with replaying(seed):
            relay = LATE("cpu", POOL, topk=2, debug=debug)
            assert not relay._state.fence.created
            got = _stream_ordered_reads(relay)
        assert got == [[30, 40], [31, 41], [33, 43]], f"seed {seed}"


@pytest.mark.usefixtures("clocks_on")
def test_a_wait_after_the_publishing_stream_closed_orders_the_read() -> None:
    """The forward stream published and was closed; the scheduler's resolve then waits
    on the fence with no stream left: the wait is still reported to the happens-before
    checker, which does not call the read unordered."""
    relay = EagleFutureMap("cpu", POOL, topk=2, debug=True)
    with thread_streams("forward") as (forward,):
        forward.submit(lambda: relay.publish(SLOTS, torch.tensor([7, 9])))
    b = Namespace(req_pool_indices=SLOTS, spec_info=Namespace())
    relay.resolve_seq_lens_cpu(b)
    assert b.seq_lens.tolist() == [7, 9]


_ZEROS = Schema(
    name="AdoptedZerosFutureMap",
    doc="A graph-written field whose never-written rows read as zeros.",
    fields=[
        Field(
            "accept_lens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="accept_lens",
            target="accept_lens",
            graph_written=True,
            unwritten=Unwritten.ZEROS,
        ),
    ],
)


@pytest.mark.parametrize("debug", [False, True], ids=["debug off", "debug on"])
def test_an_adopted_buffer_of_a_zeros_field_is_zeroed(debug: bool) -> None:
    """The engine's buffer holds garbage when it is handed over; a row never written
    reads 0, as the field declares."""
    cls = load_map_class(_ZEROS)
    garbage = torch.full((POOL,), 77, dtype=torch.int64)
    relay = cls("cpu", POOL, accept_lens_buf=garbage, debug=debug)
    assert relay.accept_lens_buf is garbage
    b = Namespace(req_pool_indices=SLOTS)
    relay.resolve_future(b)
    assert b.accept_lens.tolist() == [0, 0]


def _seeded_drafts() -> Any:
    schema = Schema.bundled("vllm_drafts").derive(
        name="SeededDraftsFutureMap", doc="vLLM's drafts, seeded.", seeded=True
    )
    return load_map_class(schema)


def test_a_seeds_counts_bound_what_the_next_read_may_schedule() -> None:
    """Debug mode keeps the drafts each row carries; a seed's count is the row's from
    when the seed is written: a consumer scheduling more drafts than the seed carried
    is named, as after a stash."""
    cls = _seeded_drafts()
    relay = cls("cpu", POOL, num_speculative_tokens=3, debug=True)
    payload = typing.get_type_hints(cls.seed)["payload"]
    relay.seed(
        torch.tensor([2]),
        payload(
            sampled_token_ids=torch.tensor([11]),
            draft_token_ids=torch.tensor([[12, 13, 14]]),
            num_draft_tokens=torch.tensor([1]),
        ),
    )
    batch = Namespace(
        slots=torch.tensor([2]),
        req_ids=[0],
        query_starts=torch.tensor([0], dtype=torch.int32),
        num_draft_tokens=torch.tensor([2], dtype=torch.int32),
        input_ids=torch.full((3,), -1, dtype=torch.int32),
    )
    with pytest.raises(RelayDebugError, match=r"slot 2.* 2 .*wrote 1"):
        relay.resolve_future(batch)


# -- freshly generated code --------------------------------------------------------------

_FRESH = Schema(
    name="FreshFutureMap",
    doc="Seeded, with a draft state under a parent a resolve skips when it is None.",
    seeded=True,
    optional_parents={"spec_info": IfNone.SKIP},
    fields=[
        Field(
            "topk_p",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            target="spec_info.topk_p",
        ),
    ],
)


def _fresh(tmp_path: Path, debug: bool) -> tuple[Any, Any]:
    """``_FRESH`` rendered by the generator now and imported: the map and its payload."""
    module = load_generated(_FRESH, tmp_path, "fresh_map")
    return module.FreshFutureMap("cpu", POOL, debug=debug), module.FreshPayload


@pytest.mark.parametrize("debug", [False, True], ids=["debug off", "debug on"])
def test_fresh_code_writes_seeds_on_a_resolve_of_an_empty_batch(
    tmp_path: Path, debug: bool
) -> None:
    """An idle step's resolve (zero rows) still writes the queued seeds first."""
    relay, payload = _fresh(tmp_path, debug)
    relay.seed(torch.tensor([3]), payload(topk_p=torch.tensor([0.5])))
    idle = Namespace(
        req_pool_indices=torch.empty(0, dtype=torch.int64), spec_info=Namespace()
    )
    relay.resolve_future(idle)
    assert not relay._state.seeds
    assert relay.topk_p_buf[3].item() == 0.5


def test_fresh_code_leaves_rows_under_a_skipped_parent_unread(tmp_path: Path) -> None:
    """A resolve whose ``spec_info`` is None reads nothing under it: debug mode's record
    of the read leaves the rows unread, so the next resolve with the parent set takes
    them; a second one is refused (the rows were read)."""
    relay, payload = _fresh(tmp_path, debug=True)
    relay.stash(SLOTS, payload(topk_p=torch.tensor([0.25, 0.75])))
    relay.resolve_future(Namespace(req_pool_indices=SLOTS, spec_info=None))
    taken = Namespace(req_pool_indices=SLOTS, spec_info=Namespace())
    relay.resolve_future(taken)
    assert taken.spec_info.topk_p.tolist() == [0.25, 0.75]
    with pytest.raises(RelayDebugError, match=r"topk_p: slot 2: resolve_future"):
        relay.resolve_future(Namespace(req_pool_indices=SLOTS, spec_info=Namespace()))


@pytest.mark.usefixtures("clocks_on")
def test_chained_records_are_made_in_host_order_in_every_schedule() -> None:
    """``record_chained`` first waits for the newest record before its task in host
    order, so however the workers interleave (the tasks start in other orders), the
    records are made in the order the host queued their tasks: no record of a later
    task is made before an earlier one's (Note [Fence chaining in host order])."""
    starts, records = set(), set()
    for seed in SEEDS:
        with replaying(seed):
            event = CpuEvent()
            started: list[int] = []
            recorded: list[int] = []

            def record(event: CpuEvent = event, recorded: list[int] = recorded) -> None:
                stream = current_cpu_stream()
                assert stream is not None
                recorded.append(stream.running_order)
                CpuEvent.record(event)

            event.record = record  # type: ignore[method-assign]

            def task(event: CpuEvent = event, started: list[int] = started) -> None:
                stream = current_cpu_stream()
                assert stream is not None
                started.append(stream.running_order)
                event.record_chained()

            with thread_streams("forward", "draft") as (forward, draft):
                forward.submit(task)
                draft.submit(task)
                forward.submit(task)
                event.synchronize()
        starts.add(tuple(started))
        assert recorded == sorted(recorded), f"seed {seed}: {recorded}"
        records.add(len(recorded))
    assert records == {3}
    if len(SEEDS) > 1:  # RELAY_SCHEDULE_SEED runs one seed alone
        assert any(s != tuple(sorted(s)) for s in starts), starts
