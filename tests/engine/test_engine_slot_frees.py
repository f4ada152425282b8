"""Slots freed in stream order, in the reference engine: its scheduler's free list
replaced by a ``SlotTable`` told of each launched and processed step, and prebuilt
requests seeded by a plain write from the scheduler's thread, ordered behind nothing on
the forward stream. A slot comes back only once the step in flight for its previous
request is processed, which the scheduler waited for: the write is ordered, and every
seeded schedule is clean. Planted back, the early free (the table never told of the
steps, so a finished request's slot is free at once) lets the write race the previous
request's step in flight, and debug mode reports it in every seeded schedule."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import attrs
import pytest
from schedule_support import SEEDS, replaying, seed_id
from test_engine_bugs import BASE, WORKLOAD, _debug_report, _reports_unordered_seed
from test_engine_bugs import _seed_at_once as seed_at_once

from relay.engine import engine as engine_module
from relay.engine import run_workload
from relay.engine.batch import ForwardBatch, StepOutput
from relay.engine.relays import MapRelay
from relay.engine.scheduler import Scheduler
from relay.slots import SlotTable

CONFIG = attrs.evolve(
    BASE,
    workload=attrs.evolve(WORKLOAD, requests=64, prebuilt_share=0.6),
    scheduler=attrs.evolve(BASE.scheduler, retract=False, kv_pages=96),
)


class TableSlots:
    """The scheduler's free list (``pop``, ``append``, truth) kept by a ``SlotTable``:
    each slot handed out is taken by a key of its own, and finished by it."""

    def __init__(self, max_running: int, steps: bool) -> None:
        self.table = SlotTable(max_running + 1)
        self.steps = steps  # whether the table hears of launched and processed steps
        self._keys = 0
        self._key_of: dict[int, Hashable] = {}
        self._step_of: dict[int, int] = {}  # the engine's step -> the table's

    def __bool__(self) -> bool:
        return self.table.free > 0

    def pop(self) -> int:
        self._keys += 1
        slot = self.table.take(self._keys)
        self._key_of[slot] = self._keys
        return slot

    def append(self, slot: int) -> None:
        self.table.finish([self._key_of.pop(slot)])

    def launched(self, batch: ForwardBatch) -> None:
        if self.steps:
            parts = [p for p in (batch, batch.chunk) if p is not None]
            keys = [self._key_of[r.slot] for p in parts for r in p.reqs if r.slot]
            self._step_of[batch.step] = self.table.launched(keys)

    def processed(self, batch: ForwardBatch) -> None:
        step = self._step_of.pop(batch.step, 0)
        if self.steps and step:
            self.table.processed(step)


def _run_with_table(monkeypatch: pytest.MonkeyPatch, steps: bool) -> Any:
    """Patch the engine: the table as the free list, the steps told to it, and the
    prebuilt requests seeded at once from the scheduler's thread."""
    tables: list[TableSlots] = []
    init, process, scheduled = Scheduler.__init__, Scheduler.process, MapRelay.scheduled

    def with_table(self: Scheduler, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._free_slots = TableSlots(self.config.max_running, steps)  # type: ignore[assignment]
        tables.append(self._free_slots)  # type: ignore[arg-type]

    def processing(self: Scheduler, batch: ForwardBatch, out: StepOutput) -> None:
        process(self, batch, out)
        tables[-1].processed(batch)

    def launching(self: MapRelay, batch: ForwardBatch) -> None:
        tables[-1].launched(batch)
        scheduled(self, batch)

    monkeypatch.setattr(Scheduler, "__init__", with_table)
    monkeypatch.setattr(Scheduler, "process", processing)
    monkeypatch.setattr(MapRelay, "scheduled", launching)
    monkeypatch.setattr(engine_module, "seed_prebuilt", seed_at_once)
    return tables


@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_slots_freed_after_their_step_make_a_scheduler_write_safe(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """No report: every reused slot came back after the step that wrote it last."""
    tables = _run_with_table(monkeypatch, steps=True)
    with replaying(seed):
        result = run_workload(CONFIG)
    assert result.prebuilt > 0
    assert tables[-1].table.held_back == 0


@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_a_slot_freed_at_once_is_reported(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """The planted early free: the scheduler's write lands while the previous
    request's step may still stash there, named as unordered."""
    _run_with_table(monkeypatch, steps=False)
    with replaying(seed):
        report = _debug_report(CONFIG)
    assert _reports_unordered_seed(report), report
