"""``relay.debug.DebugChecks`` called directly, as the generated maps call it: per-row state
apart from the values, slot checks, generations, fence freshness and happens-before."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from relay_runtime_support import GUARD_S, thread_streams

import relay.cpu_stream
from relay import RelayDebugError, debug
from relay.codegen.loader import load_schema
from relay.cpu_stream import CpuEvent
from relay.debug import DebugChecks, poison
from relay.device import register_policy
from relay.maps.decode import DecodeFutureMap
from relay.testing import check_lockstep

# The ordering checks need the clocks, which an engine installs (a debug map does not).
pytestmark = pytest.mark.usefixtures("clocks_on")

POOL = 8
ROOT = Path(__file__).resolve().parents[2]


def checks(device: torch.device | str = "cpu") -> DebugChecks:
    """Checks of a map with forward fields ``tok``, ``flag``, ``opt`` and schedule field ``lens``."""
    return DebugChecks(
        torch.device(device),
        POOL,
        "M",
        forward=("tok", "flag", "opt"),
        schedule=("lens",),
        consumers=("resolve_lens",),
    )


def stash(
    d: DebugChecks, field: str, buf: torch.Tensor, idx: torch.Tensor, value: Any
) -> None:
    """A stash of one field as the generated code does it: check, write, report."""
    d.check_slots("stash", idx)
    buf[idx.long()] = torch.as_tensor(value, dtype=buf.dtype, device=buf.device)
    d.wrote("stash", idx, (field,))


def resolve(
    d: DebugChecks, field: str, buf: torch.Tensor, idx: torch.Tensor
) -> torch.Tensor:
    """A gather resolve of one field as the generated code does it."""
    d.check_slots("resolve_future", idx)
    value = buf[idx.long()]
    d.read("resolve_future", idx, {field: buf})
    return value


@pytest.mark.parametrize(
    ("dtype", "legal"),
    [
        (torch.float32, float("nan")),
        (torch.bfloat16, float("nan")),
        (torch.int64, -1),
        (torch.int32, -1),
        (torch.uint8, 255),
        (torch.bool, True),
    ],
)
def test_the_poison_value_is_a_legal_value(
    device: torch.device, dtype: torch.dtype, legal: Any
) -> None:
    """A payload equal to the poison (NaN, -1, True...) is handed over, not reported."""
    d = checks(device)
    buf = torch.full((POOL,), poison(dtype), dtype=dtype, device=device)
    idx = torch.tensor([3, 5], device=device)
    stash(d, "tok", buf, idx, [legal, legal])
    got = resolve(d, "tok", buf, idx)
    assert torch.equal(
        got.isnan() if dtype.is_floating_point else got,
        torch.ones(2, dtype=torch.bool, device=device)
        if dtype.is_floating_point
        else torch.full_like(got, legal),
    )


@pytest.mark.parametrize("dtype", [torch.bool, torch.float16, torch.int8, torch.int64])
def test_a_second_read_is_caught_for_every_dtype(dtype: torch.dtype) -> None:
    """Whatever the dtype (bool included), a value is consumed once; a second read is reported."""
    d = checks()
    buf = torch.zeros(POOL, dtype=dtype)
    idx = torch.tensor([2])
    stash(d, "flag", buf, idx, [0])
    resolve(d, "flag", buf, idx)
    assert buf[2].item() == poison(dtype) or dtype.is_floating_point
    with pytest.raises(
        RelayDebugError, match=r"M\.flag: slot 2: resolve_future .*not written since"
    ):
        resolve(d, "flag", buf, idx)


@pytest.mark.parametrize(
    "index_dtype", [torch.int64, torch.int32, torch.int16, torch.uint8]
)
def test_any_integer_index_dtype_is_checked(index_dtype: torch.dtype) -> None:
    """int32, int16 and uint8 slots work like int64: written, read once, re-read caught."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    idx = torch.tensor([1, 4], dtype=index_dtype)
    stash(d, "tok", buf, idx, [7, 8])
    assert resolve(d, "tok", buf, idx).tolist() == [7, 8]
    with pytest.raises(RelayDebugError, match="slot 1"):
        resolve(d, "tok", buf, idx)


