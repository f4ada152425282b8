"""Debug mode and seeds that name their requests: a seed must not take a row whose
value another, still live request has not read (Note [Seeds])."""

from __future__ import annotations

import importlib

import pytest
import torch

from relay import RelayDebugError
from relay.schema import Field, Lane, Schema
from relay.testing import Namespace, load_map_class

OWNED = Schema(
    name="OwnedSeedFutureMap",
    owners="rids",
    seeded=True,
    fields=[Field("tok", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids")],
)


def _map() -> tuple[object, type]:
    cls = load_map_class(OWNED)
    payload = importlib.import_module(cls.__module__).OwnedSeedPayload
    return cls("cpu", 8, debug=True), payload


def _resolve(relay: object, *slots: int, rids: list[str]) -> Namespace:
    batch = Namespace(req_pool_indices=torch.tensor(slots), rids=rids)
    relay.resolve_future(batch)  # type: ignore[attr-defined]
    return batch


def test_a_seed_over_a_live_requests_unread_value_is_reported() -> None:
    """Request a's stashed token, never read and its slot never released, would be lost
    to request b's seed: reported, naming both requests and the fix."""
    relay, payload = _map()
    relay.stash(torch.tensor([3]), payload(tok=torch.tensor([11])), owners=["a"])
    relay.seed(torch.tensor([3]), payload(tok=torch.tensor([22])), owners=["b"])
    with pytest.raises(
        RelayDebugError,
        match=r"tok: slot 3: seed for request 'b' would overwrite the value stash "
        r"wrote for request 'a'.*Release the slot",
    ):
        _resolve(relay, 3, rids=["b"])


@pytest.mark.parametrize("ended", ["read", "released"])
def test_a_seed_after_the_old_request_read_or_ended_is_taken(ended: str) -> None:
    """Once request a's value was read, or its slot released, b's seed is the row's
    value and b reads it."""
    relay, payload = _map()
    relay.stash(torch.tensor([3]), payload(tok=torch.tensor([11])), owners=["a"])
    if ended == "read":
        assert _resolve(relay, 3, rids=["a"]).input_ids.tolist() == [11]
    else:
        relay.release(torch.tensor([3]))
    relay.seed(torch.tensor([3]), payload(tok=torch.tensor([22])), owners=["b"])
    assert _resolve(relay, 3, rids=["b"]).input_ids.tolist() == [22]
