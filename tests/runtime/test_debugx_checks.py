"""``DebugChecks`` on what real relays need: rows that read as zeros before their first
write, placeholders that name a slot with nothing pending or a slot twice, values read by
another request than the one that stashed them, and seeds ordered after a forward still in
flight on the row."""

from __future__ import annotations

import re
import threading

import pytest
import torch
from relay_runtime_support import GUARD_S, gated, thread_streams

from relay import RelayDebugError
from relay.cpu_stream import CpuEvent
from relay.debug import DebugCheckFailed, DebugChecks, poison

# The ordering checks need the clocks, which an engine installs (a debug map does not).
pytestmark = pytest.mark.usefixtures("clocks_on")

POOL = 8
FWD = "ThreadStream('fwd')"


def checks() -> DebugChecks:
    """Checks of map ``N``: ``lens`` and ``toks`` read as zeros before their first write,
    ``tok`` does not; ``tok`` is what a seed writes."""
    return DebugChecks(
        torch.device("cpu"),
        POOL,
        "N",
        forward=("tok", "toks", "lens"),
        initial_zeros=("toks", "lens"),
        seeds=("tok",),
    )


def slots(*values: int) -> torch.Tensor:
    """An int64 slots tensor."""
    return torch.tensor(values)


def stash(
    d: DebugChecks, field: str, buf: torch.Tensor, idx: torch.Tensor, value: object
) -> None:
    """A stash of one field as a map does it: check, write, report."""
    d.check_slots("stash", idx)
    buf[idx] = torch.as_tensor(value, dtype=buf.dtype)
    d.wrote("stash", idx, (field,))


def gather(
    d: DebugChecks, field: str, buf: torch.Tensor, idx: torch.Tensor
) -> torch.Tensor:
    """A gather resolve of one field as a map does it."""
    d.check_slots("resolve_future", idx)
    value = buf[idx]
    d.read("resolve_future", idx, {field: buf})
    return value


def substitute(d: DebugChecks, buf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A placeholder resolve of ``tok`` as a map does it: each ``-slot`` in ``target``
    becomes the slot's row, other values stay."""
    pending = target < 0
    rows = target.neg().clamp(min=0)
    value = torch.where(pending, buf.index_select(0, rows), target)
    d.read("resolve_future", rows, {"tok": buf}, taken=pending, distinct=True)
    return value


# -- rows that read as zeros before their first write ---------------------------------


def test_a_never_written_zeros_row_reads_zeros_again_and_again() -> None:
    """A row never stashed reads zeros, is not consumed and not poisoned: it reads zeros
    on the next step too, and padding's row 0 keeps its zeros."""
    d = checks()
    lens = torch.zeros(POOL, dtype=torch.int64)
    toks = torch.zeros(POOL, 3, dtype=torch.int64)
    for _ in range(2):
        assert gather(d, "lens", lens, slots(2, 5, 0, 0)).tolist() == [0, 0, 0, 0]
        assert gather(d, "toks", toks, slots(2, 0)).tolist() == [[0, 0, 0]] * 2
    assert lens.tolist() == [0] * POOL
    assert toks.sum().item() == 0


def test_a_written_zeros_row_is_read_once_like_any_other() -> None:
    """Once written, the row is handed over once and poisoned; a second read is reported,
    while a never-written row beside it still reads zeros."""
    d = checks()
    lens = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "lens", lens, slots(3), [4])
    assert gather(d, "lens", lens, slots(3, 6)).tolist() == [4, 0]
    assert lens[3].item() == poison(torch.int64)
    assert lens[6].item() == 0
    with pytest.raises(DebugCheckFailed, match=r"N\.lens: slot 3: .*not written since"):
        gather(d, "lens", lens, slots(3))


def test_a_released_zeros_row_does_not_read_as_zeros_again() -> None:
    """The rule is "never written since allocation": a row written then released holds
    its old value, not zeros, and reading it is reported."""
    d = checks()
    lens = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "lens", lens, slots(4), [9])
    d.release(slots(4))
    with pytest.raises(
        DebugCheckFailed, match=r"N\.lens: slot 4: .*released and reused"
    ):
        gather(d, "lens", lens, slots(4))
    d.release(slots(5))  # never written: still reads zeros after a release
    assert gather(d, "lens", lens, slots(5)).tolist() == [0]


def test_only_the_declared_fields_read_as_zeros() -> None:
    """In one read of a zeros field and another field, the other's never-written row is
    still reported, naming that field."""
    d = checks()
    lens = torch.zeros(POOL, dtype=torch.int64)
    tok = torch.zeros(POOL, dtype=torch.int64)
    with pytest.raises(
        DebugCheckFailed,
        match=r"N\.tok: slot 2: resolve_future reads a row that was never written",
    ):
        d.read("resolve_future", slots(2), {"lens": lens, "tok": tok})


