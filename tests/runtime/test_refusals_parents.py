"""A scatter whose target lies under an optional parent is planned with every other
target before any is written, and slots on the meta device are relay's error with debug
off too."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from relay import RelayError
from relay.schema import Field, Guard, IfNone, Lane, Scatter, Schema
from relay.testing import Namespace, load_map_class

PAD = -1
MODES = pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
PARENTS = pytest.mark.parametrize("how", [IfNone.SKIP, IfNone.REFUSE], ids=str)


def _schema(how: IfNone) -> Schema:
    return Schema(
        name="UnderParentFutureMap",
        optional_parents={"spec_info": how},
        fields=[
            Field(
                "tok",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                resolve=Scatter(offsets="starts"),
                target="input_ids",
                guard=Guard.NON_NEGATIVE,
            ),
            Field(
                "pos",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                resolve=Scatter(offsets="spec_info.pos_starts"),
                target="spec_info.positions",
            ),
        ],
    )


def _map(how: IfNone, debug: bool) -> Any:
    cls = load_map_class(_schema(how))
    payload = importlib.import_module(cls.__module__).UnderParentPayload
    relay = cls("cpu", 8, debug=debug)
    relay.stash(
        torch.tensor([2, 4]),
        payload(tok=torch.tensor([1, 2]), pos=torch.tensor([5, 6])),
    )
    return relay


def _batch(pos_starts: list[int]) -> Namespace:
    return Namespace(
        req_pool_indices=torch.tensor([2, 4]),
        starts=torch.tensor([0, 1]),
        input_ids=torch.full((2,), PAD),
        spec_info=Namespace(
            pos_starts=torch.tensor(pos_starts), positions=torch.full((2,), PAD)
        ),
    )


@MODES
@PARENTS
def test_a_refused_scatter_under_an_optional_parent_leaves_the_other_target(
    how: IfNone, debug: bool
) -> None:
    """The target under ``spec_info`` is refused before ``input_ids`` is written."""
    relay = _map(how, debug)
    batch = _batch([0, 2])  # past the end of a 2-long target
    with pytest.raises(RelayError, match=r"UnderParentFutureMap\.pos"):
        relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [PAD, PAD]
    assert batch.spec_info.positions.tolist() == [PAD, PAD]


@MODES
@PARENTS
def test_both_targets_are_written_when_both_fit(how: IfNone, debug: bool) -> None:
    relay = _map(how, debug)
    batch = _batch([1, 0])
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [1, 2]
    assert batch.spec_info.positions.tolist() == [6, 5]


@MODES
def test_a_skipped_parent_leaves_its_target_alone(debug: bool) -> None:
    relay = _map(IfNone.SKIP, debug)
    batch = _batch([0, 1])
    batch.spec_info = None
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [1, 2]


@MODES
def test_meta_slots_are_refused_by_every_resolve(debug: bool) -> None:
    """int64 slots on the meta device: ``index_select`` would take them and hand back
    uninitialised rows; relay refuses them by name, nothing written."""
    from relay.maps.vllm_drafts import VllmDraftsFutureMap, VllmDraftsPayload

    relay = VllmDraftsFutureMap("cpu", 8, num_speculative_tokens=3, debug=debug)
    relay.stash(
        torch.tensor([4, 2]),
        VllmDraftsPayload(
            sampled_token_ids=torch.tensor([10, 20]),
            draft_token_ids=torch.tensor([[11, 12, 13], [21, 22, 23]]),
            num_draft_tokens=torch.tensor([3, 3]),
        ),
    )
    relay.publish(torch.tensor([4, 2]), torch.tensor([3, 3]))
    meta = torch.tensor([4, 2], device="meta")
    batch = Namespace(
        slots=meta,
        req_ids=None,
        query_starts=torch.tensor([0, 3]),
        num_draft_tokens=torch.tensor([2, 1]),
        input_ids=torch.full((5,), PAD),
        drafts_made=None,
        drafts_made_cpu=None,
    )
    refused = r"VllmDraftsFutureMap\.resolve_\w+: .*on meta, not on the map's device"
    with pytest.raises(RelayError, match=refused):
        relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [PAD] * 5
    with pytest.raises(RelayError, match=refused):
        relay.resolve_drafts_made_cpu(batch)
    assert batch.drafts_made_cpu is None
