"""What only CUDA has: real streams publishing and resolving concurrently with the fence
chained, the host mirror copied on the private copy stream while the forward stream is
still held, and pinned host buffers reused safely across steps.

Streams are held by gates the test opens (Note [Gated streams] in gate.py): while a gate
is closed, whatever is queued behind it is pending for certain, on any GPU, so a test
asserts what must already be done or still pending, then opens the gate and checks the
values. A host call that must not wait for held work (the host copy) would block until
the gate's guard ends the spin, and the gate then reports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from gate import Gate
from gpu_maps import (
    BundledMap,
    get_path,
    is_done,
    new_stream,
    random_slots,
    record,
)

pytestmark = pytest.mark.gpu

POOL = 17

Gates = Callable[[], Gate]


def _with_schedule(bundled: BundledMap) -> None:
    if not bundled.schedule:
        pytest.skip(
            f"{bundled.cls.__name__} has no schedule lane: no fence, nothing published"
        )


def _with_mirror(bundled: BundledMap) -> None:
    if not bundled.mirrored:
        pytest.skip(f"{bundled.cls.__name__} copies nothing to the host")


def _on(stream: torch.cuda.Stream) -> Any:
    return torch.cuda.stream(stream)


# -- the fence, chained across publishing streams ----------------------------------------------


def test_a_reused_event_moved_by_a_second_stream_drops_the_first(
    cuda: torch.device, gates: Gates
) -> None:
    """The hazard the next test guards against is real here: an event re-recorded on a
    second stream no longer orders a reader after the first stream's write."""
    buffer = torch.zeros(2, dtype=torch.int64, device=cuda)
    first, second, reader = (new_stream(cuda) for _ in range(3))
    event = record(reader)  # one reusable event, as the fence has
    # Allocated before the gate: nothing that may block the host is queued behind it.
    seen = torch.empty_like(buffer)
    gate = gates()
    torch.cuda.synchronize(cuda)
    with _on(first):
        gate.hold()
        # A kernel, not ``buffer[0] = 1``: a Python scalar is copied in from pageable host
        # memory, which blocks the host until the held stream runs (seen on an H200).
        buffer[0:1].fill_(1)
        event.record(first)
    with _on(second):
        buffer[1:2].fill_(2)
        event.record(second)  # not chained: the first record is forgotten
    with _on(reader):
        reader.wait_event(event)
        seen.copy_(buffer)
    reader.synchronize()  # the reader waits for the second stream only
    gate.open()
    first.synchronize()
    gate.check()
    assert seen.tolist() == [0, 2], "the reader should have run before the first write"
    assert buffer.tolist() == [1, 2]


def test_two_publishing_streams_and_a_waiting_reader_see_both_publishes(
    bundled: BundledMap, cuda: torch.device, gates: Gates
) -> None:
    """A publish from a second stream chains on the first one's record: while the first
    publish is held, the second stream waits for it (and so does a reader of the fence),
    and after it the reader sees both streams' rows."""
    _with_schedule(bundled)
    relay = bundled.new(cuda, POOL)
    slots = random_slots(6, POOL, seed=1)
    first_rows = torch.tensor(slots[:3], device=cuda)
    second_rows = torch.tensor(slots[3:], device=cuda)
    values = bundled.values(bundled.schedule, 6, 101, cuda)
    first_values = {name: v[:3] for name, v in values.items()}
    second_values = {name: v[3:] for name, v in values.items()}
    first, second, reader = (new_stream(cuda) for _ in range(3))
    batch = bundled.batch(torch.tensor(slots, device=cuda))
    gate = gates()
    torch.cuda.synchronize(cuda)  # inputs ready on every stream

    with _on(first):
        gate.hold()  # the first publish lands last
        bundled.publish(relay, first_rows, first_values)
    with _on(second):
        bundled.publish(relay, second_rows, second_values)
        second_published = record(second)
    assert not is_done(second_published), (
        "the second publish did not chain on the first one's record (Note [Fence chaining])"
    )
    if not bundled.mirrored:  # device-side resolves only: the host does not block
        with _on(reader):
            bundled.resolve_schedule(relay, batch)
            resolved = record(reader)
        assert not is_done(resolved), "the reader did not wait for the held publish"
        gate.open()
    else:  # a host-mirrored resolve blocks the host until both publishes have landed
        gate.open()
        with _on(reader):
            bundled.resolve_schedule(relay, batch)

    torch.cuda.synchronize(cuda)
    gate.check()
    bundled.check_schedule(batch, values, "reader after two publishers")


