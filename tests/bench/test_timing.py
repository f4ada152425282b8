"""How ``relay bench`` interleaves the sides it times (Note [Balanced order])."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from relay.bench.timing import balanced_orders, time_interleaved, timer_for


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_every_side_follows_every_other_side_equally_often(count: int) -> None:
    """Over a full cycle of the design (``count`` repeats, ``2 * count`` if odd) each
    order is a permutation, every side comes right after each other side equally
    often and is first equally often: no side always follows the same one, as it did
    in a rotated order."""
    cycle = count if count % 2 == 0 else 2 * count
    orders = [list(o) for o in balanced_orders(count, cycle)]
    assert all(sorted(o) == list(range(count)) for o in orders)
    after = Counter((o[i - 1], o[i]) for o in orders for i in range(1, count))
    pairs = {(a, b) for a in range(count) for b in range(count) if a != b}
    assert set(after) == pairs and len(set(after.values())) == 1
    assert Counter(o[0] for o in orders) == Counter(
        {i: cycle // count for i in range(count)}
    )


def test_each_side_is_sampled_once_per_repeat() -> None:
    """time_interleaved takes one sample of every side per repeat, in the balanced
    orders."""
    ran: list[str] = []
    fns = [lambda name=name: ran.append(name) for name in "abcd"]
    timer = timer_for(torch.device("cpu"))
    samples = time_interleaved(fns, timer, repeat=6, warmup=0, target_ns=1)
    assert [len(s) for s in samples] == [6] * 4
    runs = ran[5:]  # the five calibration probes of the first side come first
    orders = [list(o) for o in balanced_orders(4, 6)]
    assert runs == ["abcd"[i] for o in orders for i in o]
