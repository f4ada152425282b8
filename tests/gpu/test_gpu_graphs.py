"""CUDA graphs: every bundled map's ``resolve_future`` captured once and replayed for new
slots, under DOMAIN.md's graph rules (buffers at fixed addresses, index tensors on the
device, padded rows pointing at scratch row 0)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from gpu_maps import BundledMap, get_path, new_stream, random_slots, set_path

pytestmark = pytest.mark.gpu

POOL = 33
WIDTH = 8  # the captured batch size; real batches of fewer rows are padded with slot 0
REAL_ROWS = (5, 8, 1, 3)  # real rows of each step; step 0 is the warm-up before capture


def _padded(real: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(
        real + [0] * (WIDTH - len(real)), dtype=torch.int64, device=device
    )


def _placeholders(
    bundled: BundledMap, relay: Any, indices: torch.Tensor
) -> dict[str, Any]:
    """What ``invalidate`` writes into each placeholder target for ``indices``."""
    scratch = bundled.batch(indices)
    bundled.invalidate(relay, scratch, indices)
    return {
        f.target: get_path(scratch, f.target) for f in bundled.placeholders if f.target
    }


def _addresses(bundled: BundledMap, relay: Any) -> dict[str, int]:
    return {name: t.data_ptr() for name, t in bundled.tensors(relay).items()}


def test_resolve_future_replays_in_a_cuda_graph_for_new_slots(
    bundled: BundledMap, cuda: torch.device
) -> None:
    """Captured once, resolve_future hands each replay the rows stashed for its new slots;
    padded rows read scratch row 0 as an eager resolve does, and no buffer moves."""
    if not bundled.forward:
        pytest.skip(
            f"{bundled.cls.__name__} has no forward lane: resolve_future reads nothing"
        )
    relay = bundled.new(cuda, POOL)
    twin = bundled.new(
        cuda, POOL
    )  # the same stashes, resolved eagerly, to compare with
    steps = [random_slots(n, POOL, seed=step) for step, n in enumerate(REAL_ROWS)]

    # The static inputs of the graph: the index tensor and the placeholder targets, on
    # the device, rewritten in place before each replay.
    static_indices = _padded(steps[0], cuda)
    static_inputs = {
        path: tensor.clone()
        for path, tensor in _placeholders(bundled, relay, static_indices).items()
    }
    batch = bundled.batch(static_indices)

    def load_inputs() -> None:
        for path, tensor in _placeholders(bundled, relay, static_indices).items():
            static_inputs[path].copy_(tensor)
            set_path(batch, path, static_inputs[path])  # in case a resolve re-bound it

    # Step 0, eager: the first stash allocates lazy buffers (which cannot happen during
    # capture), then one resolve on a side stream warms up, as torch.cuda.graph asks.
    values = bundled.values(bundled.forward, len(steps[0]), 1, cuda)
    for each in (relay, twin):
        bundled.stash(each, torch.tensor(steps[0], device=cuda), values)
    addresses = _addresses(bundled, relay)
    load_inputs()
    side = new_stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.cuda.stream(side):
        relay.resolve_future(batch)
    torch.cuda.current_stream(cuda).wait_stream(side)
    bundled.check_forward(batch, values, len(steps[0]), "warm-up (eager)")

    load_inputs()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        relay.resolve_future(batch)

    for step, real in enumerate(steps[1:], start=1):
        values = bundled.values(bundled.forward, len(real), 1000 * step + 1, cuda)
        for each in (relay, twin):
            bundled.stash(each, torch.tensor(real, device=cuda), values)
        static_indices.copy_(_padded(real, cuda))  # new slots, written in place
        for path, tensor in _placeholders(bundled, relay, static_indices).items():
            static_inputs[path].copy_(tensor)
        graph.replay()
        torch.cuda.synchronize(cuda)
        bundled.check_forward(batch, values, len(real), f"replay {step}")
        eager = bundled.batch(static_indices.clone())
        bundled.invalidate(twin, eager, get_path(eager, bundled.schema.indices))
        twin.resolve_future(eager)
        for f in bundled.forward:
            if f.target:
                got, want = get_path(batch, f.target), get_path(eager, f.target)
                assert torch.equal(got, want), (
                    f"replay {step}: batch.{f.target} (padded rows included) differs from "
                    f"an eager resolve:\n got {got}\nwant {want}"
                )
        assert _addresses(bundled, relay) == addresses, (
            f"replay {step}: a buffer moved; the graph would read freed memory"
        )


def test_buffers_stay_at_fixed_addresses_across_steps(
    bundled: BundledMap, cuda: torch.device
) -> None:
    """Stash, publish, invalidate and both resolves write in place: no buffer is reallocated
    after the first stash."""
    relay = bundled.new(cuda, POOL)
    addresses: dict[str, int] | None = None
    for step, n in enumerate(REAL_ROWS):
        indices = torch.tensor(random_slots(n, POOL, seed=100 + step), device=cuda)
        forward = bundled.values(bundled.forward, n, 1000 * step + 1, cuda)
        schedule = bundled.values(bundled.schedule, n, 1000 * step + 501, cuda)
        bundled.stash(relay, indices, forward)
        bundled.publish(relay, indices, schedule)
        batch = bundled.batch(indices)
        bundled.resolve_schedule(relay, batch)
        bundled.invalidate(relay, batch, indices)
        if bundled.forward:
            relay.resolve_future(batch)
        torch.cuda.synchronize(cuda)
        bundled.check_forward(batch, forward, n, f"step {step}")
        bundled.check_schedule(batch, schedule, f"step {step}")
        if addresses is None:
            addresses = _addresses(bundled, relay)  # lazy buffers exist from here on
        assert _addresses(bundled, relay) == addresses, f"step {step}: a buffer moved"
