"""Every debug-mode message (``relay.debug.messages.MESSAGES``) raised by the check that
owns it, word for word, and quoted in docs/debugging.md."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from relay_runtime_support import GUARD_S, thread_streams

from relay import RelayDebugError, runtime
from relay.debug import MESSAGES, DebugChecks, check_resolved, poison
from relay.debug.messages import text

# The ordering checks need the clocks, which an engine installs (a debug map does not).
pytestmark = pytest.mark.usefixtures("clocks_on")

DOCS = Path(__file__).resolve().parents[2] / "docs" / "debugging.md"
POOL = 8
HOST = f"host thread {threading.current_thread().name!r}"


def checks(*, named: bool = True) -> DebugChecks:
    """Checks of map ``M`` (forward ``tok``, optional ``opt``; schedule ``lens``);
    ``named=False`` asks for the device-side assert's summaries, as off the CPU."""
    d = DebugChecks(
        torch.device("cpu"),
        POOL,
        "M",
        forward=("tok", "opt"),
        schedule=("lens",),
        consumers=("resolve_lens",),
    )
    d.name_failures = named
    return d


def rows(*slots: int) -> torch.Tensor:
    """An int64 slots tensor."""
    return torch.tensor(slots)


def buf() -> torch.Tensor:
    """A poisoned int64 buffer of the pool."""
    return torch.full((POOL,), poison(torch.int64))


def write_on_stream(d: DebugChecks, fields: tuple[str, ...], slot: int) -> str:
    """``stash`` of ``fields`` at ``slot`` on a ThreadStream, with no order back to the
    host (a gate the clocks cannot see); the stream's name."""
    done = threading.Event()
    with thread_streams("fwd") as (stream,):

        def write() -> None:
            d.wrote("stash", rows(slot), fields)
            done.set()

        stream.submit(write)
        assert done.wait(GUARD_S)
    return "ThreadStream('fwd')"


def _indices_dtype() -> tuple[str, Callable[[], object]]:
    want = text("indices_dtype", owner="M", op="stash", dtype=torch.float32)
    return want, lambda: checks().check_slots("stash", torch.tensor([1.0]))


def _slot_outside() -> tuple[str, Callable[[], object]]:
    want = text("slot_outside", owner="M", op="stash", pool=POOL, slot=9, position=1)
    return want, lambda: checks().check_slots("stash", rows(1, 9))


def _slot_outside_no_scratch() -> tuple[str, Callable[[], object]]:
    want = text(
        "slot_outside_no_scratch",
        owner="M",
        op="invalidate",
        pool=POOL,
        slot=0,
        position=0,
    )
    return want, lambda: checks().check_slots("invalidate", rows(0), scratch_ok=False)


def _slot_twice() -> tuple[str, Callable[[], object]]:
    want = text("slot_twice", owner="M", op="publish", slot=3)
    return want, lambda: checks().check_slots("publish", rows(3, 3))


def _slots_summary() -> tuple[str, Callable[[], object]]:
    want = text("slots_summary", owner="M", op="stash", pool=POOL)
    return want, lambda: checks(named=False).check_slots("stash", rows(-1))


def _slots_no_scratch_summary() -> tuple[str, Callable[[], object]]:
    want = text("slots_no_scratch_summary", owner="M", op="invalidate", pool=POOL)
    return want, lambda: checks(named=False).check_slots(
        "invalidate", rows(0), scratch_ok=False
    )


def _never_written() -> tuple[str, Callable[[], object]]:
    want = text("never_written", owner="M", field="tok", slot=2, op="resolve_future")
    return want, lambda: checks().read("resolve_future", rows(2), {"tok": buf()})


def _consumed() -> tuple[str, Callable[[], object]]:
    d = checks()
    d.wrote("stash", rows(2), ("tok",))
    d.read("resolve_future", rows(2), {"tok": buf()})
    want = text("consumed", owner="M", field="tok", slot=2, op="resolve_future")
    return want, lambda: d.read("resolve_future", rows(2), {"tok": buf()})


