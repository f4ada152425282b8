"""Property tests: whatever the pool size, slots and values, the relay hands over exactly
what was stashed or published, slot by slot."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from debug_support import (
    batch,
    payload_of,
    placeholder_map_class,
    slots,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.eagle import EagleFutureMap, EaglePayload
from relay.maps.eagle_confidence import EagleConfidenceFutureMap

# The ordering checks need the clocks, which an engine installs (a debug map does not).
pytestmark = pytest.mark.usefixtures("clocks_on")

_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def pool_and_slots(draw: st.DrawFn, max_pool: int = 64) -> tuple[int, list[int]]:
    """A pool size and a non-empty set of distinct real slots (>= 1) in random order."""
    pool = draw(st.integers(min_value=2, max_value=max_pool))
    chosen = draw(
        st.lists(st.integers(1, pool - 1), min_size=1, max_size=pool - 1, unique=True)
    )
    return pool, chosen


_TOKENS = st.integers(min_value=0, max_value=2**40)
_PLACEHOLDER_MAP: Any = placeholder_map_class()
_FLOATS = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@_SETTINGS
@given(
    data=st.data(), shape=pool_and_slots(), topk=st.integers(1, 4), debug=st.booleans()
)
def test_stash_then_resolve_returns_each_slots_values(
    data: st.DataObject, shape: tuple[int, list[int]], topk: int, debug: bool
) -> None:
    """Stashed tokens, top-k and hidden rows come back for exactly the slot they were stashed in."""
    pool, chosen = shape
    n = len(chosen)
    tokens = data.draw(st.lists(_TOKENS, min_size=n, max_size=n))
    topk_p = data.draw(st.lists(_FLOATS, min_size=n * topk, max_size=n * topk))
    topk_index = data.draw(st.lists(_TOKENS, min_size=n * topk, max_size=n * topk))
    relay = EagleFutureMap("cpu", pool, topk=topk, debug=debug)
    payload = EaglePayload(
        bonus_tokens=torch.tensor(tokens),
        topk_p=torch.tensor(topk_p, dtype=torch.float32).reshape(n, topk),
        topk_index=torch.tensor(topk_index).reshape(n, topk),
        hidden_states=torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
    )
    relay.stash(slots(*chosen), payload)

    order = data.draw(st.permutations(range(n)))
    b = batch(*[chosen[i] for i in order])
    relay.resolve_future(b)
    assert b.spec_info.bonus_tokens.tolist() == [tokens[i] for i in order]
    assert torch.equal(b.spec_info.topk_p, payload.topk_p[list(order)])
    assert torch.equal(b.spec_info.topk_index, payload.topk_index[list(order)])
    assert b.spec_info.hidden_states is not None
    assert torch.equal(b.spec_info.hidden_states, payload.hidden_states[list(order)])  # type: ignore[index]


@_SETTINGS
@given(data=st.data(), shape=pool_and_slots())
def test_mixed_placeholders_and_real_tokens_resolve_position_by_position(
    data: st.DataObject, shape: tuple[int, list[int]]
) -> None:
    """In any mix, each placeholder -slot takes that slot's token and each real token stays."""
    pool, chosen = shape
    n = len(chosen)
    stashed = data.draw(st.lists(_TOKENS, min_size=n, max_size=n))
    relay = _PLACEHOLDER_MAP("cpu", pool)
    relay.stash(
        slots(*chosen), payload_of(_PLACEHOLDER_MAP, tokens=torch.tensor(stashed))
    )
    by_slot = dict(zip(chosen, stashed))

    placeholder = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    real = data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))  # 0 included
    b = batch(*chosen)
    b.input_ids = torch.tensor(
        [-s if p else r for s, p, r in zip(chosen, placeholder, real)]
    )
    relay.resolve_future(b)
    expected = [by_slot[s] if p else r for s, p, r in zip(chosen, placeholder, real)]
    assert b.input_ids.tolist() == expected


@_SETTINGS
@given(data=st.data(), shape=pool_and_slots(), debug=st.booleans())
def test_publish_then_resolve_mirrors_the_device_values_and_sum(
    data: st.DataObject, shape: tuple[int, list[int]], debug: bool
) -> None:
    """The host mirror equals the gathered device lengths and the sum is their int total."""
    pool, chosen = shape
    n = len(chosen)
    lengths = data.draw(st.lists(st.integers(1, 2**31), min_size=n, max_size=n))
    relay = EagleFutureMap("cpu", pool, topk=1, debug=debug)
    relay.publish(slots(*chosen), torch.tensor(lengths))

    asked = data.draw(
        st.lists(st.sampled_from(chosen), min_size=1, max_size=n, unique=True)
    )
    b = batch(*asked)
    relay.resolve_seq_lens_cpu(b)
    by_slot = dict(zip(chosen, lengths))
    assert b.seq_lens.tolist() == [by_slot[s] for s in asked]
    assert torch.equal(b.seq_lens_cpu, b.seq_lens)
    assert b.seq_lens_sum == sum(by_slot[s] for s in asked)


@_SETTINGS
@given(data=st.data(), shape=pool_and_slots(max_pool=16), draft=st.integers(1, 5))
def test_publish_then_resolve_confidence_rows(
    data: st.DataObject, shape: tuple[int, list[int]], draft: int
) -> None:
    """Published confidences come back as float32 rows for the slots asked, on device and host."""
    pool, chosen = shape
    n = len(chosen)
    values = data.draw(st.lists(_FLOATS, min_size=n * draft, max_size=n * draft))
    confidence = torch.tensor(values, dtype=torch.float64).reshape(n, draft)
    relay = EagleConfidenceFutureMap("cpu", pool, topk=1, draft_tokens=draft)
    relay.publish(slots(*chosen), torch.ones(n, dtype=torch.int64), confidence)
    order = data.draw(st.permutations(range(n)))
    b = batch(*[chosen[i] for i in order])
    relay.resolve_draft_confidence_cpu(b)  # type: ignore[arg-type]
    expected = confidence.to(torch.float32)[list(order)]
    assert torch.equal(b.spec_info.draft_confidence, expected)
    assert torch.equal(b.draft_confidence_cpu, expected)


@_SETTINGS
@given(data=st.data(), shape=pool_and_slots(max_pool=16), steps=st.integers(1, 4))
def test_repeated_stashes_resolve_the_newest_value_once_in_debug(
    data: st.DataObject, shape: tuple[int, list[int]], steps: int
) -> None:
    """Over several steps each resolve sees the newest stash of each slot, consumed exactly once."""
    pool, chosen = shape
    relay = DecodeFutureMap("cpu", pool, debug=True)
    newest: dict[int, int] = {}
    for _ in range(steps):
        written = data.draw(st.lists(st.sampled_from(chosen), min_size=1, unique=True))
        values = data.draw(
            st.lists(_TOKENS, min_size=len(written), max_size=len(written))
        )
        relay.stash(slots(*written), DecodePayload(next_token_ids=torch.tensor(values)))
        newest.update(zip(written, values))
        read = data.draw(
            st.lists(st.sampled_from(sorted(newest)), min_size=1, unique=True)
        )
        b = batch(*read)
        relay.resolve_future(b)
        assert b.input_ids.tolist() == [newest.pop(s) for s in read]
