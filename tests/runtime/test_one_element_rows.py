"""A flat target's rows of one element are gathered from the buffer's flat view (Note
[One-element rows] in relay/runtime.py): the same values as the rows flattened, in a
tensor of their own, for a buffer allocated, made or adopted."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from relay import runtime
from relay.maps.sglang_ngram import SglangNgramFutureMap, SglangNgramPayload


def _batch(indices: torch.Tensor) -> Any:
    """A scheduler batch whose draft input reads rows ``indices``."""
    spec_info = SimpleNamespace(future_indices=indices, accept_tokens=None, accept_lens=None)  # fmt: skip
    return SimpleNamespace(spec_info=spec_info, reqs=indices.tolist())


@pytest.mark.parametrize("drafts", [1, 3])
def test_a_flat_target_gets_its_rows_flattened_at_any_width(drafts: int) -> None:
    relay = SglangNgramFutureMap("cpu", 9)
    slots = torch.tensor([5, 2, 7])
    tokens = torch.arange(3 * drafts).reshape(3, drafts) + 100
    lens = torch.tensor([1, 0, drafts], dtype=torch.int32)
    relay.stash(slots, SglangNgramPayload(accept_tokens=tokens, accept_lens=lens))
    flat = relay._state.flat[0]
    assert (flat is not None) == (drafts == 1)  # a view only where a row is one element
    batch = _batch(torch.tensor([7, 5]))
    relay.resolve_future(batch)
    handed = batch.spec_info.accept_tokens
    assert handed.tolist() == torch.cat([tokens[2], tokens[0]]).tolist()
    # Its own tensor: the next stash into those rows leaves the handed values alone.
    relay.stash(slots, SglangNgramPayload(accept_tokens=tokens * 0, accept_lens=lens))
    assert handed.tolist() == torch.cat([tokens[2], tokens[0]]).tolist()


@pytest.mark.parametrize(("row", "flat"), [((1,), True), ((1, 1), True), ((2,), False), ((), False)])  # fmt: skip
def test_the_flat_view_follows_the_buffer_a_map_adopts(row: tuple[int, ...], flat: bool) -> None:  # fmt: skip
    state = runtime.MapState(SglangNgramFutureMap("cpu", 9)._state.table, torch.device("cpu"), 9, False)  # fmt: skip
    buf = torch.zeros((9, *row), dtype=torch.int64)
    state.adopt(0, buf)
    view = state.flat[0]
    assert (view is not None) == flat
    if view is not None:  # the buffer's own storage: a write to one shows in the other
        buf[4] = 11
        assert view[4].item() == 11 and view.shape == (9,)
    state.adopt(0, torch.zeros((9, 3), dtype=torch.int64))  # a wider row: no view now
    assert state.flat[0] is None