def _omitted() -> tuple[str, Callable[[], object]]:
    d = checks()
    d.wrote("stash", rows(4), ("tok", "opt"), carried={"opt": False})
    want = text("omitted", owner="M", field="opt", slot=4, op="resolve_future")
    return want, lambda: d.read("resolve_future", rows(4), {"opt": buf()})


def _released() -> tuple[str, Callable[[], object]]:
    d = checks()
    d.wrote("stash", rows(5), ("tok",))
    d.release(rows(5))
    want = text(
        "released",
        owner="M",
        field="tok",
        slot=5,
        op="resolve_future",
        writer_op="stash",
    )
    return want, lambda: d.read("resolve_future", rows(5), {"tok": buf()})


def _unordered_read() -> tuple[str, Callable[[], object]]:
    d = checks()
    stream = write_on_stream(d, ("tok",), 6)
    want = text(
        "unordered_read",
        owner="M",
        field="tok",
        slot=6,
        op="resolve_future",
        stream=HOST,
        writer_op="stash",
        writer_stream=stream,
    )
    return want, lambda: d.read("resolve_future", rows(6), {"tok": buf()})


def _read_summary() -> tuple[str, Callable[[], object]]:
    want = text(
        "read_summary", owner="M", fields="tok, opt", op="resolve_future", stream=HOST
    )
    return want, lambda: checks(named=False).read(
        "resolve_future", rows(1), {"tok": buf(), "opt": buf()}
    )


def _unordered_write() -> tuple[str, Callable[[], object]]:
    d = checks()
    stream = write_on_stream(d, ("tok",), 7)
    want = text(
        "unordered_write",
        owner="M",
        field="tok",
        slot=7,
        op="stash",
        stream=HOST,
        writer_op="stash",
        writer_stream=stream,
    )
    return want, lambda: d.wrote("stash", rows(7), ("tok",))


def _write_summary() -> tuple[str, Callable[[], object]]:
    d = checks(named=False)
    write_on_stream(d, ("tok", "opt"), 7)
    want = text("write_summary", owner="M", fields="tok, opt", op="stash", stream=HOST)
    return want, lambda: d.wrote("stash", rows(7), ("tok", "opt"))


def _stale_fence() -> tuple[str, Callable[[], object]]:
    want = text("stale_fence", owner="M", op="resolve_lens")
    return want, lambda: checks().waited("resolve_lens")


def _graph_not_run() -> tuple[str, Callable[[], object]]:
    d = DebugChecks(
        torch.device("cpu"), POOL, "M", forward=("tok",), graph_written=("tok",)
    )
    d.wrote("graph_wrote", rows(2), ("tok",))
    d.read("resolve_future", rows(2), {"tok": buf()})
    want = text(
        "graph_not_run",
        owner="M",
        field="tok",
        slot=2,
        op="resolve_future",
        why="its value was already read",
    )
    return want, lambda: d.read("resolve_future", rows(2), {"tok": buf()})


def _kept_stale() -> tuple[str, Callable[[], object]]:
    d = checks()
    want = text(
        "kept_stale",
        owner="M",
        field="opt",
        slot=3,
        op="stash_partial",
        why="no stash or publish ever wrote it",
    )
    return want, lambda: d.peek(
        "stash_partial", rows(3), {"opt": buf()}, stale="kept_stale"
    )


def _kept_stale_summary() -> tuple[str, Callable[[], object]]:
    want = text("kept_stale_summary", owner="M", fields="opt", op="stash_partial")
    return want, lambda: checks(named=False).peek(
        "stash_partial", rows(3), {"opt": buf()}, stale="kept_stale"
    )


def _stale_tail() -> tuple[str, Callable[[], object]]:
    d = checks()
    d.wrote("publish", rows(5), ("lens",))
    d.read("resolve_lens", rows(5), {"lens": buf()})
    want = text(
        "stale_tail",
        owner="M",
        field="lens",
        slot=5,
        op="resolve_tails",
        why="its value was already read",
    )
    return want, lambda: d.peek(
        "resolve_tails", rows(5), {"lens": buf()}, stale="stale_tail"
    )


def _stale_tail_summary() -> tuple[str, Callable[[], object]]:
    want = text("stale_tail_summary", owner="M", fields="lens", op="resolve_tails")
    return want, lambda: checks(named=False).peek(
        "resolve_tails", rows(5), {"lens": buf()}, stale="stale_tail"
    )