def test_a_never_written_row_is_reported_as_such() -> None:
    """A resolve with no stash before it names the field, the slot and the cause."""
    d = checks()
    with pytest.raises(
        RelayDebugError,
        match=r"M\.tok: slot 3: resolve_future reads a row that was never written",
    ):
        resolve(d, "tok", torch.zeros(POOL), torch.tensor([3]))


def test_slots_out_of_range_are_refused_before_any_write() -> None:
    """Negative slots and slots >= pool_size are reported by check_slots, naming the slot."""
    d = checks()
    with pytest.raises(
        RelayDebugError,
        match=r"stash: slots must be in \[0, 8\); slot -1 at position 1 is not",
    ):
        d.check_slots("stash", torch.tensor([1, -1]))
    with pytest.raises(RelayDebugError, match=r"slot 8 at position 0 is not"):
        d.check_slots("publish", torch.tensor([8]))


def test_the_scratch_row_is_refused_where_padding_is_not_allowed() -> None:
    """invalidate (scratch_ok=False) refuses slot 0; a padded stash may repeat it."""
    d = checks()
    with pytest.raises(
        RelayDebugError,
        match=r"invalidate: slots must be in \[1, 8\) \(row 0 is the scratch row.*slot 0 at position 0 is not",
    ):
        d.check_slots("invalidate", torch.tensor([0, 3]), scratch_ok=False)
    d.check_slots("stash", torch.tensor([0, 3, 0, 0]))  # padding: no error


def test_a_slot_twice_in_one_batch_is_reported() -> None:
    """A repeated slot means two requests share a row: reported, for stashes and resolves."""
    d = checks()
    with pytest.raises(RelayDebugError, match="slot 5 appears twice"):
        d.check_slots("stash", torch.tensor([5, 2, 5]))
    with pytest.raises(RelayDebugError, match="slot 2 appears twice"):
        d.check_slots("resolve_future", torch.tensor([2, 2], dtype=torch.int32))


def test_float_or_bool_indices_are_refused() -> None:
    """Indices must be integer slots; a bool mask or float tensor is named as the mistake."""
    d = checks()
    with pytest.raises(RelayDebugError, match="integer slots, got a torch.bool"):
        d.check_slots("stash", torch.tensor([True, False]))


def test_scratch_row_reads_are_not_checked() -> None:
    """Padded positions read row 0 whatever its state: no report, and real rows still checked."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "tok", buf, torch.tensor([4]), [9])
    assert resolve(d, "tok", buf, torch.tensor([4, 0, 0])).tolist() == [9, 0, 0]


def test_an_omitted_optional_field_read_is_reported() -> None:
    """After a stash that left the optional field out, reading it names the omission."""
    d = checks()
    buf = torch.zeros(POOL, 3)
    stash(d, "opt", buf, torch.tensor([1]), torch.ones(1, 3))
    d.wrote("stash", torch.tensor([1]), ("opt",), carried={"opt": False})
    with pytest.raises(
        RelayDebugError,
        match=r"M\.opt: slot 1: .*latest stash of this slot left it out",
    ):
        resolve(d, "opt", buf, torch.tensor([1]))


def test_a_stash_carrying_the_optional_field_again_makes_it_readable() -> None:
    """Omitted then carried: the newest stash wins and the value is handed over."""
    d = checks()
    buf = torch.zeros(POOL, 2)
    d.wrote("stash", torch.tensor([1]), ("opt",), carried={"opt": False})
    stash(d, "opt", buf, torch.tensor([1]), [[1.0, 2.0]])
    assert resolve(d, "opt", buf, torch.tensor([1])).tolist() == [[1.0, 2.0]]


def test_taken_masks_the_positions_really_read() -> None:
    """A placeholder resolve checks and consumes only the pending positions."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "tok", buf, torch.tensor([2]), [5])
    rows = torch.tensor(
        [2, 0, 0]
    )  # position 1 and 2 hold real tokens (row 0 after clamp)
    taken = torch.tensor([True, False, False])
    d.read("resolve_future", rows, {"tok": buf}, taken=taken)
    with pytest.raises(RelayDebugError, match="slot 2"):
        d.read("resolve_future", rows, {"tok": buf}, taken=taken)
    d.read(
        "resolve_future", torch.tensor([3]), {"tok": buf}, taken=torch.tensor([False])
    )  # not read


