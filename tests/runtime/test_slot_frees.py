"""``SlotTable`` frees slots in stream order (Note [Slots freed in stream order] in
relay/slots.py), with the behaviour of vLLM's deferred block free (its scheduler under
async scheduling: non-empty steps numbered as they are scheduled, a freed request's
blocks held back until the newest scheduled step is processed, held-back frees drained
in order), ported; and ``finish``'s refusals and its order against the maps' release."""

from __future__ import annotations

import pytest
import torch

from relay import RelayDebugError, RelayError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.slots import SlotTable
from relay.testing import Namespace


class Recorder:
    """A map that records each release, and raises on the ones it is told to."""

    def __init__(self, pool_size: int = 8) -> None:
        self.pool_size = pool_size
        self.released: list[list[int]] = []
        self.fail = False

    def release(self, indices: torch.Tensor) -> None:
        if self.fail:
            raise RuntimeError("release failed")
        self.released.append(indices.tolist())


def test_with_no_step_in_flight_a_slot_is_free_at_once() -> None:
    """A request whose steps were all processed (or that never ran) frees at once."""
    table = SlotTable(4)
    table.take("a")
    step = table.launched(["a"])
    table.processed(step)
    table.finish(["a"])
    assert table.free == 3 and table.held_back == 0


def test_a_slot_in_a_step_in_flight_is_held_until_that_step_is_processed() -> None:
    """Finished while its step runs: the slot is not handed to the next request until
    the step is processed, and then it is released on the maps and free."""
    maps = [Recorder()]
    table = SlotTable(3, maps)
    table.take("a")
    table.take("b")
    step = table.launched(["a", "b"])
    assert table.finish(["a"]).tolist() == [1]
    assert "a" not in table and table.free == 0 and table.held_back == 1
    assert maps[0].released == []
    with pytest.raises(RelayError, match=r"1 of them ended and wait for step 1"):
        table.take("c")
    assert table.processed(step).tolist() == [1]
    assert maps[0].released == [[1]] and table.take("c") == 1


def test_the_hold_lasts_until_the_newest_step_launched_at_the_finish() -> None:
    """vLLM fences a deferred free at the newest scheduled step, not the request's
    own: a request last in step 1, finished after step 2 launched without it, waits
    for step 2."""
    table = SlotTable(4)
    for request in "ab":
        table.take(request)
    first = table.launched(["a", "b"])
    second = table.launched(["b"])
    table.finish(["a"])
    assert table.processed(first).tolist() == []
    assert table.processed(second).tolist() == [1]


def test_several_held_back_frees_drain_in_order() -> None:
    """Frees held for steps 1 and 2 return one per processed step, oldest first, and
    the pool hands them out in that order."""
    table = SlotTable(5)
    for request in "abc":
        table.take(request)
    one = table.launched(["a", "b", "c"])
    table.finish(["b"])
    two = table.launched(["a", "c"])
    table.finish(["c", "a"])
    assert table.held_back == 3
    assert table.processed(one).tolist() == [2]
    assert table.processed(two).tolist() == [3, 1]
    assert [table.take(r) for r in "defg"] == [4, 2, 3, 1]


def test_processing_a_later_step_drains_the_earlier_holds_too() -> None:
    """Steps are processed in launch order: processing step 2 covers step 1."""
    table = SlotTable(4)
    table.take("a")
    table.launched(["a"])
    table.finish(["a"])
    table.take("b")
    two = table.launched(["b"])
    table.finish(["b"])
    assert table.processed(two).tolist() == [1, 2]
    assert table.processed(1).tolist() == []


def test_abort_and_preempt_defer_like_finish() -> None:
    """An aborted request that never ran frees at once, even with steps in flight; a
    preempted one (finished, then taking a slot again) gets another slot while its
    old one is held."""
    table = SlotTable(4)
    table.take("running")
    table.take("waiting")
    step = table.launched(["running"])
    table.finish(["waiting"])  # aborted before it ran: nothing in flight writes it
    assert table.held_back == 0 and table.free == 2
    table.finish(["running"])  # preempted
    assert table.take("running") == 3  # not its old slot 1, still held back
    table.processed(step)
    assert table.take("other") == 2 and table.take("again") == 1