def _guard_non_negative_summary() -> tuple[str, Callable[[], object]]:
    want = text("guard_non_negative_summary", what="M.tok")
    return want, lambda: runtime.guard_non_negative(rows(1, -1), "M.tok")


def _guard_positive_summary() -> tuple[str, Callable[[], object]]:
    want = text("guard_positive_summary", what="M.lens")
    return want, lambda: runtime.guard_positive(rows(1, 0), "M.lens")


def _guard_finite_summary() -> tuple[str, Callable[[], object]]:
    want = text("guard_finite_summary", what="M.p")
    return want, lambda: runtime.guard_finite(torch.tensor([0.5, float("nan")]), "M.p")


def _cast_summary() -> tuple[str, Callable[[], object]]:
    want = text("cast_summary", what="M.tok", cast=torch.int32, target="batch.ids")
    big = torch.tensor([1, 2**31], dtype=torch.int64)
    return want, lambda: runtime.check_cast(big, torch.int32, "M.tok", "batch.ids")


def _placeholder() -> tuple[str, Callable[[], object]]:
    want = text("placeholder", consumer="penalty", position=1, placeholder=-3, slot=3)
    return want, lambda: check_resolved(rows(7, -3), "penalty")


def _placeholder_summary() -> tuple[str, Callable[[], object]]:
    want = text("placeholder_summary", consumer="penalty")
    return want, lambda: check_resolved(rows(7, -3), "penalty", name_failures=False)


def _placeholder_nothing_pending() -> tuple[str, Callable[[], object]]:
    want = text(
        "placeholder_nothing_pending",
        owner="M",
        field="tok",
        op="resolve_future",
        position=1,
        placeholder=-1,
        slot=1,
        why="no stash or publish ever wrote it",
    )
    return want, lambda: checks().read(
        "resolve_future", rows(5, 1), {"tok": buf()}, taken=torch.tensor([False, True])
    )


def _placeholder_read_summary() -> tuple[str, Callable[[], object]]:
    want = text(
        "placeholder_read_summary",
        owner="M",
        fields="tok",
        op="resolve_future",
        stream=HOST,
    )
    return want, lambda: checks(named=False).read(
        "resolve_future", rows(1), {"tok": buf()}, taken=torch.tensor([True])
    )


def _slot_named_twice() -> tuple[str, Callable[[], object]]:
    d = checks()
    d.wrote("stash", rows(3), ("tok",))
    want = text(
        "slot_named_twice",
        owner="M",
        field="tok",
        op="resolve_future",
        slot=3,
        first=0,
        second=2,
    )
    return want, lambda: d.read(
        "resolve_future",
        rows(3, 0, 3),
        {"tok": buf()},
        taken=torch.tensor([True, False, True]),
        distinct=True,
    )


def _slot_named_twice_summary() -> tuple[str, Callable[[], object]]:
    want = text(
        "slot_named_twice_summary", owner="M", fields="tok", op="resolve_future"
    )
    return want, lambda: checks(named=False).read(
        "resolve_future", rows(3, 3), {"tok": buf()}, distinct=True
    )


def _wrong_owner() -> tuple[str, Callable[[], object]]:
    d = checks()
    d.wrote("stash", rows(2, 3), ("tok",), owners=["req-a", "req-b"])
    want = text(
        "wrong_owner",
        owner="M",
        field="tok",
        slot=2,
        op="resolve_future",
        reader="request 'req-b'",
        position=0,
        writer_op="stash",
        writer_request="'req-a'",
    )
    return want, lambda: d.read(
        "resolve_future", rows(2, 3), {"tok": buf()}, owners=["req-b", "req-a"]
    )


def _unordered_seed() -> tuple[str, Callable[[], object]]:
    d = checks()
    stream = write_on_stream(d, ("tok",), 6)
    want = text(
        "unordered_seed",
        owner="M",
        field="tok",
        slot=6,
        op="seed",
        stream=HOST,
        other_op="stash",
        other_stream=stream,
    )
    return want, lambda: d.seeded(rows(6), ("tok",))