def test_a_slot_released_between_write_and_read_is_reported() -> None:
    """The value of a slot's previous request is never handed to the next one."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    stash(d, "tok", buf, torch.tensor([3]), [1])
    d.release(torch.tensor([3], dtype=torch.int32))
    with pytest.raises(
        RelayDebugError, match="released and reused between its write .stash."
    ):
        resolve(d, "tok", buf, torch.tensor([3]))
    stash(d, "tok", buf, torch.tensor([3]), [2])
    assert resolve(d, "tok", buf, torch.tensor([3])).tolist() == [2]


def test_each_publish_allows_one_wait_per_consumer() -> None:
    """A wait with no publish since the last one is stale; a new publish allows the next."""
    d = checks()
    with pytest.raises(
        RelayDebugError, match=r"M\.resolve_lens: fence waited on with no publish"
    ):
        d.waited("resolve_lens")
    d.publishing()
    d.waited("resolve_lens")
    with pytest.raises(RelayDebugError, match="no publish since the last wait"):
        d.waited("resolve_lens")


# -- happens-before ----------------------------------------------------------------


def test_forward_lane_on_the_writers_stream_is_ordered_by_stream_order() -> None:
    """Stash and resolve on one ThreadStream need no fence: no report."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    idx = torch.tensor([1])
    got: list[list[int]] = []
    with thread_streams("fwd") as (stream,):
        stream.submit(lambda: stash(d, "tok", buf, idx, [3]))
        stream.submit(lambda: got.append(resolve(d, "tok", buf, idx).tolist()))
        stream.synchronize()
    assert got == [[3]]


def test_a_read_not_ordered_after_its_write_names_both_sides() -> None:
    """A host read after a write on a stream, synced only by a gate the checker cannot see."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    written = threading.Event()

    def write() -> None:
        stash(d, "tok", buf, torch.tensor([6]), [1])
        written.set()

    with thread_streams("fwd") as (stream,):
        stream.submit(write)
        assert written.wait(GUARD_S)
        with pytest.raises(
            RelayDebugError,
            match=r"M\.tok: slot 6: resolve_future on host thread .* reads the value stash "
            r"wrote on ThreadStream\('fwd'\), but nothing orders the read after that write",
        ):
            resolve(d, "tok", buf, torch.tensor([6]))


def test_a_host_that_synchronized_the_stream_may_read() -> None:
    """stream.synchronize() orders the host after the stream's tasks: the read is clean."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    with thread_streams("fwd") as (stream,):
        stream.submit(lambda: stash(d, "tok", buf, torch.tensor([6]), [1]))
        stream.synchronize()
    assert resolve(d, "tok", buf, torch.tensor([6])).tolist() == [1]


def test_a_cpu_event_orders_a_reader_after_the_recording_stream() -> None:
    """Write, record on one stream; wait on the event on another; the read there is ordered."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    event = CpuEvent()
    got: list[list[int]] = []

    def write() -> None:
        stash(d, "tok", buf, torch.tensor([2]), [4])
        event.record()

    def read() -> None:
        event.wait()
        got.append(resolve(d, "tok", buf, torch.tensor([2])).tolist())

    with thread_streams("a", "b") as (a, b):
        a.submit(write)
        a.synchronize()  # the record exists before b's wait is queued
        b.submit(read)
        b.synchronize()
    assert got == [[4]]


def test_two_unordered_writes_of_one_row_are_reported() -> None:
    """Two streams stash one slot with nothing ordering them: reported as a write-write race."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    first = threading.Event()
    errors: list[BaseException] = []

    def write_a() -> None:
        stash(d, "tok", buf, torch.tensor([3]), [1])
        first.set()

    def write_b() -> None:
        assert first.wait(GUARD_S)
        try:
            stash(d, "tok", buf, torch.tensor([3]), [2])
        except RelayDebugError as error:
            errors.append(error)

    with thread_streams("a", "b") as (a, b):
        a.submit(write_a)
        b.submit(write_b)
        b.synchronize()
    assert len(errors) == 1
    assert (
        "slot 3: stash on ThreadStream('b') overwrites the value stash wrote on "
        "ThreadStream('a')" in str(errors[0])
    )


