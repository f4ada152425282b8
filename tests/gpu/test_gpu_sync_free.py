"""No host synchronization in the forward-side methods: ``stash``, ``publish``,
``invalidate`` and ``resolve_future`` only enqueue device work (checked with
``torch.cuda.set_sync_debug_mode("error")``), so they can run ahead of the device and
inside a captured graph."""

from __future__ import annotations

import pytest
import torch
from gpu_maps import BundledMap, no_host_sync, random_slots

pytestmark = pytest.mark.gpu

POOL = 17
STEPS = 3


def test_the_sync_check_catches_a_host_sync(cuda: torch.device) -> None:
    """The check the tests below rely on raises on a real host sync, and restores the mode."""
    before = torch.cuda.get_sync_debug_mode()
    value = torch.ones(2, device=cuda)
    with pytest.raises(RuntimeError, match="synchroniz"), no_host_sync():
        value.sum().item()
    assert torch.cuda.get_sync_debug_mode() == before


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_stash_publish_and_resolve_future_never_sync_the_host(
    bundled: BundledMap, cuda: torch.device, debug: bool
) -> None:
    """From the first (lazily allocating) stash on, the forward side of every step enqueues
    device work only; debug mode's checks run on the device too (torch._assert_async)."""
    relay = bundled.new(cuda, POOL, debug=debug)
    steps = []
    for step in range(STEPS):
        n = step + 2
        indices = torch.tensor(random_slots(n, POOL, seed=step), device=cuda)
        steps.append(
            (
                indices,
                bundled.values(bundled.forward, n, 1000 * step + 1, cuda),
                bundled.values(bundled.schedule, n, 1000 * step + 501, cuda),
                bundled.batch(indices),
            )
        )
    torch.cuda.synchronize(cuda)  # the inputs' own copies are done before the check

    for indices, forward, schedule, batch in steps:
        with no_host_sync():
            bundled.stash(relay, indices, forward)
            bundled.publish(relay, indices, schedule)
        # The scheduler's side waits for the host copy by design: outside the check.
        bundled.resolve_schedule(relay, batch)
        with no_host_sync():
            bundled.invalidate(relay, batch, indices)
            if bundled.forward:
                relay.resolve_future(batch)

    torch.cuda.synchronize(cuda)  # and any device-side assert fires here
    for step, (indices, forward, schedule, batch) in enumerate(steps):
        bundled.check_forward(batch, forward, indices.shape[0], f"step {step}")
        bundled.check_schedule(batch, schedule, f"step {step}")