def _unordered_seed_summary() -> tuple[str, Callable[[], object]]:
    d = checks(named=False)
    write_on_stream(d, ("tok",), 6)
    want = text(
        "unordered_seed_summary", owner="M", fields="tok", op="seed", stream=HOST
    )
    return want, lambda: d.seeded(rows(6), ("tok",))


def _seed_over_unread() -> tuple[str, Callable[[], object]]:
    d = checks()
    d.wrote("stash", rows(4), ("tok",), owners=["req-a"])
    want = text(
        "seed_over_unread",
        owner="M",
        field="tok",
        slot=4,
        op="seed",
        request="'req-b'",
        writer_op="stash",
        other="'req-a'",
    )
    return want, lambda: d.seeded(rows(4), ("tok",), owners=["req-b"])


def _seed_over_unread_summary() -> tuple[str, Callable[[], object]]:
    d = checks(named=False)
    d.wrote("stash", rows(4), ("tok",), owners=["req-a"])
    want = text("seed_over_unread_summary", owner="M", fields="tok", op="seed")
    return want, lambda: d.seeded(rows(4), ("tok",), owners=["req-b"])


def _scatter(*starts: int) -> Callable[[], object]:
    d = checks()
    owners = ["req-a", "req-b"]
    return lambda: d.check_scatter(
        "tok", rows(3, 5), torch.tensor(starts), 2, 6, owners
    )


def _scatter_outside() -> tuple[str, Callable[[], object]]:
    want = text(
        "scatter_outside",
        owner="M",
        field="tok",
        request="request 'req-b' (row 1, slot 5)",
        start=5,
        width=2,
        size=6,
    )
    return want, _scatter(0, 5)


def _scatter_overlap() -> tuple[str, Callable[[], object]]:
    want = text(
        "scatter_overlap",
        owner="M",
        field="tok",
        request="request 'req-b' (row 1, slot 5)",
        start=1,
        other="request 'req-a' (row 0, slot 3)",
        other_start=0,
        width=2,
    )
    return want, _scatter(0, 1)


def _scatter_summary() -> tuple[str, Callable[[], object]]:
    d = checks(named=False)
    want = text("scatter_summary", owner="M", field="tok")
    return want, lambda: d.check_scatter("tok", rows(3, 5), torch.tensor([0, 0]), 2, 6)


def _scatter_leftover() -> tuple[str, Callable[[], object]]:
    want = text("scatter_leftover", owner="M", field="tok", position=2, value=-1)
    target = torch.tensor([7, 8, -1, 9])
    return want, lambda: checks().check_scattered("tok", target)


def _scatter_leftover_summary() -> tuple[str, Callable[[], object]]:
    want = text("scatter_leftover_summary", owner="M", field="tok")
    target = torch.tensor([7, 8, -1, 9])
    return want, lambda: checks(named=False).check_scattered("tok", target)


def _claimed(named: bool = True) -> Callable[[], object]:
    """Request 1 (slot 5) would write positions 2 and 3; 3 holds a prefill token."""
    target = torch.tensor([7, -1, -1, 9])
    at = torch.tensor([[0, 1], [2, 3]])
    keep = torch.tensor([[False, True], [True, True]])
    d = checks(named=named)
    return lambda: d.check_claimed("tok", rows(3, 5), at, keep, target)


def _scatter_claimed() -> tuple[str, Callable[[], object]]:
    want = text(
        "scatter_claimed",
        owner="M",
        field="tok",
        request="the request in row 1 (slot 5)",
        position=3,
        value=9,
    )
    return want, _claimed()


def _scatter_claimed_summary() -> tuple[str, Callable[[], object]]:
    return text("scatter_claimed_summary", owner="M", field="tok"), _claimed(False)


def _counts(
    named: bool = True, produced: list[int] | None = None
) -> Callable[[], object]:
    d = checks(named=named)
    wrote = None if produced is None else torch.tensor(produced)
    return lambda: d.check_counts("tok", rows(3, 5), torch.tensor([1, 3]), 2, wrote)


def _scatter_count_outside() -> tuple[str, Callable[[], object]]:
    want = text(
        "scatter_count_outside",
        owner="M",
        field="tok",
        request="the request in row 1 (slot 5)",
        count=3,
        width=2,
    )
    return want, _counts()