def test_a_placeholder_never_reads_zeros() -> None:
    """A placeholder promises a pending value, so one that names a never-written row of a
    zeros field is reported all the same."""
    d = checks()
    toks = torch.zeros(POOL, dtype=torch.int64)
    with pytest.raises(DebugCheckFailed, match="placeholder -2, which names slot 2"):
        d.read("resolve_future", slots(2), {"toks": toks}, taken=torch.tensor([True]))


# -- placeholders ---------------------------------------------------------------------


def test_a_minus_one_left_behind_is_named_as_slot_1() -> None:
    """vLLM's "not known yet" -1 left in the target names slot 1 here: reported with its
    position, not read silently."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "tok", tok, slots(3, 4), [30, 40])
    with pytest.raises(
        DebugCheckFailed,
        match=r"N\.tok: resolve_future: position 2 holds the placeholder -1, which names "
        r"slot 1, but nothing is pending for slot 1 \(no stash or publish ever wrote it\)",
    ):
        substitute(d, tok, slots(-3, 7, -1, -4))


def test_a_placeholder_of_a_slot_already_read_says_so() -> None:
    """A placeholder that survived a step names a slot whose value the last step took."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "tok", tok, slots(3), [30])
    assert substitute(d, tok, slots(-3, 11)).tolist() == [30, 11]
    with pytest.raises(
        DebugCheckFailed, match=r"slot 3 \(its value was already read\)"
    ):
        substitute(d, tok, slots(12, -3))


def test_a_slot_named_twice_in_one_read_is_reported() -> None:
    """Two placeholders of one slot: reported with both positions; real tokens (row 0
    after the clamp) may repeat."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "tok", tok, slots(2, 5), [20, 50])
    with pytest.raises(
        DebugCheckFailed,
        match=r"N\.tok: resolve_future: slot 5 is named twice in one read \(positions 1 and 3\)",
    ):
        substitute(d, tok, slots(8, -5, -2, -5))
    assert substitute(d, tok, slots(8, -5, 8, -2, 9)).tolist() == [8, 50, 8, 20, 9]


def test_repeats_are_not_checked_unless_asked() -> None:
    """Without ``distinct`` a read behaves as before (its slots were checked already)."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "tok", tok, slots(2), [20])
    d.read("resolve_future", slots(2, 2), {"tok": tok})


# -- owners ---------------------------------------------------------------------------


def test_two_pending_requests_swapped_are_reported() -> None:
    """Both values are fresh; the owner recorded at the stash names the swap."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    d.wrote("stash", slots(2, 6), ("tok",), owners=["req-7", "req-9"])
    with pytest.raises(
        DebugCheckFailed,
        match=r"N\.tok: slot 2: resolve_future reads it for request 'req-9' \(position 0\), "
        r"but stash wrote it for request 'req-7': the value is fresh but belongs to another",
    ):
        d.read("resolve_future", slots(2, 6), {"tok": tok}, owners=["req-9", "req-7"])
    d.read("resolve_future", slots(6, 2), {"tok": tok}, owners=["req-9", "req-7"])


def test_owners_as_an_int_tensor() -> None:
    """Request ids as an int tensor (int32 here) work alike and are named as numbers."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    d.wrote(
        "stash", slots(1, 3), ("tok",), owners=torch.tensor([11, 12], dtype=torch.int32)
    )
    with pytest.raises(
        DebugCheckFailed,
        match=r"for request 11 \(position 1\), but stash wrote it for request 12",
    ):
        d.read(
            "resolve_future", slots(1, 3), {"tok": tok}, owners=torch.tensor([11, 11])
        )


