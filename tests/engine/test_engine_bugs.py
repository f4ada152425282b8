"""Bugs that real engines shipped, planted back into a monkeypatched engine: each is
reported by name, by debug mode, by the step-by-step input comparison of the two loops
or by the engine's token accounting; in the interleaving the OS picks, and in each of
20 seeded schedules of the forward worker and the scheduler (Note [Seeded schedules]
in relay/cpu_stream.py), where the engine as shipped reports nothing."""

from __future__ import annotations

import functools
from typing import Any

import attrs
import pytest
from schedule_support import SEEDS, replaying, seed_id

from relay.debug import DebugCheckFailed
from relay.engine import (
    EngineConfig,
    ModelConfig,
    RunResult,
    SchedulerConfig,
    WorkloadConfig,
    run_workload,
)
from relay.engine import engine as engine_module
from relay.engine.batch import ForwardBatch, Request, Seeds
from relay.engine.compare import first_input_difference, first_output_difference
from relay.engine.relays import MapRelay
from relay.engine.scheduler import Scheduler, TokenAccountingError

TINY = ModelConfig(
    vocab_size=1024, hidden=32, layers=1, heads=2, ffn=64, max_context=96
)
WORKLOAD = WorkloadConfig(
    requests=32, min_prompt=4, max_prompt=40, min_output=2, max_output=24
)
BASE = EngineConfig(
    model=TINY,
    workload=WORKLOAD,
    scheduler=SchedulerConfig(
        max_running=4, max_prefill_tokens=24, kv_pages=10, page_size=8
    ),
    debug=True,
)


def _seed_at_once(
    reqs: list[Request],
    scheduler: Scheduler,
    relay: Any,
    runner: Any,
    executor: Any,
    *,
    only: set[int] | None = None,
) -> None:
    """``seed_prebuilt`` without the wait, as engines wrote it before relay's
    ``seed``: the prompt's KV still arrives on the forward stream, but the relay row
    is written from the scheduler thread at once with a plain stash, while a forward
    may still be in flight on it (for the slots in ``only``; the others are seeded
    correctly). Plain decoding: the seed is the first token."""
    if only is not None and not {r.slot for r in reqs} <= only:
        engine_module_seed(reqs, scheduler, relay, runner, executor)
        return
    captured: list[Seeds] = []

    class TransferOnly:
        def launch(self, fn: Any) -> Any:
            seeds = fn.args[0]
            captured.append(seeds)
            return executor.launch(functools.partial(_transfer, runner, seeds))

    engine_module_seed(reqs, scheduler, relay, runner, TransferOnly())
    (seeds,) = captured
    relay.stash(seeds.slots, seeds.first_tokens, None)  # not the map's seed
    relay.publish(seeds.slots, seeds.prompt_lens + 1)


def _transfer(runner: Any, seeds: Seeds) -> None:
    """The forward-stream half of a seed: releases, then the prompt's KV."""
    runner.relay.release(seeds.released)
    runner.forwards.prefill(seeds.prompts, seeds.prompt_lens, seeds.slots)


engine_module_seed = engine_module.seed_prebuilt

#: What debug mode says of a seed not ordered behind the forward stream: the slot's
#: previous owner's in-flight stash and the seed are unordered writes; or the seed
#: was written before the slot's release (issued on the forward stream) and is read
#: as the previous request's value; or the forward stream reads the seed, written on
#: the scheduler's thread, with no wait between them. Which comes first depends on
#: how far the forward stream had got when the scheduler wrote the seed.
SEED_UNORDERED = (
    ("nothing orders the two writes",),
    ("the value belongs to the slot's previous request",),
    ("wrote on host thread", "nothing orders the read after that write"),
)


def _reports_unordered_seed(report: str) -> bool:
    return any(all(words in report for words in kind) for kind in SEED_UNORDERED)


def _debug_report(config: EngineConfig) -> str:
    """Run ``config``; the message of the debug check it fails, wherever it ran (a
    check on the forward worker reaches the host as the cause of its error)."""
    try:
        run_workload(config)
    except Exception as error:  # the chain is inspected below
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, DebugCheckFailed):
            cause = cause.__cause__
        if cause is None:
            raise
        return str(cause)
    raise AssertionError("the run passed: the planted bug went unreported")


