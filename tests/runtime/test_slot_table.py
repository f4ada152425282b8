"""``SlotTable``: the slot bookkeeping an engine indexed by batch row needs (Note in
relay/slots.py): slots taken and freed, the step's indices in row order, releases on
every map, and each misuse refused naming the request."""

from __future__ import annotations

import pytest
import torch

from relay import RelayDebugError, RelayError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.slots import SlotTable
from relay.testing import Namespace


def test_slots_start_at_one_and_the_longest_free_is_taken_first() -> None:
    """Row 0 is the scratch row; a freed slot is reused after every never-used one."""
    table = SlotTable(4)
    assert [table.take(r) for r in "abc"] == [1, 2, 3]
    assert table.free == 0 and len(table) == 3 and "b" in table
    assert table.finish(["b"]).tolist() == [2]
    assert table.take("d") == 2
    assert table.slot("d") == 2 and "b" not in table


def test_indices_follow_the_rows_in_their_order() -> None:
    """Rows reordered between steps: the indices are the step-to-step row map."""
    table = SlotTable(8)
    for request in ("r0", "r1", "r2"):
        table.take(request)
    assert table.indices(["r2", "r0", "r1"]).tolist() == [3, 1, 2]
    assert table.indices([]).dtype == torch.int64


@pytest.mark.parametrize(
    ("misuse", "message"),
    [
        (lambda t: t.take("a"), r"request 'a' already holds slot 1"),
        (lambda t: (t.take("b"), t.take("c")), r"all 2 slots are held"),
        (lambda t: t.finish(["z"]), r"SlotTable.finish: request 'z' holds no slot"),
        (lambda t: t.finish(["a", "a"]), r"a request is named twice"),
        (lambda t: t.indices(["a", "z"]), r"indices \(row 1\): request 'z' holds no"),
        (lambda t: t.slot("z"), r"SlotTable.slot: request 'z' holds no slot"),
    ],
    ids=[
        "taken twice",
        "pool exhausted",
        "unknown finish",
        "finished twice",
        "row",
        "slot",
    ],
)
def test_misuse_is_refused_naming_the_request(misuse: object, message: str) -> None:
    """Refused with relay's message; the table is left as it was."""
    table = SlotTable(3)
    table.take("a")
    with pytest.raises(RelayError, match=message):
        misuse(table)  # type: ignore[operator]
    assert table.slot("a") == 1


def test_a_pool_without_a_real_slot_is_refused() -> None:
    """pool_size 1 holds only the scratch row."""
    with pytest.raises(RelayError, match=r"pool_size must be an int >= 2"):
        SlotTable(1)


def test_finish_releases_the_slots_on_every_map() -> None:
    """In debug mode a finished request's unread value is stale: the next request in
    its slot cannot read it."""
    maps = [DecodeFutureMap("cpu", 4, debug=True) for _ in range(2)]
    table = SlotTable(2, maps)  # one slot: "b" takes the one "a" held
    table.take("a")
    for relay_map in maps:
        relay_map.stash(
            table.indices(["a"]), DecodePayload(next_token_ids=torch.tensor([5]))
        )
    table.finish(["a"])
    table.take("b")
    for relay_map in maps:
        batch = Namespace(req_pool_indices=table.indices(["b"]))
        with pytest.raises(RelayDebugError, match="released"):
            relay_map.resolve_future(batch)