def test_a_write_that_names_no_owner_clears_the_old_one() -> None:
    """A write without ``owners`` leaves the row's owner unknown: no stale owner is
    compared with a later read."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    d.wrote("stash", slots(4), ("tok",), owners=[1])
    d.read("resolve_future", slots(4), {"tok": tok}, owners=[1])
    d.wrote("stash", slots(4), ("tok",))
    d.read("resolve_future", slots(4), {"tok": tok}, owners=[2])


def test_owners_must_name_one_request_per_row() -> None:
    """A wrong count, or a float tensor, is refused naming the call."""
    d = checks()
    with pytest.raises(
        RelayDebugError,
        match=r"N\.stash: owners must name one request per row: 2 rows, 1 owners",
    ):
        d.wrote("stash", slots(1, 2), ("tok",), owners=["a"])
    with pytest.raises(
        RelayDebugError, match="integer request ids, got a torch.float32"
    ):
        d.wrote("stash", slots(1), ("tok",), owners=torch.tensor([1.0]))


# -- seeds ----------------------------------------------------------------------------


def test_a_seed_not_ordered_after_the_forwards_stash_is_reported() -> None:
    """The forward stashed the reused row; the scheduler seeds it having waited on a gate
    the checker cannot see (no stream wait): reported at the seed, naming both sides."""
    d = checks()
    done = threading.Event()

    def forward() -> None:
        d.wrote("stash", slots(4), ("tok",))
        done.set()

    with thread_streams("fwd") as (fwd,):
        fwd.submit(forward)
        assert done.wait(GUARD_S)
        with pytest.raises(
            DebugCheckFailed,
            match=r"N\.tok: slot 4: seed on host thread .* and stash on "
            + re.escape(FWD)
            + " touch the row with nothing ordering them",
        ):
            d.seeded(slots(4), ("tok",))


def test_a_seed_after_a_stream_wait_is_clean_and_read_by_the_next_forward() -> None:
    """Ordered the way a map orders it (the scheduler waits for the forward stream), the
    seed passes, and the next forward reads the seeded value."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    got: list[list[int]] = []
    with thread_streams("fwd") as (fwd,):
        fwd.submit(lambda: stash(d, "tok", tok, slots(4), [1]))
        fwd.submit(lambda: d.read("resolve_future", slots(4), {"tok": tok}))
        fwd.synchronize()
        tok[4] = 77
        d.seeded(slots(4), ("tok",))
        fwd.submit(lambda: got.append(gather(d, "tok", tok, slots(4)).tolist()))
        fwd.synchronize()
    assert got == [[77]]


def test_a_seed_ordered_by_an_event_on_a_schedule_stream_is_clean() -> None:
    """The forward records an event after its stash; a schedule stream waits on it, then
    seeds: ordered."""
    d = checks()
    event = CpuEvent()

    def forward() -> None:
        d.wrote("stash", slots(2), ("tok",))
        event.record()

    def seed() -> None:
        event.wait()
        d.seeded(slots(2), ("tok",))

    with thread_streams("fwd", "sched") as (fwd, sched):
        fwd.submit(forward)
        fwd.synchronize()  # the record exists before the wait is queued
        sched.submit(seed)
        sched.synchronize()


def test_a_seed_not_ordered_after_the_forwards_read_is_reported() -> None:
    """The row's write is ordered before the seed, but a forward still reading the old
    value is not: reported, naming the read."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "tok", tok, slots(5), [3])  # on the host: the seed follows it
    done = threading.Event()

    def forward() -> None:
        gather(d, "tok", tok, slots(5))
        done.set()

    with thread_streams("fwd") as (fwd,):
        fwd.submit(forward)
        assert done.wait(GUARD_S)
        with pytest.raises(
            DebugCheckFailed,
            match=r"slot 5: seed on host thread .* and resolve_future on ThreadStream\('fwd'\)",
        ):
            d.seeded(slots(5), ("tok",))


def test_a_stash_in_flight_that_lands_after_the_seed_is_reported() -> None:
    """A forward launched before the seed stashes into the seeded row after it: the
    stash reports the seed it is not ordered after."""
    d = checks()
    gate = threading.Event()
    errors: list[BaseException] = []

    def late_stash() -> None:
        try:
            d.wrote("stash", slots(3), ("tok",))
        except RelayDebugError as error:
            errors.append(error)

    with thread_streams("fwd") as (fwd,):
        fwd.submit(gated(gate, late_stash))
        d.seeded(slots(3), ("tok",))
        gate.set()
        fwd.synchronize()
    assert len(errors) == 1
    assert f"N.tok: slot 3: stash on {FWD} and seed on host thread" in str(errors[0])


def test_a_row_with_nothing_pending_names_the_request_that_reads_it() -> None:
    """A read that names its requests says which one found nothing pending (never
    written, or read already), so an engine finds the request, not only the slot."""
    d = checks()
    tok = torch.zeros(POOL, dtype=torch.int64)
    d.wrote("stash", slots(2), ("tok",), owners=["req-2"])
    with pytest.raises(
        DebugCheckFailed,
        match=r"N\.tok: slot 5: resolve_future reads a row that was never written: .*"
        r" \(read for request 'req-3', position 1\)",
    ):
        d.read("resolve_future", slots(2, 5), {"tok": tok}, owners=["req-2", "req-3"])
    d.wrote("stash", slots(5), ("tok",), owners=["req-3"])
    d.read("resolve_future", slots(5), {"tok": tok}, owners=["req-3"])
    with pytest.raises(
        DebugCheckFailed,
        match=r"slot 5: resolve_future reads a row that was not written since it was "
        r"last consumed .* \(read for request 'req-3', position 0\)",
    ):
        d.read("resolve_future", slots(5), {"tok": tok}, owners=["req-3"])
