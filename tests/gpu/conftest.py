"""Fixtures of the GPU tests: the CUDA device and every bundled map, found by module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from gpu_maps import BundledMap, load_map, map_modules


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
