"""Mixed batches of n-gram speculation bind their decode rows' lengths in the forward
(Note [Late-bound tails] in relay/engine/runner.py), and overlap still yields sync's
tokens, with the map in debug mode (a stale tail would be reported)."""

from __future__ import annotations

import attrs
import pytest
from test_matrix import Cell, _check

from relay.engine import run_workload
from relay.engine.relays import MapRelay
from relay.engine.scheduler import Scheduler


@pytest.mark.parametrize("debug", [False, True], ids=["fast", "debug"])
def test_mixed_ngram_batches_bind_their_tails_late(
    debug: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mixed batches launch before their lengths are known and the map binds them, the
    same batches in both loops (a row that may reach its limit resolves first)."""
    late: list[bool] = []
    bound = Scheduler.bound_tails
    monkeypatch.setattr(
        Scheduler, "bound_tails", lambda s, b: late.append(bound(s, b)) or late[-1]
    )
    tails: list[int] = []
    resolve = MapRelay.resolve_tails
    monkeypatch.setattr(
        MapRelay, "resolve_tails", lambda r, b: tails.append(len(b)) or resolve(r, b)
    )
    cell = Cell("ngram", frozenset({"mixed", "chunked", "retract"}), 1, debug)
    config = cell.config()
    sync = run_workload(attrs.evolve(config, overlap=False))
    overlap = run_workload(attrs.evolve(config, overlap=True))
    assert _check(cell, sync, overlap) is None
    assert tails and sum(late) == 2 * len(tails)  # each loop late-binds alike