def test_overlapped_steps_on_cuda_streams_hand_each_step_its_own_values(
    bundled: BundledMap, cuda: torch.device, gates: Gates
) -> None:
    """An overlap loop on two streams: the forward stream resolves, publishes mid-forward
    and stashes; the scheduler's stream resolves each publish behind the fence, while the
    rest of the forward is held, and writes the next batch's placeholders. Every step gets
    its own values."""
    relay = bundled.new(cuda, POOL)
    forward_stream, scheduler_stream = new_stream(cuda), new_stream(cuda)
    slots = random_slots(5, POOL, seed=2)
    indices = torch.tensor(slots, device=cuda)
    steps = 4
    forward = [
        bundled.values(bundled.forward, 5, 1000 * s + 1, cuda) for s in range(steps)
    ]
    schedule = [
        bundled.values(bundled.schedule, 5, 1000 * s + 501, cuda) for s in range(steps)
    ]
    batches = [bundled.batch(indices) for _ in range(steps)]
    torch.cuda.synchronize(cuda)

    for step in range(steps):
        batch = batches[step]
        first_half, rest = gates(), gates()
        with _on(forward_stream):
            if step > 0 and bundled.forward:
                # The previous forward's stash, in stream order.
                relay.resolve_future(batch)
            first_half.hold()
            bundled.publish(relay, indices, schedule[step])
            rest.hold()
            bundled.stash(relay, indices, forward[step])
            forward_done = record(forward_stream)
        if bundled.schedule and not bundled.mirrored:
            with _on(scheduler_stream):
                bundled.resolve_schedule(relay, batch)
                resolved = record(scheduler_stream)
            assert not is_done(resolved), (
                f"step {step}: the scheduler's resolve did not wait for the publish"
            )
            first_half.open()
        else:  # a host-mirrored resolve blocks the host until the publish lands
            first_half.open()
            with _on(scheduler_stream):
                bundled.resolve_schedule(relay, batch)
        with _on(scheduler_stream):
            if step + 1 < steps:
                bundled.invalidate(relay, batches[step + 1], indices)
        scheduler_stream.synchronize()  # behind the fence: the publish, not the forward
        assert not is_done(forward_done), (
            f"step {step}: the scheduler waited for the whole forward (the gate's guard "
            "let it go)"
        )
        bundled.check_schedule(batch, schedule[step], f"step {step}, forward held")
        rest.open()
        # The next forward reads placeholders the scheduler wrote on its own stream.
        forward_stream.wait_stream(scheduler_stream)

    torch.cuda.synchronize(cuda)
    for step in range(steps):
        bundled.check_schedule(batches[step], schedule[step], f"step {step}")
        if step > 0:
            bundled.check_forward(batches[step], forward[step - 1], 5, f"step {step}")


# -- the host mirror: private copy stream, pinned rows ----------------------------------------


def test_the_schedulers_stream_waits_on_the_fence_for_a_held_publish(
    bundled: BundledMap, cuda: torch.device, gates: Gates
) -> None:
    """The fence's device-side wait orders the scheduler's stream after a publish on
    the forward stream: while the publish is held, work the scheduler's stream queues
    after the wait is pending; opened, the resolve hands over the published values."""
    _with_schedule(bundled)
    relay = bundled.new(cuda, POOL)
    forward_stream, scheduler_stream = new_stream(cuda), new_stream(cuda)
    indices = torch.tensor(random_slots(3, POOL, seed=5), device=cuda)
    values = bundled.values(bundled.schedule, 3, 501, cuda)
    gate = gates()
    torch.cuda.synchronize(cuda)

    with _on(forward_stream):
        gate.hold()  # the forward's work before the publish
        bundled.publish(relay, indices, values)
    with _on(scheduler_stream):
        relay._state.fence.wait()  # what every schedule resolve does first
        waited = record(scheduler_stream)
    assert not is_done(waited), "the scheduler's stream did not wait on the fence"
    gate.open()  # before the resolve: a host-mirrored one blocks the host
    batch = bundled.batch(indices)
    with _on(scheduler_stream):
        bundled.resolve_schedule(relay, batch)
    torch.cuda.synchronize(cuda)
    gate.check()
    bundled.check_schedule(batch, values, "behind the fence")