@functools.cache
def _synchronous_run() -> RunResult:
    """The synchronous loop's run of ``BASE``, with its inputs (no thread to schedule)."""
    return run_workload(attrs.evolve(BASE, record_inputs=True, overlap=False))


#: Each planted bug runs free, and in every seeded schedule.
SCHEDULES = pytest.mark.parametrize("seed", [None, *SEEDS], ids=seed_id)


@SCHEDULES
def test_seeding_without_the_wait_is_reported(
    monkeypatch: pytest.MonkeyPatch, seed: int | None
) -> None:
    """sglang's prebuilt-request race: a seed written while the slot's previous owner's
    extra forward is in flight is an unordered write in debug mode."""
    monkeypatch.setattr(engine_module, "seed_prebuilt", _seed_at_once)
    config = attrs.evolve(
        BASE,
        workload=attrs.evolve(WORKLOAD, prebuilt_share=0.6),
        scheduler=attrs.evolve(BASE.scheduler, retract=False, kv_pages=96),
    )
    with replaying(seed):
        report = _debug_report(config)
        assert _reports_unordered_seed(report), report
    print(report)


@SCHEDULES
def test_a_retracted_requests_stash_in_its_reused_slot_is_reported(
    monkeypatch: pytest.MonkeyPatch, seed: int | None
) -> None:
    """An engine that seeds a slot freed by a retraction at once, as if a retracted
    request had no forward in flight: that forward's stash lands on the seed, an
    unordered write in debug mode."""
    retracted: set[int] = set()  # slots freed by a retraction in this build
    retract, next_batch = Scheduler._retract, Scheduler.next_batch

    def remembering(self: Scheduler, req: Request) -> None:
        retracted.add(req.slot)
        retract(self, req)

    def building(self: Scheduler) -> ForwardBatch | None:
        retracted.clear()
        return next_batch(self)

    monkeypatch.setattr(Scheduler, "_retract", remembering)
    monkeypatch.setattr(Scheduler, "next_batch", building)
    monkeypatch.setattr(
        engine_module,
        "seed_prebuilt",
        functools.partial(_seed_at_once, only=retracted),
    )
    config = attrs.evolve(
        BASE,
        workload=attrs.evolve(WORKLOAD, requests=64, prebuilt_share=0.5),
        scheduler=attrs.evolve(BASE.scheduler, kv_pages=12),
    )
    with replaying(seed):
        report = _debug_report(config)
        assert _reports_unordered_seed(report), report
    print(report)


@SCHEDULES
def test_a_token_processed_twice_after_a_retraction_is_reported(
    monkeypatch: pytest.MonkeyPatch, seed: int | None
) -> None:
    """A retracted request's row of the step in flight processed anyway: its tokens
    come out of that step and again from the re-prefill. The token accounting names
    it; against a run without retraction, the token comparison does too."""
    monkeypatch.setattr(Scheduler, "_current", lambda self, req, epoch: True)
    with replaying(seed):
        with pytest.raises(TokenAccountingError, match="processed twice"):
            run_workload(attrs.evolve(BASE, overlap=True))
    # With the accounting check silenced, the outputs show the duplicate.
    monkeypatch.setattr(
        Scheduler, "_check_accounting", lambda self, req, seq_len, count: None
    )
    with replaying(seed):
        retracting = run_workload(attrs.evolve(BASE, debug=False))
        assert retracting.retractions > 0
        roomy = attrs.evolve(BASE.scheduler, retract=False, kv_pages=96)
        reference = run_workload(attrs.evolve(BASE, debug=False, scheduler=roomy))
        problem = first_output_difference(reference.outputs, retracting.outputs)
        assert problem is not None and "token comparison: request" in problem
    print(problem)


