"""Gates for the GPU tests: hold a stream at a point until the test opens it.

Note [Gated streams]
A GPU test that checks an order ("the host copy waited for the publish, not for the whole
forward") needs one side held back while it looks at the other. A sleep of N cycles holds
it for a time that depends on the GPU's clock and on how fast the host enqueues; a gate
holds it for exactly as long as the test needs. ``Gate.hold()`` launches, on the current
stream, one Triton program (``gate_kernel.hold``) that spins on a flag in device memory
with volatile loads; everything queued on that stream after it waits. ``Gate.open()``
sets the flag with an async copy from pinned memory on a stream of its own (a copy
engine write, no kernel), so it lands while the held stream still spins.

Rules for a test:
- Open every gate before a call that blocks the host on work queued behind it (a
  host-mirrored resolve, ``synchronize``, ``.cpu()`` of a held result), or the host never
  gets to open it. Event ``query()`` and work on other streams are fine while held.
  So is any kernel queued on the held stream, but not a copy from pageable host memory:
  ``cuda_tensor[i] = 1`` copies the scalar in and blocks the host until the stream gets
  there (``cuda_tensor[i:i + 1].fill_(1)`` launches a kernel instead).
- While a gate is closed, ``is_done`` of an event recorded behind it is False for sure;
  a test asserts that, then opens the gate.
- A guard ends the spin after ``GUARD_S`` (never reached when the test opens the gate, on
  any GPU): if the host was blocked on the held stream (a relay bug, or CUDA's lazy
  module loading needing the whole context idle), the test fails with ``TIMED_OUT``
  instead of hanging. ``warm_up`` in conftest.py runs every op the tests gate once
  before, so no module is first loaded while a gate is held.

Under Triton's interpreter the same kernel runs on the CPU, on a thread of the test's
own (``tests/gpu/test_gate.py``); there the guard counts spins.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

#: How long a held stream may spin before the kernel gives up: a failure guard far above
#: anything a test does while a gate is closed (enqueueing a few ops), never a duration a
#: test relies on.
GUARD_S = 20.0

#: ``state[1]`` before the kernel ran: not held (yet).
NOT_HELD = 0
#: The values ``gate_kernel.hold`` writes to ``state[1]`` (kept equal to its literals).
ARMED, OPENED, TIMED_OUT = 1, 2, 3
OUTCOMES = {
    NOT_HELD: "not held",
    ARMED: "armed",
    OPENED: "opened",
    TIMED_OUT: "timed out",
}


@functools.cache
def compiled_hold() -> Any:
    """``gate_kernel.hold``, compiled (imported on first use: collection needs no triton)."""
    return importlib.import_module("gate_kernel").hold


class Gate:
    """Holds the stream ``hold()`` is called on until ``open()`` (Note [Gated streams])."""

    def __init__(
        self,
        device: torch.device,
        *,
        kernel: Any = None,
        guard: int | None = None,
    ) -> None:
        """A closed gate on ``device``. ``kernel`` and ``guard`` are for the CPU tests (an
        interpreted kernel, a guard in spins); on CUDA they default to the compiled kernel
        and ``GUARD_S`` in nanoseconds."""
        self.device = device
        self.on_gpu = device.type == "cuda"
        self._kernel = kernel if kernel is not None else compiled_hold()
        self._guard = guard if guard is not None else int(GUARD_S * 1e9)
        # state[0]: the flag the host sets; state[1]: what the kernel reports.
        self.state = torch.zeros(2, dtype=torch.int32, device=device)
        self._one = torch.ones(1, dtype=torch.int32, pin_memory=self.on_gpu)
        self._opener: Any = None
        self._zeroed: Any = None
        if self.on_gpu:
            self._opener = torch.cuda.Stream(device)
            # The zeros were queued on the current stream; the held stream and the opener
            # wait for them on the device (a host sync here could meet a held stream).
            self._zeroed = torch.cuda.Event()
            self._zeroed.record(torch.cuda.current_stream(device))
        self.held = False
        self.opened = False

    def hold(self) -> None:
        """Queue the gate on the current stream: later work on it waits until ``open()``.
        (On the CPU, under the interpreter, this call itself spins until then.)"""
        assert not self.held, "a gate holds once; make another"
        self.held = True
        if self._zeroed is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(self._zeroed)
            self.state.record_stream(stream)
        self._kernel[(1,)](self.state, self._guard, TIMER=self.on_gpu, num_warps=1)

    def open(self) -> None:
        """Set the flag, without waiting for anything: a copy on the gate's own stream
        (CUDA), or a store (CPU). Opening twice is harmless."""
        if self.opened:
            return
        self.opened = True
        if self._opener is None:
            self.state[0] = 1
            return
        self._opener.wait_event(self._zeroed)  # never overwritten by the zeros
        with torch.cuda.stream(self._opener):
            self.state[:1].copy_(self._one, non_blocking=True)
        self.state.record_stream(self._opener)

    def outcome(self) -> str:
        """How the kernel ended: ``opened``, ``timed out``, ``armed`` (still spinning) or
        ``not held``. On CUDA, call it once the held stream is synchronized."""
        if self._opener is not None:
            self._opener.synchronize()
        return describe(int(self.state[1].item()))

    def check(self) -> None:
        """The gate was held and let go by ``open()``, not by its guard."""
        outcome = self.outcome() if self.held else "not held"
        assert outcome == "opened", f"the gate ended {outcome!r}, not 'opened'" + (
            f": its stream spun for the whole {GUARD_S:.0f} s guard, so the host was "
            "blocked on work queued behind the gate (a wait on the whole forward, or "
            "CUDA lazy module loading; retry with CUDA_MODULE_LOADING=EAGER to tell)"
            if outcome == "timed out"
            else ""
        )


def describe(code: int) -> str:
    """The name of a ``state[1]`` value."""
    return OUTCOMES.get(code, f"unknown ({code})")