def test_host_copy_waits_for_the_publish_not_for_the_whole_forward(
    bundled: BundledMap, cuda: torch.device, gates: Gates
) -> None:
    """resolve_seq_lens_cpu (and every host-mirrored resolve) returns the published values
    while the rest of the forward, after the publish, is held."""
    _with_mirror(bundled)
    relay = bundled.new(cuda, POOL)
    forward_stream, scheduler_stream = new_stream(cuda), new_stream(cuda)
    indices = torch.tensor(random_slots(4, POOL, seed=3), device=cuda)
    warm = bundled.values(bundled.schedule, 4, 1, cuda)
    values = bundled.values(bundled.schedule, 4, 1001, cuda)
    # A first step allocates the copy stream and the pinned rows, outside the gate.
    bundled.publish(relay, indices, warm)
    bundled.resolve_schedule(relay, bundled.batch(indices))
    rest = gates()
    torch.cuda.synchronize(cuda)

    batch = bundled.batch(indices)
    with _on(forward_stream):
        bundled.publish(relay, indices, values)
        rest.hold()  # the rest of the forward
        forward_done = record(forward_stream)
    with _on(scheduler_stream):
        # Blocks the host for the host copy: were that copy ordered after the whole
        # forward, it would return only when the gate's guard let the forward go.
        bundled.resolve_schedule(relay, batch)
    assert not is_done(forward_done), (
        "the host copy waited for the whole forward (the gate's guard let it go), not "
        "for the publish"
    )
    scheduler_stream.synchronize()  # the device-side target too; the forward stays held
    assert not is_done(forward_done), "the scheduler's stream waited for the forward"
    bundled.check_schedule(batch, values, "while the forward is held")
    rest.open()
    forward_stream.synchronize()
    assert is_done(forward_done)
    rest.check()


def test_host_copies_handed_out_survive_the_next_steps_copy(
    bundled: BundledMap, cuda: torch.device
) -> None:
    """The host tensors a resolve hands out are the caller's: the next step's copy through
    the same pinned rows leaves them as they were."""
    _with_mirror(bundled)
    relay = bundled.new(cuda, POOL)
    indices = torch.tensor(random_slots(4, POOL, seed=4), device=cuda)
    forward_stream = new_stream(cuda)
    handed: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []
    for step in range(3):
        values = bundled.values(bundled.schedule, 4, 1000 * step + 1, cuda)
        batch = bundled.batch(indices)
        forward_stream.wait_stream(torch.cuda.current_stream(cuda))  # values are ready
        with _on(forward_stream):
            bundled.publish(relay, indices, values)
        # The host blocks here for this step's copy; the next step's copy into the same
        # pinned rows comes after it has handed this step's tensors out.
        bundled.resolve_schedule(relay, batch)
        bundled.check_schedule(batch, values, f"step {step}")
        host = {
            f.name: get_path(batch, f.host.mirror)
            for f in bundled.mirrored
            if f.host and f.host.mirror
        }
        handed.append((host, {name: t.clone() for name, t in host.items()}))
    for step, (host, snapshot) in enumerate(handed):
        for name, tensor in host.items():
            assert torch.equal(tensor, snapshot[name]), (
                f"step {step}: {name}'s host copy changed"
            )
    pointers = [t.data_ptr() for host, _ in handed for t in host.values()]
    assert len(set(pointers)) == len(pointers), (
        "two steps were handed the same host memory"
    )


def test_host_mirror_reuses_one_pinned_buffer(cuda: torch.device) -> None:
    """A HostMirror allocates its pinned rows once and reuses them for every copy."""
    from relay.device import (
        HostMirror,
    )  # here: a rename fails this test, not collection

    mirror = HostMirror(cuda, POOL)
    source = torch.arange(1, 6, dtype=torch.int64, device=cuda)
    rows = mirror.pinned_rows(source)
    assert rows.is_pinned() and rows.shape == source.shape
    first = mirror.copy(source)
    second = mirror.copy(source * 10)
    assert mirror.pinned_rows(source).data_ptr() == rows.data_ptr(), (
        "pinned rows reallocated"
    )
    assert first.tolist() == [1, 2, 3, 4, 5]
    assert second.tolist() == [10, 20, 30, 40, 50]
    assert first.data_ptr() != rows.data_ptr() and second.data_ptr() != rows.data_ptr()
