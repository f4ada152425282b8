"""vLLM V1's async hand-over with 0 to K drafts per request, ported from its description
to the bundled ``vllm_drafts`` schema: each step's sampled token and drafts land in the
next step's flat ``input_ids`` at ``query_start_loc``, rows reordered between steps.
Checked against a hand-over written the vLLM way (a previous-row map rebuilt every
step), with debug mode on and off, and with the glue bugs of such a port planted, each
named by debug mode."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch

from relay import RelayDebugError, RelayError, runtime
from relay.maps.vllm_drafts import VllmDraftsFutureMap, VllmDraftsPayload
from relay.schema import Field, Lane, Resolve, Scatter, Schema
from relay.schemas import vllm_drafts
from relay.slots import SlotTable
from relay.testing import Namespace, check_lockstep, load_map_class

POOL = 17
K = 3
PAD = -1  # vLLM's "not known yet"


@attrs.define
class Row:
    """A request of the persistent batch: its id, its relay slot, its prompt left."""

    rid: int
    slot: int
    prefill: list[int]


class VllmStyleEngine:
    """A persistent batch that condenses, swaps and admits rows every step, and keeps
    step N's outputs by step-N row: the reference hand-over (``expected``) rebuilds the
    previous-row map from request ids, as vLLM's input preparation does."""

    def __init__(self, seed: int, debug: bool) -> None:
        self.rng = random.Random(seed)
        self.map = VllmDraftsFutureMap(
            "cpu", POOL, num_speculative_tokens=K, debug=debug
        )
        self.slots = SlotTable(POOL, [self.map])
        self.rows: list[Row] = []
        self.next_rid = 0
        #: Step N's outputs by step-N row, and each request's step-N row.
        self.sampled: list[int] = []
        self.drafts: list[list[int]] = []
        self.counts: list[int] = []
        self.prev_row: dict[int, int] = {}
        self.steps = 0

    def _admit_and_reorder(self) -> None:
        ended = [
            r for r in self.rows if r.rid in self.prev_row and self.rng.random() < 0.2
        ]
        self.slots.finish(r.rid for r in ended)  # released, free for newcomers
        self.rows = [r for r in self.rows if r not in ended]
        while self.slots.free and len(self.rows) < 6 and self.rng.random() < 0.6:
            prompt = [self.rng.randrange(1000) for _ in range(self.rng.randint(1, 4))]
            self.rows.append(Row(self.next_rid, self.slots.take(self.next_rid), prompt))
            self.next_rid += 1
        self.rng.shuffle(self.rows)  # condense and swap: rows move every step

    def step(self, plant: Callable[[Namespace], None] | None = None) -> None:
        """Build step N+1's batch, hand step N's outputs over, run step N+1."""
        self._admit_and_reorder()
        running = [r for r in self.rows if r.rid in self.prev_row]
        prefill = [r for r in self.rows if r.rid not in self.prev_row]
        # The scheduler's counts: what the drafter made, looked up by request on the
        # scheduler's own object (the map's schedule lane), trimmed now and then.
        made = self._drafts_made(running)
        assert made == [self.counts[self.prev_row[r.rid]] for r in running]
        scheduled = {
            r.rid: min(count, self.rng.randint(0, K))
            if self.rng.random() < 0.2
            else count
            for r, count in zip(running, made)
        }
        order = running + prefill  # decode rows first, as vLLM lays them out
        sizes = [
            1 + scheduled[r.rid] if r in running else len(r.prefill) for r in order
        ]
        starts = [sum(sizes[:i]) for i in range(len(order))]
        input_ids = torch.full((sum(sizes),), PAD, dtype=torch.int32)
        for r, at in zip(order, starts):
            if r in prefill:
                input_ids[at : at + len(r.prefill)] = torch.tensor(r.prefill)
        expected = input_ids.clone()
        for r, at in zip(running, starts):
            prev = self.prev_row[r.rid]
            d = scheduled[r.rid]
            expected[at] = self.sampled[prev]
            expected[at + 1 : at + 1 + d] = torch.tensor(self.drafts[prev][:d])
        batch = Namespace(
            slots=self.slots.indices(r.rid for r in running),
            req_ids=[r.rid for r in running],
            query_starts=torch.tensor(starts[: len(running)], dtype=torch.int32),
            num_draft_tokens=torch.tensor(
                [scheduled[r.rid] for r in running], dtype=torch.int32
            ),
            input_ids=input_ids,
        )
        if plant is not None:
            plant(batch)
        self.map.resolve_future(batch)
        assert torch.equal(batch.input_ids, expected), (self.steps, batch, expected)
        self._forward(order)

    def _drafts_made(self, running: list[Row]) -> list[int]:
        """The scheduler's lookup of each running request's draft count, behind the
        publish's fence: an object with the schedule lane's attributes only."""
        lookup = Namespace(
            slots=self.slots.indices(r.rid for r in running),
            req_ids=[r.rid for r in running],
            drafts_made=None,
            drafts_made_cpu=None,
        )
        self.map.resolve_drafts_made_cpu(lookup)
        if not running:
            return []
        counts: list[int] = lookup.drafts_made_cpu.tolist()
        return counts

    def _forward(self, order: list[Row]) -> None:
        """Step N+1's outputs by its rows: a sampled token and 0 to K drafts each."""
        n = len(order)
        self.sampled = [self.rng.randrange(1000) for _ in range(n)]
        self.drafts = [[self.rng.randrange(1000) for _ in range(K)] for _ in range(n)]
        self.counts = [self.rng.randint(0, K) for _ in range(n)]
        self.prev_row = {r.rid: i for i, r in enumerate(order)}
        if n:
            self.map.stash(
                self.slots.indices(r.rid for r in order),
                VllmDraftsPayload(
                    sampled_token_ids=torch.tensor(self.sampled),
                    draft_token_ids=torch.tensor(self.drafts),
                    num_draft_tokens=torch.tensor(self.counts),
                ),
                owners=[r.rid for r in order],
            )
            self.map.publish(
                self.slots.indices(r.rid for r in order),
                torch.tensor(self.counts),
                owners=[r.rid for r in order],
            )
        self.steps += 1


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_the_port_agrees_with_a_vllm_style_hand_over(debug: bool) -> None:
    """Over 600 steps of admissions, finishes, reordered rows, 0 to K drafts and
    trimmed counts, input_ids equal the vLLM-style hand-over's, position by position."""
    for seed in range(3):
        engine = VllmStyleEngine(seed, debug)
        for _ in range(200):
            engine.step()
        assert engine.next_rid > 20