def _scatter_count_disagrees() -> tuple[str, Callable[[], object]]:
    d = checks()
    wrote = torch.tensor([2, 2, 2, 2, 2, 1, 2, 2])
    want = text(
        "scatter_count_disagrees",
        owner="M",
        field="tok",
        request="request 8 (row 1, slot 5)",
        count=2,
        wrote=1,
    )
    return want, lambda: d.check_counts(
        "tok", rows(3, 5), torch.tensor([2, 2]), 2, wrote, torch.tensor([7, 8])
    )


def _scatter_count_summary() -> tuple[str, Callable[[], object]]:
    want = text("scatter_count_summary", owner="M", field="tok")
    return want, _counts(named=False)


#: Per message: the expected text and the call that must raise it.
TRIGGERS: dict[str, Callable[[], tuple[str, Callable[[], object]]]] = {
    "indices_dtype": _indices_dtype,
    "slot_outside": _slot_outside,
    "slot_outside_no_scratch": _slot_outside_no_scratch,
    "slot_twice": _slot_twice,
    "slots_summary": _slots_summary,
    "slots_no_scratch_summary": _slots_no_scratch_summary,
    "never_written": _never_written,
    "consumed": _consumed,
    "omitted": _omitted,
    "released": _released,
    "unordered_read": _unordered_read,
    "read_summary": _read_summary,
    "placeholder_nothing_pending": _placeholder_nothing_pending,
    "placeholder_read_summary": _placeholder_read_summary,
    "slot_named_twice": _slot_named_twice,
    "slot_named_twice_summary": _slot_named_twice_summary,
    "wrong_owner": _wrong_owner,
    "unordered_seed": _unordered_seed,
    "unordered_seed_summary": _unordered_seed_summary,
    "seed_over_unread": _seed_over_unread,
    "scatter_outside": _scatter_outside,
    "scatter_overlap": _scatter_overlap,
    "scatter_summary": _scatter_summary,
    "scatter_claimed": _scatter_claimed,
    "scatter_claimed_summary": _scatter_claimed_summary,
    "scatter_leftover": _scatter_leftover,
    "scatter_leftover_summary": _scatter_leftover_summary,
    "scatter_count_outside": _scatter_count_outside,
    "scatter_count_disagrees": _scatter_count_disagrees,
    "scatter_count_summary": _scatter_count_summary,
    "seed_over_unread_summary": _seed_over_unread_summary,
    "unordered_write": _unordered_write,
    "write_summary": _write_summary,
    "stale_fence": _stale_fence,
    "graph_not_run": _graph_not_run,
    "kept_stale": _kept_stale,
    "kept_stale_summary": _kept_stale_summary,
    "stale_tail": _stale_tail,
    "stale_tail_summary": _stale_tail_summary,
    "guard_non_negative_summary": _guard_non_negative_summary,
    "guard_positive_summary": _guard_positive_summary,
    "guard_finite_summary": _guard_finite_summary,
    "cast_summary": _cast_summary,
    "placeholder": _placeholder,
    "placeholder_summary": _placeholder_summary,
}


def test_every_message_has_a_trigger() -> None:
    """The table and the triggers below name the same messages."""
    assert sorted(TRIGGERS) == sorted(MESSAGES)


@pytest.mark.parametrize("key", sorted(TRIGGERS))
def test_each_message_is_raised_word_for_word(key: str) -> None:
    """The check behind each message raises exactly its text: a ``RelayDebugError``
    where it is named on the host, the device-side assert's ``RuntimeError`` for a
    summary."""
    want, call = TRIGGERS[key]()
    error = RuntimeError if key.endswith("_summary") else RelayDebugError
    with pytest.raises(error) as caught:
        call()
    assert str(caught.value) == want


@pytest.mark.parametrize("key", sorted(MESSAGES))
def test_each_message_is_quoted_in_the_docs(key: str) -> None:
    """docs/debugging.md quotes every message verbatim (fields in braces)."""
    assert f"`{MESSAGES[key]}`" in DOCS.read_text(encoding="utf-8")