def test_two_writes_checked_at_the_same_moment_are_reported() -> None:
    """Stream a has checked its write of slot 3 but not yet stamped it when stream b
    writes the slot: b's check waits for a's stamp and reports the race. (Were the
    check and the stamp apart, both would pass and the race would go unreported.)"""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    a_checked, a_go, b_waits_or_ends = (threading.Event() for _ in range(3))
    errors: list[BaseException] = []
    stamp = d.state.stamp

    def stamp_when_let(*args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "a" and not a_checked.is_set():
            a_checked.set()
            assert a_go.wait(GUARD_S)
        stamp(*args, **kwargs)

    class SeenLock:
        """The map's lock, telling the test when b waits for it."""

        def __init__(self, lock: Any) -> None:
            self.lock = lock

        def __enter__(self) -> None:
            if threading.current_thread().name == "b":
                b_waits_or_ends.set()
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    def write_b() -> None:
        try:
            stash(d, "tok", buf, torch.tensor([3]), [2])
        except RelayDebugError as error:
            errors.append(error)
        finally:
            b_waits_or_ends.set()

    d.state.stamp = stamp_when_let  # type: ignore[method-assign]
    d._lock = SeenLock(d._lock)  # type: ignore[assignment]
    with thread_streams("a", "b") as (a, b):
        a.submit(lambda: stash(d, "tok", buf, torch.tensor([3]), [1]))
        assert a_checked.wait(GUARD_S)
        b.submit(write_b)
        assert b_waits_or_ends.wait(GUARD_S)
        a_go.set()
        b.synchronize()
        a.synchronize()
    assert len(errors) == 1, "the race went unreported"
    assert (
        "slot 3: stash on ThreadStream('b') overwrites the value stash wrote on "
        "ThreadStream('a')" in str(errors[0])
    )


def test_a_host_that_waited_for_one_task_is_not_ordered_after_the_next() -> None:
    """The host waits for task 1 after task 2 has also finished (a gate the checker
    cannot see tells it so): it is ordered after task 1's write only."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    second_done = threading.Event()

    def second() -> None:
        stash(d, "tok", buf, torch.tensor([2]), [7])
        second_done.set()

    with thread_streams("fwd") as (stream,):
        first = stream.submit(lambda: stash(d, "tok", buf, torch.tensor([1]), [5]))
        stream.submit(second)
        assert second_done.wait(GUARD_S)
        stream.wait_ticket(first, lambda: False)
        assert resolve(d, "tok", buf, torch.tensor([1])).tolist() == [5]
        with pytest.raises(RelayDebugError, match="nothing orders the read"):
            resolve(d, "tok", buf, torch.tensor([2]))


def test_an_event_wait_is_ordered_after_the_record_it_waited_for_only() -> None:
    """Task 1 writes slot 1 and records the event; the host waits on it. While it
    waits, task 2, submitted after the wait began, writes slot 2 and records the
    event again: the host is ordered after task 1's record, not task 2's."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    event = CpuEvent()

    def write_and_record(slot: int, value: int) -> None:
        stash(d, "tok", buf, torch.tensor([slot]), [value])
        event.record()

    with thread_streams("fwd") as (stream,):
        stream.submit(lambda: write_and_record(1, 5))
        newest_before = stream.newest_before

        def a_later_task_records_meanwhile(order: int | None) -> int:
            newest = newest_before(order)
            stream.submit(lambda: write_and_record(2, 7))
            stream.wait_ticket(stream.submitted, lambda: False, join=False)
            return newest

        stream.newest_before = a_later_task_records_meanwhile  # type: ignore[method-assign]
        event.synchronize()
        stream.newest_before = newest_before  # type: ignore[method-assign]
        assert resolve(d, "tok", buf, torch.tensor([1])).tolist() == [5]
        with pytest.raises(RelayDebugError, match="nothing orders the read"):
            resolve(d, "tok", buf, torch.tensor([2]))


def test_an_event_wait_that_returned_at_the_record_does_not_join_the_task_end() -> None:
    """The host's event wait is issued while the task is queued, and returns at the
    task's record; by the time it looks, the task has also written slot 2 and ended.
    The host is ordered after the record (slot 1), not after the task's end (slot 2)."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    event = CpuEvent()
    go, ended = threading.Event(), threading.Event()

    def forward() -> None:
        assert go.wait(GUARD_S)
        stash(d, "tok", buf, torch.tensor([1]), [5])
        event.record()
        stash(d, "tok", buf, torch.tensor([2]), [7])

    with thread_streams("fwd") as (stream,):
        stream.submit(forward)
        stream.submit(ended.set)  # opens once the forward's end is booked
        newest_before = stream.newest_before

        def the_task_ends_meanwhile(order: int | None) -> int:
            newest = newest_before(order)  # the forward, still queued
            go.set()
            assert ended.wait(GUARD_S)
            return newest

        stream.newest_before = the_task_ends_meanwhile  # type: ignore[method-assign]
        event.synchronize()
        stream.newest_before = newest_before  # type: ignore[method-assign]
        assert resolve(d, "tok", buf, torch.tensor([1])).tolist() == [5]
        with pytest.raises(RelayDebugError, match="nothing orders the read"):
            resolve(d, "tok", buf, torch.tensor([2]))


class FakeStream:
    """A device stream as the checker sees one (a stream id), on a fake CPU policy."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.device_type = 0
        self.device_index = 0

    def __repr__(self) -> str:
        return f"<fake stream {self.stream_id}>"


class FakeDevicePolicy:
    """A policy whose current stream is chosen by the test (events are not CpuEvents);
    DebugChecks asks a policy for its current stream only."""

    current: Any = None

    def current_stream(self) -> Any:
        return FakeDevicePolicy.current


@pytest.fixture
def fake_streams(isolated_policies: None) -> Any:
    """Debug checks built now see device streams set with ``FakeDevicePolicy.current``."""
    fake: Any = FakeDevicePolicy()
    register_policy("cpu", lambda device: fake)
    yield FakeDevicePolicy
    FakeDevicePolicy.current = None


def test_device_streams_report_through_the_public_api(fake_streams: Any) -> None:
    """Device streams: unordered read reported; record_event + wait_event order it."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    forward, scheduler = FakeStream(101), FakeStream(102)
    fake_streams.current = forward
    stash(d, "tok", buf, torch.tensor([1, 2]), [1, 2])
    event = object.__new__(CpuEvent)  # any object works as the event key
    debug.record_event(event, forward)
    stash(d, "tok", buf, torch.tensor([2]), [3])  # after the record: not covered by it
    fake_streams.current = scheduler
    debug.wait_event(scheduler, event)
    assert resolve(d, "tok", buf, torch.tensor([1])).tolist() == [1]
    with pytest.raises(
        RelayDebugError,
        match=r"slot 2: .*on stream <fake stream 102> reads the value "
        r"stash wrote on stream <fake stream 101>",
    ):
        resolve(d, "tok", buf, torch.tensor([2]))


def test_the_host_orders_what_it_launches_after_what_it_synchronized(
    fake_streams: Any,
) -> None:
    """Launch edge: after a host synchronize on an event, work the host enqueues follows it."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    fake_streams.current = FakeStream(201)
    stash(d, "tok", buf, torch.tensor([5]), [5])
    event = object.__new__(CpuEvent)
    debug.record_event(event, FakeStream(201))
    debug.synchronize_event(event)  # the host thread
    fake_streams.current = FakeStream(202)
    assert resolve(d, "tok", buf, torch.tensor([5])).tolist() == [5]


def test_the_modelled_fence_chains_two_publishing_streams(fake_streams: Any) -> None:
    """Off the CPU policy the fence is modelled: publishes from two streams are chained."""
    d = checks()
    buf = torch.zeros(POOL, dtype=torch.int64)
    for stream_id, slot in ((301, 1), (302, 2)):
        fake_streams.current = FakeStream(stream_id)
        d.check_slots("publish", torch.tensor([slot]))
        buf[slot] = slot
        d.wrote("publish", torch.tensor([slot]), ("lens",))
        d.publishing()
    fake_streams.current = FakeStream(303)
    d.waited("resolve_lens")
    value = buf[torch.tensor([1, 2])]
    d.read("resolve_lens", torch.tensor([1, 2]), {"lens": buf})
    assert value.tolist() == [1, 2]


def test_many_steps_on_two_ordered_streams_report_nothing() -> None:
    """Stashes on one stream, each followed by a record, read on another behind a wait: clean."""
    d = DebugChecks(torch.device("cpu"), 32, "M", forward=("tok",))
    buf = torch.zeros(32, dtype=torch.int64)
    event = CpuEvent()
    got: list[int] = []
    with thread_streams("a", "b") as (a, b):
        for step in range(20):
            slot = torch.tensor([1 + step])

            def write(slot: torch.Tensor = slot, step: int = step) -> None:
                stash(d, "tok", buf, slot, [step])
                event.record()

            def read(slot: torch.Tensor = slot) -> None:
                event.wait()
                got.extend(resolve(d, "tok", buf, slot).tolist())

            a.submit(write)
            b.submit(read)
        b.synchronize()
        a.synchronize()
    assert got == list(range(20))


def test_without_the_clocks_the_other_checks_stay() -> None:
    """With the clocks uninstalled, an unordered read passes; a second read is still caught."""
    debug.disable_happens_before()
    try:
        assert not debug.happens_before_enabled()
        d = checks()
        buf = torch.zeros(POOL, dtype=torch.int64)
        written = threading.Event()

        def write() -> None:
            stash(d, "tok", buf, torch.tensor([6]), [1])
            written.set()

        with thread_streams("fwd") as (stream,):
            stream.submit(write)
            assert written.wait(GUARD_S)
            assert resolve(d, "tok", buf, torch.tensor([6])).tolist() == [1]
        with pytest.raises(RelayDebugError, match="not written since"):
            resolve(d, "tok", buf, torch.tensor([6]))
    finally:
        debug.enable_happens_before()  # for the fixture, which uninstalls its own


def test_building_debug_checks_installs_no_clocks() -> None:
    """A debug map leaves the process-wide clocks as it found them: off stays off."""
    debug.disable_happens_before()
    try:
        checks()
        DecodeFutureMap("cpu", 4, debug=True)
        assert not debug.happens_before_enabled()
        assert relay.cpu_stream.observer is None
    finally:
        debug.enable_happens_before()


def test_happens_before_blocks_count_their_holders() -> None:
    """Nested (or concurrent) ``happens_before()`` blocks keep the clocks on until the last ends."""
    debug.disable_happens_before()
    try:
        with debug.happens_before():
            with debug.happens_before():
                assert debug.happens_before_enabled()
            assert debug.happens_before_enabled()
            assert relay.cpu_stream.observer is not None
        assert not debug.happens_before_enabled()
        assert relay.cpu_stream.observer is None
    finally:
        debug.enable_happens_before()


def test_the_lockstep_harness_installs_the_clocks_for_its_run_only() -> None:
    """A debug-mode lockstep run checks stream order (the clocks on while it runs), and
    leaves them as it found them."""
    seen: list[bool] = []

    class Probe(DecodeFutureMap):
        def resolve_future(self, batch: Any) -> None:
            seen.append(debug.happens_before_enabled())
            super().resolve_future(batch)

    schema = load_schema(
        ROOT / "relay" / "schemas" / "decode.py", "relay/schemas/decode.py"
    )
    debug.disable_happens_before()
    try:
        check_lockstep(schema, Probe, operations=200, steps=20, shrink=False)
        assert seen and all(seen)
        assert not debug.happens_before_enabled()
    finally:
        debug.enable_happens_before()


def test_a_device_assert_message_fits_cuda_s_limit() -> None:
    """On CUDA, debug mode asserts on the device (no host sync), and torch refuses a
    message of 255 bytes or more: a long report is cut, never refused (seen on an H200)."""
    from relay.debug.checks import _device_message

    short = "slot 3 was never written"
    assert _device_message(short) == short
    cut = _device_message("resolve_future read a poisoned row: " + "é" * 300)
    assert len(cut.encode()) < 255 and cut.endswith("...")
    assert cut.startswith("resolve_future read a poisoned row: ")
