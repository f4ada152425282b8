"""Seeded schedules (Note [Seeded schedules] in relay/cpu_stream.py): a seed replays its
interleaving exactly, the seeds explore different ones, a wait hands the baton to the
side that can go on, and a real deadlock is reported with its seed instead of hanging."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from relay_runtime_support import GUARD_S, batch_of, slots, thread_streams
from schedule_support import SEEDS, replaying, seed_id

from relay.cpu_stream import (
    CpuEvent,
    Gate,
    ScheduleDeadlock,
    SeededSchedule,
    active_schedule,
    seeded_schedule,
)
from relay.device import CpuPolicy, register_policy
from relay.maps.eagle import EagleFutureMap

POOL = 9


def _interleave() -> list[str]:
    """Two streams and the host each note three steps, an event record or wait
    between them; returns the order they ran in."""
    order: list[str] = []
    event = CpuEvent()

    def steps(name: str) -> None:
        for i in range(3):
            order.append(f"{name}{i}")
            event.record()

    with thread_streams("a", "b") as (a, b):
        a.submit(lambda: steps("a"))
        b.submit(lambda: steps("b"))
        for i in range(3):
            order.append(f"h{i}")
            event.synchronize()
    return order


def test_a_seed_replays_its_interleaving_and_seeds_differ() -> None:
    """The same seed gives the same order and the same picks; twenty seeds give
    several orders (the schedules explore, they do not all run one way)."""
    orders = set()
    for seed in range(20):
        runs = []
        for _ in range(2):
            with seeded_schedule(seed) as schedule:
                runs.append((_interleave(), list(schedule.trace)))
        assert runs[0] == runs[1], f"seed {seed} did not replay its interleaving"
        orders.add(tuple(runs[0][0]))
    assert len(orders) >= 5, orders


def wait_for(gate: Gate) -> Callable[[], None]:
    """A task that waits for ``gate`` (the guard only stops a broken test hanging)."""

    def task() -> None:
        assert gate.wait(GUARD_S), "the gate never opened"

    return task


def test_a_deadlock_is_reported_with_its_seed() -> None:
    """A task that waits for a gate the host opens only after waiting for the task: no
    side can go on. The schedule says so, naming the seed and what each side waits
    for, instead of hanging (on the host, or as the cause of the task's failure)."""
    gate = Gate()
    with pytest.raises(RuntimeError) as info:
        with seeded_schedule(3), thread_streams("fwd") as (stream,):
            stream.submit(wait_for(gate))
            try:
                stream.synchronize()
            finally:
                gate.set()  # lets the worker finish once the schedule is over
    error: BaseException | None = info.value
    while error is not None and not isinstance(error, ScheduleDeadlock):
        error = error.__cause__
    assert error is not None, info.value
    assert "seeded schedule 3: every thread waits and none can go on" in str(error)
    assert "ThreadStream('fwd') waits for a gate" in str(error)
    assert "RELAY_SCHEDULE_SEED=3" in str(error)


@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_a_host_wait_returns_at_the_record_in_every_schedule(seed: int) -> None:
    """The task records, then waits for the host; the host's event wait must return at
    the record and open the gate. In every schedule the baton reaches the side that
    can go on: a wait that held it, or waited for the task's end, would deadlock."""
    event, gate = CpuEvent(), Gate()
    with replaying(seed), thread_streams("fwd") as (stream,):
        stream.submit(lambda: (event.record(), gate.wait(GUARD_S)))
        try:
            event.synchronize()
        finally:
            gate.set()


# -- the fast publish records its fence ---------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_the_fast_publish_records_the_fence_the_scheduler_waits_on(seed: int) -> None:
    """A debug-off map on the CPU: the forward publishes, then waits for the scheduler,
    whose resolve waits on the fence. That wait returns at the publish's record; were
    the record missing, it would wait for the task's end, which waits for it: reported
    as a deadlock of the schedule."""
    relay = EagleFutureMap("cpu", POOL, topk=2)
    gate = Gate()

    def forward() -> None:
        relay.publish(slots(3), torch.tensor([5]))
        assert gate.wait(GUARD_S)

    with replaying(seed), thread_streams("forward") as (stream,):
        stream.submit(forward)
        try:
            b = batch_of(3)
            relay.resolve_seq_lens_cpu(b)
            assert b.seq_lens.tolist() == [5]
        finally:
            gate.set()


class CountingCpuPolicy(CpuPolicy):
    """The CPU policy, counting the fence records made through it."""

    def __init__(self) -> None:
        self.records = 0

    def record(self, event: object, stream: object) -> None:
        self.records += 1
        super().record(event, stream)


@pytest.fixture
def counting_policy(isolated_policies: None) -> Iterator[CountingCpuPolicy]:
    """A CPU policy maps built now record through (a registered policy gets a
    ``Fence``, not the bare ``CpuFence``)."""
    policy = CountingCpuPolicy()
    register_policy("cpu", lambda device: policy)
    yield policy


def test_each_fast_publish_records_the_fence_once(
    counting_policy: CountingCpuPolicy,
) -> None:
    """Every publish, on the fast path (int64 slots and values of the field's dtype),
    records the fence once; a publish of zero slots records nothing."""
    relay = EagleFutureMap("cpu", POOL, topk=2)
    for step in range(3):
        relay.publish(slots(1, 2), torch.tensor([4, 5]) + step)
        assert counting_policy.records == step + 1
    relay.publish(slots(), torch.tensor([], dtype=torch.int64))
    assert counting_policy.records == 3
    b = batch_of(1, 2)
    relay.resolve_seq_lens_cpu(b)
    assert b.seq_lens.tolist() == [6, 7]


# -- a fence chained in host order, whichever worker runs first ---------------------------


def _publish_from_two_streams(relay: EagleFutureMap) -> None:
    with thread_streams("forward", "draft") as (forward, draft):
        forward.submit(lambda: relay.publish(slots(1), torch.tensor([4])))
        draft.submit(lambda: relay.publish(slots(2), torch.tensor([6])))
        b = batch_of(1, 2)
        relay.resolve_seq_lens_cpu(b)
        assert b.seq_lens.tolist() == [4, 6]


@pytest.mark.usefixtures("clocks_on")
def test_a_chained_fence_with_publishes_in_host_order_is_clean() -> None:
    """Seed 0 runs the forward's publish before the draft's, as the host queued them:
    the chained fence covers both, no report."""
    with seeded_schedule(0):
        _publish_from_two_streams(EagleFutureMap("cpu", POOL, topk=2, debug=True))


@pytest.mark.usefixtures("clocks_on")
def test_a_chained_fence_with_publishes_out_of_host_order_is_clean() -> None:
    """Seed 1 interleaves the two publishes otherwise than seed 0; whichever task
    starts first, the draft's record waits for the forward's, queued first in host
    order, and the chained fence covers both."""
    with seeded_schedule(1):
        _publish_from_two_streams(EagleFutureMap("cpu", POOL, topk=2, debug=True))


def _publish_forward_draft_forward(relay: EagleFutureMap) -> list[str]:
    """The forward publishes, the draft, then the forward again, queued in that order;
    returns the order they ran in."""
    ran: list[str] = []

    def publish(name: str, slot: int, value: int) -> Callable[[], None]:
        def task() -> None:
            ran.append(f"{name}{slot}")
            relay.publish(slots(slot), torch.tensor([value]))

        return task

    with thread_streams("forward", "draft") as (forward, draft):
        forward.submit(publish("forward", 1, 4))
        draft.submit(publish("draft", 2, 6))
        forward.submit(publish("forward", 3, 8))
        b = batch_of(1, 2, 3)
        relay.resolve_seq_lens_cpu(b)
        assert b.seq_lens.tolist() == [4, 6, 8]
    return ran


@pytest.mark.usefixtures("clocks_on")
def test_a_fence_chains_in_host_order_under_every_seeded_schedule() -> None:
    """However the workers interleave three publishes from two streams, the newest
    record in host order covers the other two: no report in any seed, including the
    ones that run the draft's publish first, before both of the forward's."""
    orders = set()
    for seed in SEEDS:
        with replaying(seed):
            relay = EagleFutureMap("cpu", POOL, topk=2, debug=True)
            orders.add(tuple(_publish_forward_draft_forward(relay)))
    if len(SEEDS) > 1:  # RELAY_SCHEDULE_SEED runs one seed alone
        assert ("draft2", "forward1", "forward3") in orders, orders


# -- the reference engine's option --------------------------------------------------------


def test_the_cpu_worker_runs_in_the_schedule_relay_schedule_seed_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``RELAY_SCHEDULE_SEED`` makes the overlap executor's worker and its caller take
    turns in that seeded schedule until the executor closes; unset, they run free."""
    from relay.engine.executors import make_executor

    cpu = torch.device("cpu")
    monkeypatch.setenv("RELAY_SCHEDULE_SEED", "7")
    executor = make_executor(cpu, overlap=True)
    schedule = active_schedule()
    assert schedule is not None and schedule.seed == 7
    seen: list[SeededSchedule | None] = []
    executor.wait(executor.launch(lambda: seen.append(active_schedule())))
    executor.close()
    assert seen == [schedule] and active_schedule() is None
    monkeypatch.delenv("RELAY_SCHEDULE_SEED")
    executor = make_executor(cpu, overlap=True)
    assert active_schedule() is None
    executor.close()