@SCHEDULES
def test_inputs_applied_to_reordered_rows_are_reported(
    monkeypatch: pytest.MonkeyPatch, seed: int | None
) -> None:
    """vLLM's stale placeholders after a reorder: the overlap relay resolves the rows
    as the scheduler first built them and hands the values over by position after the
    rows changed (a capped request dropped). The step-by-step input comparison names
    the step and the request; the token comparison the request."""
    built: dict[int, Any] = {}  # id(batch) -> its slots before cap_lengths
    cap, resolve = Scheduler.cap_lengths, MapRelay.resolve_future

    def capping(self: Scheduler, batch: ForwardBatch) -> bool:
        built[id(batch)] = batch.req_pool_indices
        return cap(self, batch)

    def by_position(self: MapRelay, batch: ForwardBatch) -> None:
        slots = built.pop(id(batch), batch.req_pool_indices)
        stale = attrs.evolve(batch, req_pool_indices=slots)
        resolve(self, stale)
        batch.input_ids = stale.input_ids[: len(batch)]

    monkeypatch.setattr(Scheduler, "cap_lengths", capping)
    monkeypatch.setattr(MapRelay, "resolve_future", by_position)
    config = attrs.evolve(BASE, debug=False, record_inputs=True)
    with replaying(seed):
        sync = run_workload(attrs.evolve(config, overlap=False))
        overlap = run_workload(attrs.evolve(config, overlap=True))
        steps = first_input_difference(sync, overlap)
        assert steps is not None and steps.startswith("step inputs: step"), steps
        tokens = first_output_difference(sync.outputs, overlap.outputs)
        assert tokens is not None and "token comparison: request" in tokens
    print(steps, tokens, sep="\n")


def test_the_engine_as_shipped_reports_nothing() -> None:
    """The unpatched engine on the same workload: the loops agree step by step, and
    retraction changes no request's tokens."""
    config = attrs.evolve(BASE, record_inputs=True)
    sync = run_workload(attrs.evolve(config, overlap=False))
    overlap = run_workload(attrs.evolve(config, overlap=True))
    assert sync.retractions > 0
    assert first_input_difference(sync, overlap) is None
    assert first_output_difference(sync.outputs, overlap.outputs) is None
    roomy = attrs.evolve(BASE.scheduler, retract=False, kv_pages=96)
    reference = run_workload(attrs.evolve(BASE, scheduler=roomy))
    assert first_output_difference(reference.outputs, sync.outputs) is None
    # The workloads of the seeding bugs, seeded behind the forward stream: no report.
    prebuilt = attrs.evolve(WORKLOAD, requests=64, prebuilt_share=0.5)
    for scheduling in (roomy, attrs.evolve(BASE.scheduler, kv_pages=12)):
        seeded = run_workload(
            attrs.evolve(BASE, workload=prebuilt, scheduler=scheduling)
        )
        assert seeded.prebuilt > 0


@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_the_engine_as_shipped_reports_nothing_in_seeded_schedules(seed: int) -> None:
    """The planted bugs' workloads, unpatched, in each seeded schedule: no report, and
    the overlap loop hands the model exactly the synchronous loop's inputs."""
    with replaying(seed):
        overlap = run_workload(attrs.evolve(BASE, record_inputs=True, overlap=True))
        assert first_input_difference(_synchronous_run(), overlap) is None
        # The two seeding bugs' workloads, seeded behind the forward stream.
        for share, requests, scheduling in (
            (0.6, 32, attrs.evolve(BASE.scheduler, retract=False, kv_pages=96)),
            (0.5, 64, attrs.evolve(BASE.scheduler, kv_pages=12)),
        ):
            workload = attrs.evolve(WORKLOAD, requests=requests, prebuilt_share=share)
            seeded = run_workload(
                attrs.evolve(BASE, workload=workload, scheduler=scheduling)
            )
            assert seeded.prebuilt > 0


def test_a_seed_replays_the_engine_run_that_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seed a failing test prints reproduces its run: the same picks, the same
    report, each time."""
    monkeypatch.setattr(engine_module, "seed_prebuilt", _seed_at_once)
    config = attrs.evolve(
        BASE,
        workload=attrs.evolve(WORKLOAD, prebuilt_share=0.6),
        scheduler=attrs.evolve(BASE.scheduler, retract=False, kv_pages=96),
    )
    runs = []
    for _ in range(2):
        with replaying(5) as schedule:
            assert schedule is not None
            runs.append((_debug_report(config), list(schedule.trace)))
    assert runs[0] == runs[1]
    assert runs[0][1], "the schedule made no choice"