def test_an_empty_step_is_not_numbered() -> None:
    """A step with no rows writes no slot: launched returns 0 and holds nothing."""
    table = SlotTable(3)
    table.take("a")
    assert table.launched([]) == 0
    table.finish(["a"])
    assert table.free == 2


def test_a_release_that_raises_leaks_nothing() -> None:
    """finish releases the maps before it forgets the requests; processed keeps a
    held-back slot held back when its release raises; both can be called again."""
    recorder = Recorder()
    table = SlotTable(4, [recorder])
    table.take("a")
    recorder.fail = True
    with pytest.raises(RuntimeError, match="release failed"):
        table.finish(["a"])
    assert table.slot("a") == 1 and table.free == 2
    recorder.fail = False
    table.finish(["a"])
    assert recorder.released == [[1]] and table.free == 3
    table.take("b")
    step = table.launched(["b"])
    table.finish(["b"])
    recorder.fail = True
    with pytest.raises(RuntimeError, match="release failed"):
        table.processed(step)
    assert table.held_back == 1
    recorder.fail = False
    assert table.processed(step).tolist() == [2]


@pytest.mark.parametrize("op", ["finish", "indices", "launched"])
def test_a_string_where_requests_are_expected_is_refused(op: str) -> None:
    """``finish("ab")`` would end requests "a" and "b"; refused, naming the fix."""
    table = SlotTable(4)
    table.take("a")
    table.take("b")
    with pytest.raises(RelayError, match=rf"SlotTable\.{op}: takes an iterable .*'ab'"):
        getattr(table, op)("ab")
    assert len(table) == 2 and table.free == 1


def test_a_request_finished_twice_is_refused() -> None:
    """Named twice in one call, or finished again later: refused, nothing freed twice."""
    table = SlotTable(4)
    table.take("a")
    with pytest.raises(RelayError, match=r"named twice"):
        table.finish(["a", "a"])
    table.finish(["a"])
    with pytest.raises(RelayError, match=r"SlotTable\.finish: request 'a' holds no"):
        table.finish(["a"])
    assert table.free == 3 and [table.take(r) for r in "xyz"] == [2, 3, 1]


def test_a_table_larger_than_its_maps_pool_is_refused() -> None:
    """Slots past a map's rows could not be written: refused, naming the map."""
    with pytest.raises(RelayError, match=r"larger than the pool of maps\[1\] \(Rec"):
        SlotTable(6, [Recorder(8), Recorder(5)])
    SlotTable(5, [Recorder(8), Recorder(5)])


@pytest.mark.parametrize(
    ("step", "message"), [(3, "step 3 was never launched"), ("1", "must be the int")]
)
def test_a_step_never_launched_is_refused(step: object, message: str) -> None:
    """processed takes a number launched returned."""
    table = SlotTable(4)
    table.take("a")
    table.launched(["a"])
    with pytest.raises(RelayError, match=message):
        table.processed(step)  # type: ignore[arg-type]


def test_a_step_in_flight_reads_its_row_after_the_finish_in_debug_mode() -> None:
    """The in-flight step of a finished request still reads and stashes its row: the
    maps are released when the slot returns, after that read, so debug mode does
    not call it stale; the next request then cannot read the leftover stash."""
    relay = DecodeFutureMap("cpu", 3, debug=True)
    table = SlotTable(2, [relay])  # one slot: "b" takes the one "a" held
    table.take("a")
    relay.stash(table.indices(["a"]), DecodePayload(next_token_ids=torch.tensor([5])))
    step = table.launched(["a"])
    batch = Namespace(req_pool_indices=table.indices(["a"]))
    table.finish(["a"])  # on the scheduler, while the step runs
    relay.resolve_future(batch)  # the step in flight
    relay.stash(batch.req_pool_indices, DecodePayload(next_token_ids=torch.tensor([6])))
    table.processed(step)
    table.take("b")
    with pytest.raises(RelayDebugError, match="released"):
        relay.resolve_future(Namespace(req_pool_indices=table.indices(["b"])))