def test_the_schema_runs_in_lockstep_with_the_reference_model() -> None:
    """Random stashes, counts, trims and reorders against relay's reference model."""
    assert check_lockstep(vllm_drafts, operations=2000, steps=100) == 2000


def _warm(seed: int = 0) -> VllmStyleEngine:
    """An engine in debug mode a few steps in, with running requests that have drafts."""
    engine = VllmStyleEngine(seed, debug=True)
    for _ in range(8):
        engine.step()
    return engine


def _planted(
    plant: Callable[[Namespace], None], message: str | tuple[str, ...]
) -> None:
    engine = _warm()
    for _ in range(50):
        try:
            engine.step(plant)
        except RelayDebugError as error:
            named = (message,) if isinstance(message, str) else message
            assert any(m in str(error) for m in named), str(error)
            return
        except AssertionError:
            raise
    raise AssertionError(f"debug mode never named: {message}")


def _overlap(batch: Namespace) -> None:
    """Offsets counted without the drafts: one position per request."""
    n = batch.slots.numel()
    if int(batch.num_draft_tokens.sum()) and n > 1:
        batch.query_starts = torch.arange(n, dtype=torch.int32)


def _one_off(batch: Namespace) -> None:
    """Every offset one past the right place."""
    batch.query_starts = batch.query_starts + 1


def _left_over(batch: Namespace) -> None:
    """The scheduler laid out the drafts, the counts handed to the map say none."""
    batch.num_draft_tokens = torch.zeros_like(batch.num_draft_tokens)


def _disagree(batch: Namespace) -> None:
    """The consumer schedules K drafts whatever the producer made."""
    if batch.slots.numel():
        batch.num_draft_tokens = torch.full_like(batch.num_draft_tokens, K)
        extra = torch.arange(batch.slots.numel(), dtype=torch.int32) * K
        batch.query_starts = batch.query_starts + extra
        batch.input_ids = torch.cat(
            [batch.input_ids, torch.zeros(int(extra[-1]) + K, dtype=torch.int32)]
        )


