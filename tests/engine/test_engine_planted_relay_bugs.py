"""Slots freed before the steps that write them, planted into the reference engine one
way of ending a request at a time: a finish, an abort, a preemption (a retraction).
The engine's free list is a ``SlotTable`` told of every launched and processed step,
and prebuilt requests are seeded by a plain write from the scheduler's thread, ordered
behind nothing on the forward stream; so only a slot that comes back while a step that
may write it is still in flight lets that write race the step. Planted, the one kind of
end frees its slot at once (as ``SlotTable.finish`` did before frees waited for the
steps), the others stay deferred, and debug mode names the race in every seeded
schedule; unplanted, every seeded schedule is clean.

Where the other silent relay bugs stand in the reference engine:

- A seed landing in the previous owner's forward (the seed applied by whichever forward
  resolves next, one launched before the seed included) is planted in
  ``test_engine_seed_order.py``; a finish freed at once for every kind of end in
  ``test_engine_slot_frees.py``, and the engine's own release issued on the scheduler's
  thread in ``test_engine_seed_order.py``.
- An attribute in two roles is refused when a map is generated, so no engine run
  reaches it: planted into the engine's own n-gram schema (the slots, the requests, the
  tail rows or the KV table given as KV locations or draft counts) in
  ``test_engine_planted_roles.py``.
- Counts outside the row, and spans running into another request's or onto the next
  row: planted into the n-gram mode's packed hand-over of its accepted drafts (a
  counted scatter) in ``test_engine_planted_counts.py``.
- Adopted buffers sharing storage, or requiring grad: planted into the static-buffer
  steps' adopted buffers in ``test_engine_planted_adoption.py``.
- Tails reading column -1, or past the row: planted into the n-gram mixed batches'
  late-bound tails, which read their KV locations from the engine's request-to-token
  table, in ``test_engine_planted_tails.py``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from schedule_support import SEEDS, replaying, seed_id
from test_engine_bugs import BASE, WORKLOAD, _debug_report, _reports_unordered_seed
from test_engine_bugs import _seed_at_once as seed_at_once
from test_engine_slot_frees import TableSlots

from relay.engine import EngineConfig, run_workload
from relay.engine import engine as engine_module
from relay.engine.batch import ForwardBatch, Request, StepOutput
from relay.engine.relays import MapRelay
from relay.engine.scheduler import Scheduler

#: Each way of ending a request, in a workload where it is frequent and the slot it
#: frees is soon taken by a prebuilt request.
ENDS: dict[str, EngineConfig] = {
    "finish": attrs.evolve(
        BASE,
        workload=attrs.evolve(WORKLOAD, requests=64, prebuilt_share=0.6),
        scheduler=attrs.evolve(BASE.scheduler, retract=False, kv_pages=96),
    ),
    "abort": attrs.evolve(
        BASE,
        workload=attrs.evolve(
            WORKLOAD, requests=64, prebuilt_share=0.6, abort_share=0.5
        ),
        scheduler=attrs.evolve(BASE.scheduler, retract=False, kv_pages=96),
    ),
    "preempt": attrs.evolve(
        BASE,
        workload=attrs.evolve(WORKLOAD, requests=64, prebuilt_share=0.6),
        scheduler=attrs.evolve(BASE.scheduler, retract=True, kv_pages=12),
    ),
}


class EndingTable(TableSlots):
    """The table as the scheduler's free list, told of every step; each slot handed back
    is finished by its request's key, deferred behind the steps that may write it,
    except (the plant) for requests ended the ``early`` way, whose slot comes back at
    once. ``ending`` says how the request being freed ended."""

    def __init__(self, max_running: int, early: str | None) -> None:
        super().__init__(max_running, steps=True)
        self.early = early
        self.ending = "finish"
        self.ended: dict[str, int] = dict.fromkeys(ENDS, 0)
        #: The scheduler (its slots freed and not yet released on the forward
        #: stream), and the engine's relay.
        self.scheduler: Any = None
        self.relays: list[Any] = []

    def pop(self) -> int:
        """A slot, released on the relay first where the engine has not released it
        yet: a slot freed with no step in flight (a request retracted while the next
        step is built) is taken again in the same pass, and the plain write that seeds
        it must come after its release."""
        slot = super().pop()
        pending = self.scheduler._released
        if slot in pending:
            pending.remove(slot)
            self.relays[-1].release(torch.tensor([slot]))
        return slot

    def append(self, slot: int) -> None:
        key = self._key_of.pop(slot)
        self.ended[self.ending] += 1
        if self.ending == self.early:  # the plant: no step it was launched in counts
            self.table._last_step.pop(key, None)
        self.table.finish([key])


def _run_ending(
    monkeypatch: pytest.MonkeyPatch, early: str | None
) -> list[EndingTable]:
    """Patch the engine: the table as the free list, told of each step and of how each
    request ended; prebuilt requests seeded at once from the scheduler's thread."""
    tables: list[EndingTable] = []
    init, process, scheduled = Scheduler.__init__, Scheduler.process, MapRelay.scheduled
    finish, retract = Scheduler._finish, Scheduler._retract

    relays: list[Any] = []
    shipped_relay = engine_module.map_relay

    def keeping(*args: Any, **kwargs: Any) -> Any:
        relays.append(shipped_relay(*args, **kwargs))
        return relays[-1]

    def with_table(self: Scheduler, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        tables.append(EndingTable(self.config.max_running, early))
        tables[-1].scheduler = self
        tables[-1].relays = relays
        self._free_slots = tables[-1]  # type: ignore[assignment]

    def processing(self: Scheduler, batch: ForwardBatch, out: StepOutput) -> None:
        process(self, batch, out)
        tables[-1].processed(batch)

    def launching(self: MapRelay, batch: ForwardBatch) -> None:
        tables[-1].launched(batch)
        scheduled(self, batch)

    def finishing(self: Scheduler, req: Request, reason: str) -> None:
        tables[-1].ending = "abort" if reason == "abort" else "finish"
        finish(self, req, reason)

    def retracting(self: Scheduler, req: Request) -> None:
        tables[-1].ending = "preempt"
        retract(self, req)

    monkeypatch.setattr(Scheduler, "__init__", with_table)
    monkeypatch.setattr(Scheduler, "process", processing)
    monkeypatch.setattr(Scheduler, "_finish", finishing)
    monkeypatch.setattr(Scheduler, "_retract", retracting)
    monkeypatch.setattr(MapRelay, "scheduled", launching)
    monkeypatch.setattr(engine_module, "seed_prebuilt", seed_at_once)
    monkeypatch.setattr(engine_module, "map_relay", keeping)
    return tables


KINDS = pytest.mark.parametrize("end", sorted(ENDS))


@KINDS
@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_every_end_deferred_runs_clean(
    monkeypatch: pytest.MonkeyPatch, end: str, seed: int
) -> None:
    """No report: every slot, however its request ended, came back after the step that
    wrote it last; the workload ended requests that way, and reused their slots."""
    tables = _run_ending(monkeypatch, None)
    with replaying(seed):
        result = run_workload(ENDS[end])
    assert result.prebuilt > 0
    assert tables[-1].ended[end] > 0
    assert tables[-1].table.held_back == 0


@KINDS
@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_one_end_freed_at_once_is_reported(
    monkeypatch: pytest.MonkeyPatch, end: str, seed: int
) -> None:
    """The plant: requests ended this one way get their slot back at once; a prebuilt
    request seeded into it races the step still in flight for the slot's previous
    owner, named as unordered by debug mode."""
    _run_ending(monkeypatch, end)
    with replaying(seed):
        report = _debug_report(ENDS[end])
    assert _reports_unordered_seed(report), report
