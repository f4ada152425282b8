"""The reference engine seeding prebuilt requests from the scheduler's thread, as
docs/integrating.md allows: relay writes each seed in the first forward launched after
it, so the run is clean in every seeded schedule. Planted back, each silent bug is
reported in every seeded schedule: the seed written by the next resolve whatever forward
makes it (relay's queue before seeds were placed in host order), where the forward in
flight for the slot's previous request takes the seed; and a slot released early, on the
scheduler's thread, before the step still in flight for its previous request reads it."""

from __future__ import annotations

import functools
from typing import Any

import attrs
import pytest
import torch
from schedule_support import SEEDS, replaying, seed_id
from test_engine_bugs import BASE, WORKLOAD, _debug_report, _transfer

from relay import runtime
from relay.engine import engine as engine_module
from relay.engine import run_workload
from relay.engine.batch import Seeds
from relay.engine.scheduler import Scheduler

CONFIG = attrs.evolve(
    BASE,
    workload=attrs.evolve(WORKLOAD, requests=64, prebuilt_share=0.6),
    scheduler=attrs.evolve(BASE.scheduler, retract=False, kv_pages=96),
)


def _seed_from_the_scheduler(shipped: Any, *args: Any) -> None:
    """``seed_prebuilt`` (``shipped``) with the relay rows seeded on the scheduler's
    thread, at once, while the forward of the slots' previous requests may be launched
    and not started; the releases and the prompts' KV stay on the forward stream."""
    reqs, scheduler, relay, runner, executor = args
    captured: list[Seeds] = []

    class TransferOnly:
        def launch(self, fn: Any) -> None:
            captured.append(fn.args[0])

    shipped(reqs, scheduler, relay, runner, TransferOnly())
    (seeds,) = captured
    relay.seed(seeds.slots, seeds.first_tokens, (), seeds.prompt_lens + 1)
    executor.launch(functools.partial(_transfer, runner, seeds))


@pytest.fixture(autouse=True)
def from_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine seeds from the scheduler's thread in every test here."""
    shipped = engine_module.seed_prebuilt
    seeding = functools.partial(_seed_from_the_scheduler, shipped)
    monkeypatch.setattr(engine_module, "seed_prebuilt", seeding)


def _unplaced_apply_seeds(s: runtime.MapState) -> None:
    """Every queued seed written by the next resolve_future, whichever forward makes
    it: the planted bug."""
    while s.seeds:
        _, slots, values, owners, _counts = s.seeds.pop(0)
        runtime._apply(s, "seed", s.table.forward, slots, values, owners)


@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_seeds_from_the_scheduler_thread_are_clean(seed: int) -> None:
    """No report, and prebuilt requests admitted into reused slots."""
    with replaying(seed):
        result = run_workload(CONFIG)
    assert result.prebuilt > 0


@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_a_seed_taken_by_the_forward_launched_before_it_is_reported(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """The planted queue: the previous request's forward takes the seed and stashes
    over it; the new request then reads a released row."""
    monkeypatch.setattr(runtime, "apply_seeds", _unplaced_apply_seeds)
    with replaying(seed):
        report = _debug_report(CONFIG)
    assert "released" in report or "previous request" in report, report


@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_a_slot_released_at_once_is_reported(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """The early free: the scheduler releases a finished request's slot on its own
    thread when it frees it, not in stream order behind the step still in flight for
    that request (the engine's ``released`` on the next launch): that step's read of
    the row is named as a read of a released row."""
    relays: list[Any] = []
    shipped_relay = engine_module.map_relay

    def keeping(*args: Any, **kwargs: Any) -> Any:
        relay = shipped_relay(*args, **kwargs)
        relays.append(relay)
        return relay

    free = Scheduler._free

    def at_once(self: Scheduler, req: Any) -> None:
        slot = req.slot
        free(self, req)
        if slot and relays:
            relays[-1].release(torch.tensor([slot]))

    monkeypatch.setattr(engine_module, "map_relay", keeping)
    monkeypatch.setattr(Scheduler, "_free", at_once)
    with replaying(seed):
        report = _debug_report(CONFIG)
    assert "released" in report, report