@pytest.mark.parametrize(
    ("plant", "message"),
    [
        (_overlap, "one would overwrite the other's values"),
        (  # before the write: past the end, or over a prefill row's first token
            _one_off,
            ("its offset is wrong", "not a placeholder: its span runs into"),
        ),
        (_left_over, "still holds -1: a placeholder no request's row covered"),
        (_disagree, "the producer and the consumer disagree on its count"),
    ],
    ids=["overlapping scatters", "offsets one off", "left-over -1", "count disagrees"],
)
def test_each_planted_glue_bug_is_named_by_debug_mode(
    plant: Callable[[Namespace], None], message: str | tuple[str, ...]
) -> None:
    """Each bug of such a port, planted into a running engine, is named with the map,
    the field and the request."""
    _planted(plant, message)


class SwappedLookup(VllmStyleEngine):
    """A scheduler whose lookup swaps two running requests' slots (not their ids)."""

    def _drafts_made(self, running: list[Row]) -> list[int]:
        if len(running) < 2:
            return super()._drafts_made(running)
        swapped = [running[1], running[0], *running[2:]]
        lookup = Namespace(
            slots=self.slots.indices(r.rid for r in swapped),
            req_ids=[r.rid for r in running],
            drafts_made=None,
            drafts_made_cpu=None,
        )
        self.map.resolve_drafts_made_cpu(lookup)
        raise AssertionError("debug mode did not name the swapped slots")


def test_a_swapped_scheduler_lookup_is_named_with_its_own_ids() -> None:
    """The scheduler's object names its requests itself (``ScheduleSlots(owners=...)``): a lookup
    whose slots were reordered without its ids is named with those ids."""
    engine = SwappedLookup(0, debug=True)
    with pytest.raises(
        RelayDebugError,
        match=r"VllmDraftsFutureMap\.drafts_made: slot \d+: resolve_drafts_made_cpu "
        r"reads it for request \d+ \(position 0\), but publish wrote it for request",
    ):
        for _ in range(50):
            engine.step()


def _two_requests(debug: bool) -> tuple[VllmDraftsFutureMap, Namespace]:
    relay = VllmDraftsFutureMap("cpu", 8, num_speculative_tokens=K, debug=debug)
    relay.stash(
        torch.tensor([2, 4]),
        VllmDraftsPayload(
            sampled_token_ids=torch.tensor([10, 20]),
            draft_token_ids=torch.tensor([[11, 12, 13], [21, 22, 23]]),
            num_draft_tokens=torch.tensor([3, 1]),
        ),
        owners=[7, 9],
    )
    batch = Namespace(
        slots=torch.tensor([4, 2]),
        req_ids=[9, 7],
        query_starts=torch.tensor([0, 2]),
        num_draft_tokens=torch.tensor([1, 2]),
        input_ids=torch.full((5,), PAD, dtype=torch.int32),
    )
    return relay, batch


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_a_request_reads_its_token_then_its_scheduled_drafts(debug: bool) -> None:
    """Rows reordered, one request trimmed to 2 of its 3 drafts."""
    relay, batch = _two_requests(debug)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [20, 21, 10, 11, 12]


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_spans_out_of_start_order_are_laid_in(debug: bool, dtype: torch.dtype) -> None:
    """Starts need not rise with the rows: spans apart in any order are laid in (debug
    off on the CPU, past the common case's one check, by the general plan)."""
    relay, batch = _two_requests(debug)
    batch.query_starts = torch.tensor([3, 0], dtype=dtype)
    batch.num_draft_tokens = batch.num_draft_tokens.to(dtype)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [10, 11, 12, 20, 21]


@pytest.mark.parametrize(
    ("counts", "starts", "message"),
    [
        (torch.tensor([1.0, 2.0]), [0, 2], r"got a torch\.float32 tensor"),
        (torch.tensor([1]), [0, 2], r"must hold one integer per request \(2"),
        (
            torch.tensor([[1], [2]]),
            [0, 2],
            r"got a torch\.int64 tensor of shape \(2, 1\)",
        ),
        (torch.tensor([1, 2], dtype=torch.int16), [0, 2], r"got a torch\.int16 tensor"),
        ([1, 2], [0, 2], r"got a list"),
        (
            torch.tensor([1, 3]),
            [0, 2],
            (
                r"request 7 \(row 1, slot 2\) puts its 3 value\(s\) from 3, outside "
                r"the target's 5 positions"
            ),
        ),
        (
            torch.tensor([1, 2]),
            [-1, 2],
            (
                r"^VllmDraftsFutureMap.sampled_tokens: request 9 \(row 0, slot 4\) puts "
                r"its 1 value\(s\) from -1"
            ),
        ),
    ],
    ids=["floats", "one short", "a column", "int16", "a list", "past the end", "-1"],
)
def test_bad_counts_are_refused_before_anything_is_written(
    counts: object, starts: list[int], message: str
) -> None:
    """Debug off, on the CPU: relay's message naming the map, field and request, and
    neither field of the span written."""
    relay, batch = _two_requests(False)
    batch.num_draft_tokens = counts
    batch.query_starts = torch.tensor(starts)
    with pytest.raises(RelayError, match=message) as raised:
        relay.resolve_future(batch)
    assert str(raised.value).startswith("VllmDraftsFutureMap.")
    assert batch.input_ids.tolist() == [PAD] * 5


