"""Tails that point outside their row, planted into the reference engine. A mixed batch
of n-gram speculation binds its decode rows' lengths and KV write locations late, from
the lengths the step before it published (Note [Late-bound tails] in
relay/engine/runner.py): a row's location is ``req_to_token[slot, length - 1]``, where
its forward writes the new token's keys and values (Note [The request-to-token table]
in relay/engine/model.py). Planted, the step before each late-bound batch publishes,
for the rows that batch binds, a length of 0 (column -1: the row's last column, in
Python's indexing) or one past the row's width; relay refuses the batch's
``resolve_tails`` before the batch changes, naming the map, the field, the table, the
slot and its request, in every seeded schedule, debug mode on and off. Unplanted, every seeded
schedule runs clean and the batches bind their tails."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
from schedule_support import SEEDS, replaying, seed_id
from test_matrix import Cell

from relay import RelayError
from relay.engine import EngineConfig, run_workload
from relay.engine.batch import ForwardBatch
from relay.engine.compare import first_output_difference
from relay.engine.relays import MapRelay
from relay.engine.runner import ModelRunner
from relay.engine.scheduler import Scheduler


def _config(debug: bool) -> EngineConfig:
    """n-gram speculation with mixed batches, chunked prefill and retraction."""
    return Cell("ngram", frozenset({"mixed", "chunked", "retract"}), 1, debug).config()


WIDTH = _config(False).model.max_context

#: A length for each plant, from the correct one: the column it makes the location
#: read (``length - 1``, with the schema's ``Tails(add=0)``) is outside the row.
PLANTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "column -1": torch.zeros_like,
    "past the row": lambda lens: lens + WIDTH,
}


@functools.cache
def _late_batches() -> dict[int, dict[int, int]]:
    """The steps whose mixed batch binds its tails late, and the slots it binds, each
    with its request's id: from
    the synchronous loop, which builds the very batches the overlap loop builds (Note
    [One schedule for both modes] in relay/engine/scheduler.py), in every schedule."""
    late: dict[int, dict[int, int]] = {}
    shipped = Scheduler.bound_tails

    def recording(self: Scheduler, batch: ForwardBatch) -> bool:
        bound = shipped(self, batch)
        if bound:  # every row of the batch a tail
            slots = batch.mix_running_indices.tolist()
            late[batch.step] = dict(zip(slots, batch.rids, strict=True))
        return bound

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Scheduler, "bound_tails", recording)
        run_workload(attrs.evolve(_config(False), overlap=False))
    assert late, "the workload builds no late-bound mixed batch"
    return late


@attrs.define
class _Binds:
    """What the map's ``resolve_tails`` did: batches bound, and the refused ones'
    fields before and after the refusal."""

    bound: int = 0
    refused: list[tuple[list[Any], list[Any]]] = attrs.field(factory=list)


def _watch_tails(monkeypatch: pytest.MonkeyPatch) -> _Binds:
    """Count the overlap relay's late bindings, and keep each refused batch's fields."""
    binds = _Binds()
    shipped = MapRelay.resolve_tails
    names = ("seq_lens", "seq_lens_cpu", "seq_lens_sum", "out_cache_loc")

    def watching(self: MapRelay, batch: ForwardBatch) -> None:
        fields: list[Any] = []
        original = self._tails
        assert original is not None

        class Keeping:
            def resolve_tails(self, batch: ForwardBatch) -> None:
                fields.extend(getattr(batch, name) for name in names)
                try:
                    original.resolve_tails(batch)
                except RelayError:
                    after = [getattr(batch, name) for name in names]
                    binds.refused.append((fields, after))
                    raise

        self._tails = Keeping()
        try:
            shipped(self, batch)
        finally:
            self._tails = original
        binds.bound += 1

    monkeypatch.setattr(MapRelay, "resolve_tails", watching)
    return binds


def _plant(monkeypatch: pytest.MonkeyPatch, plant: str) -> None:
    """The step before each late-bound batch publishes ``PLANTS[plant]`` of the
    lengths of the rows that batch binds (its own results stay correct)."""
    late, wrong = _late_batches(), PLANTS[plant]
    shipped = ModelRunner._publish

    def publishing(
        self: ModelRunner, batch: ForwardBatch, slots: torch.Tensor, lens: Any
    ) -> None:
        tails = late.get(batch.step + 1)
        if tails is not None and lens is not None:
            hit = torch.isin(slots, torch.tensor(list(tails), device=slots.device))
            lens = torch.where(hit, wrong(lens), lens)
        shipped(self, batch, slots, lens)

    monkeypatch.setattr(ModelRunner, "_publish", publishing)


def _refusal(config: EngineConfig) -> BaseException:
    """Run ``config``; the error it stopped with, wherever it was raised (an error on
    the forward worker reaches the host as the cause of the host's error)."""
    try:
        run_workload(config)
    except Exception as error:  # the chain is followed below
        cause: BaseException = error
        while cause.__cause__ is not None:
            cause = cause.__cause__
        return cause
    raise AssertionError("the run passed: the planted tails went unreported")


DEBUG = pytest.mark.parametrize("debug", [False, True], ids=["fast", "debug"])


@DEBUG
@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_late_tails_run_clean(
    monkeypatch: pytest.MonkeyPatch, debug: bool, seed: int
) -> None:
    """No report: every late-bound batch binds its lengths and KV locations from
    lengths within its rows."""
    binds = _watch_tails(monkeypatch)
    with replaying(seed):
        result = run_workload(_config(debug))
    assert len(result.outputs) == _config(debug).workload.requests
    assert binds.bound == len(_late_batches()) and not binds.refused


@pytest.mark.parametrize("plant", sorted(PLANTS))
@DEBUG
@pytest.mark.parametrize("seed", [None, *SEEDS], ids=seed_id)
def test_tails_outside_their_row_are_refused(
    monkeypatch: pytest.MonkeyPatch, plant: str, debug: bool, seed: int | None
) -> None:
    """Refused at the first late-bound batch, before it changes, naming the map, the
    field, the table, a slot that batch binds and its request, whatever the schedule.
    In debug mode a length of 0 is refused earlier, by the field's guard
    (``Guard.POSITIVE``) at the publish, before the buffer or any batch changes."""
    binds = _watch_tails(monkeypatch)
    _plant(monkeypatch, plant)
    with replaying(seed):
        error = _refusal(_config(debug))
    message = str(error)
    if debug and plant == "column -1":
        assert (
            message == "NgramFutureMap.new_seq_lens: guard failed, values must be > 0"
        )
        assert binds.bound == 0 and not binds.refused  # no batch bound a tail
        return
    assert isinstance(error, RelayError), repr(error)
    found = re.match(
        r"NgramFutureMap\.new_seq_lens: batch\.req_to_token: decode row \d+ \(slot "
        r"(\d+), request (\d+)\) would read column (-?\d+) of its (\d+) ",
        message,
    )
    assert found is not None, message
    slot, rid, column, width = map(int, found.groups())
    first = _late_batches()[min(_late_batches())]
    assert first.get(slot) == rid, message  # a row of the first late-bound batch
    assert width == WIDTH
    assert column == -1 if plant == "column -1" else column >= WIDTH, message
    assert "Nothing was written" in message
    assert binds.bound == 0  # the first late-bound batch was refused
    ((before, after),) = binds.refused
    assert all(b is a for b, a in zip(before, after, strict=True))


def test_a_wrong_location_changes_the_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward writes a late-bound row's KV where the map's ``resolve_tails`` says:
    bound one position early (inside the row, nothing refuses it), the overlap loop's
    outputs part from the synchronous loop's."""
    shipped = MapRelay.resolve_tails

    def one_early(self: MapRelay, batch: ForwardBatch) -> None:
        shipped(self, batch)
        batch.out_cache_loc = batch.out_cache_loc - 1

    monkeypatch.setattr(MapRelay, "resolve_tails", one_early)
    config = _config(False)
    sync = run_workload(attrs.evolve(config, overlap=False))
    overlap = run_workload(config)
    assert first_output_difference(sync.outputs, overlap.outputs) is not None
