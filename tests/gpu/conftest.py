"""Fixtures of the GPU tests: the CUDA device, every bundled map found by module, and gates
(Note [Gated streams] in gate.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from gate import Gate
from gpu_maps import BundledMap, load_map, map_modules, slots_on


@pytest.fixture
def cuda() -> Iterator[torch.device]:
    """The current CUDA device; the test's queued work is finished before the next test."""
    device = torch.device("cuda", torch.cuda.current_device())
    yield device
    torch.cuda.synchronize(device)


# Parametrized by module name alone, so that collection imports nothing that could fail
# on a machine without CUDA; the map is loaded (and a map the driver cannot drive fails
# loudly) inside the test, which runs only where CUDA is.
@pytest.fixture(params=map_modules())
def bundled(request: pytest.FixtureRequest) -> BundledMap:
    """Each bundled map in turn (relay/maps/<module>.py with its schema)."""
    return load_map(request.param)


@pytest.fixture(scope="session")
def warm_up() -> None:
    """Every op a gated test queues, run once on CUDA with no gate held, so that CUDA's lazy
    module loading never first loads a kernel while a gate holds a stream (Note [Gated
    streams]): each bundled map through a step, and a gate held and opened."""
    device = torch.device("cuda", torch.cuda.current_device())
    for stem in map_modules():
        try:
            bundled = load_map(stem)
        except AssertionError:
            continue  # a map the driver cannot drive fails its own tests, loudly
        relay = bundled.new(device, 9)
        indices = slots_on(device, 2, 1)
        bundled.publish(relay, indices, bundled.values(bundled.schedule, 2, 1, device))
        bundled.stash(relay, indices, bundled.values(bundled.forward, 2, 1, device))
        batch = bundled.batch(indices)
        bundled.resolve_schedule(relay, batch)
        bundled.invalidate(relay, batch, indices)
        if bundled.forward:
            relay.resolve_future(batch)
    buffer = torch.zeros(2, dtype=torch.int64, device=device)
    buffer[0:1].fill_(1)
    buffer.clone()
    gate = Gate(device)
    gate.open()
    gate.hold()  # already open: compiles and loads the kernel, then passes at once
    torch.cuda.synchronize(device)
    gate.check()


@pytest.fixture
def gates(cuda: torch.device, warm_up: None) -> Iterator[Callable[[], Gate]]:
    """Makes closed gates on the test's device. Afterwards every gate is opened (a failed
    test leaves no stream held) and each one held must have been opened, not timed out."""
    made: list[Gate] = []

    def new() -> Gate:
        gate = Gate(cuda)
        made.append(gate)
        return gate

    yield new
    for gate in made:
        gate.open()
    torch.cuda.synchronize(cuda)
    for gate in made:
        if gate.held:
            gate.check()