def test_a_long_batch_running_past_the_end_is_refused() -> None:
    """More requests than the host reads as a list: the positions are checked with
    ``aminmax``, the bad request then named."""
    relay = VllmDraftsFutureMap("cpu", 40, num_speculative_tokens=K)
    slots = torch.arange(1, 21)
    relay.stash(
        slots,
        VllmDraftsPayload(
            sampled_token_ids=slots * 10,
            draft_token_ids=torch.ones(20, K, dtype=torch.int64),
            num_draft_tokens=torch.full((20,), K),
        ),
    )
    batch = Namespace(
        slots=slots,
        req_ids=None,
        query_starts=torch.arange(20) * 2,
        num_draft_tokens=torch.ones(20, dtype=torch.int64),
        input_ids=torch.full((39,), PAD, dtype=torch.int32),
    )
    with pytest.raises(
        RelayError, match=r"the request in row 19 \(slot 20\) puts its 1 value"
    ):
        relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [PAD] * 39
    batch.input_ids = torch.full((40,), PAD, dtype=torch.int32)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist()[:4] == [10, 1, 20, 1]


@pytest.mark.parametrize("count", [4, -1])
def test_a_count_outside_the_row_is_named_in_debug_mode(count: int) -> None:
    """With debug off a count is taken as 0 to the row's width, as the write takes it;
    debug mode names it."""
    relay, batch = _two_requests(True)
    batch.num_draft_tokens = torch.tensor([1, count])
    with pytest.raises(
        RelayDebugError,
        match=rf"request 7 \(row 1, slot 2\) has a count of {count} value\(s\), "
        r"outside",
    ):
        relay.resolve_future(batch)


def test_a_stash_whose_count_is_wider_than_the_row_is_refused_in_debug_mode() -> None:
    """The producer's count is checked at the stash, before anything is written."""
    relay = VllmDraftsFutureMap("cpu", 8, num_speculative_tokens=K, debug=True)
    with pytest.raises(RelayDebugError, match=r"has a count of 4 value\(s\)"):
        relay.stash(
            torch.tensor([2]),
            VllmDraftsPayload(
                sampled_token_ids=torch.tensor([10]),
                draft_token_ids=torch.tensor([[11, 12, 13]]),
                num_draft_tokens=torch.tensor([4]),
            ),
        )
    assert relay.sampled_tokens_buf[2].item() != 10


def test_the_device_path_lays_in_what_the_host_path_does() -> None:
    """``scatter_kept`` (no host read, off the CPU) against the CPU's masked write, on
    random counted layouts."""
    rng = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 6, (1,), generator=rng))
        width = int(torch.randint(1, 5, (1,), generator=rng))
        counts = torch.randint(0, width + 1, (n,), generator=rng)
        gaps = torch.randint(0, 2, (n,), generator=rng)
        sizes = counts + gaps
        starts = torch.cumsum(sizes, 0) - sizes
        at = starts.unsqueeze(1) + torch.arange(width)
        keep = torch.arange(width) < counts.unsqueeze(1)
        block = torch.randint(0, 100, (n, width), generator=rng)
        host = torch.full((int(sizes.sum()),), PAD)
        device = host.clone()
        host.index_copy_(0, at[keep], block[keep])
        runtime.scatter_kept(device, at, keep, block)
        assert torch.equal(host, device)


def test_the_device_path_never_moves_a_kept_entry_into_range() -> None:
    """A kept entry past the target's end fails before the target changes (on CUDA a
    device-side assert, as any index op's), and is not laid at the last position;
    entries not kept may point anywhere."""
    at = torch.tensor([[0, 1, 9], [3, 4, 5]])  # 9 and 5 are past a 5-long target
    block = torch.tensor([[1, 2, 3], [4, 5, 6]])
    target = torch.full((5,), PAD)
    runtime.scatter_kept(target, at, torch.tensor([[1, 1, 0], [1, 1, 0]]).bool(), block)
    assert target.tolist() == [1, 2, PAD, 4, 5]
    before = target.clone()
    with pytest.raises(RuntimeError):
        runtime.scatter_kept(target, at, torch.ones(2, 3, dtype=torch.bool), block)
    assert torch.equal(target, before)


