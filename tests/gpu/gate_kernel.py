"""The Triton kernel behind ``gate.Gate``: one program that spins until the host opens the
gate or the guard is spent (Note [Gated streams] in tests/gpu/gate.py).

``state`` is two int32 words: ``state[0]`` is the flag the host sets (nonzero: open);
``state[1]`` is what the kernel reports: ARMED while it spins, then OPENED or TIMED_OUT.
On a GPU the guard is nanoseconds of the global timer; under Triton's interpreter (the CPU
tests) it is a count of spins, since the interpreter has no timer register.
"""

import triton
import triton.language as tl

ARMED = 1
OPENED = 2
TIMED_OUT = 3


@triton.jit
def _now_ns():
    """The GPU's global nanosecond timer (PTX %globaltimer)."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def hold(state, limit, TIMER: tl.constexpr):
    """Spin until ``state[0]`` is nonzero, or for at most ``limit`` (ns with ``TIMER``,
    spins without); report how it ended in ``state[1]``."""
    tl.store(state + 1, 1)  # ARMED
    spent = tl.full((), 0, tl.int64)
    if TIMER:
        start = _now_ns()
    # A volatile load reads memory each time: the compiler may not hoist it out of the
    # loop, and the GPU does not serve it from a stale L1 line.
    opened = tl.load(state, volatile=True)
    while (opened == 0) & (spent < limit):
        opened = tl.load(state, volatile=True)
        if TIMER:
            spent = _now_ns() - start
        else:
            spent = spent + 1
    tl.store(state + 1, tl.where(opened != 0, 2, 3))  # OPENED or TIMED_OUT