PLACEHOLDERS = Schema(
    name="OwnedPlaceholderFutureMap",
    owners="rids",
    fields=[
        Field(
            "tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
        )
    ],
)


def test_owners_of_a_placeholder_read_are_given_per_target_position() -> None:
    """docs/integrating.md's owners contract: a placeholder read's rows are the target's
    positions, so its owners name one request per position (any id where a position
    holds a real token), not one per row of the slots."""
    cls = load_map_class(PLACEHOLDERS)
    payload = sys.modules[cls.__module__].OwnedPlaceholderPayload
    relay = cls("cpu", 8, debug=True)
    relay.stash(
        torch.tensor([2, 5]), payload(tokens=torch.tensor([20, 50])), owners=["a", "b"]
    )
    batch = Namespace(
        req_pool_indices=torch.tensor([2, 5]),
        input_ids=torch.tensor([-5, 7, -2]),  # a real token between the placeholders
        rids=["a", "b"],  # per row: refused
    )
    with pytest.raises(
        RelayDebugError, match=r"owners must name one request per row: 3"
    ):
        relay.resolve_future(batch)
    batch.input_ids = torch.tensor([-5, 7, -2])
    batch.rids = ["b", "b", "a"]  # per position
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [50, 7, 20]


def test_a_three_field_span_with_nested_paths_runs_in_lockstep() -> None:
    """A token, counted drafts, then a fixed pair after them, all in one target below
    the batch, offsets and counts on another object: against the reference model."""
    scatter: dict[str, Any] = {"lane": Lane.FORWARD, "dtype": torch.int64}
    schema = Schema(
        name="ThreeSpanFutureMap",
        fields=[
            Field(
                "tok",
                target="spec.ids",
                resolve=Scatter(offsets="meta.starts"),
                **scatter,
            ),
            Field(
                "drafts",
                shape=("k",),
                target="spec.ids",
                resolve=Scatter(offsets="meta.starts", lengths="meta.n", after="tok"),
                **scatter,
            ),
            Field(
                "pair",
                shape=(2,),
                target="spec.ids",
                resolve=Scatter(offsets="meta.starts", after="drafts"),
                **scatter,
            ),
        ],
    )
    assert check_lockstep(schema, operations=600, steps=100) == 600
    assert check_lockstep(schema, operations=300, steps=100, debug=False) == 300


@pytest.mark.parametrize("read_twice", [False, True], ids=["never stashed", "read"])
def test_a_slot_with_nothing_to_hand_over_is_not_called_an_offset_one_off(
    read_twice: bool,
) -> None:
    """The read check runs before the check of -1 left in the target: a slot never
    stashed, or already read, is named as such, with its request, though its poison
    (-1, vLLM's placeholder too) landed in ``input_ids``."""
    relay, batch = _two_requests(True)
    if read_twice:
        relay.resolve_future(batch)
        batch.input_ids = torch.full((5,), PAD, dtype=torch.int32)
        message = r"sampled_tokens: slot 4: resolve_future reads a row that was not"
    else:
        batch.slots = torch.tensor([5, 2])
        message = r"sampled_tokens: slot 5: resolve_future reads a row that was never"
    with pytest.raises(RelayDebugError, match=message):
        relay.resolve_future(batch)


def test_the_stash_guard_checks_only_the_counted_drafts() -> None:
    """Draft columns past a row's count are no values (vLLM fills them with -1):
    debug mode's non-negative guard skips them, and still refuses a -1 among the
    counted ones."""
    relay = VllmDraftsFutureMap("cpu", 8, num_speculative_tokens=K, debug=True)
    relay.stash(
        torch.tensor([2, 4]),
        VllmDraftsPayload(
            sampled_token_ids=torch.tensor([10, 20]),
            draft_token_ids=torch.tensor([[11, -1, -1], [-1, -1, -1]]),
            num_draft_tokens=torch.tensor([1, 0]),
        ),
    )
    with pytest.raises(RuntimeError, match=r"draft_tokens: guard failed"):
        relay.stash(
            torch.tensor([3]),
            VllmDraftsPayload(
                sampled_token_ids=torch.tensor([30]),
                draft_token_ids=torch.tensor([[31, -1, -1]]),
                num_draft_tokens=torch.tensor([2]),
            ),
        )
