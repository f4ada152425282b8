"""The gates of the GPU tests (Note [Gated streams] in gate.py), checked on the CPU wherever
triton is installed (skipped elsewhere: relay does not depend on it): ``Gate`` with its
kernel run by Triton's interpreter on a thread of the test's own (the thread stands in for
the held stream), and the kernel compiled for CUDA with no GPU. Nothing here needs a GPU;
the GPU tests rely on exactly this logic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from gate import ARMED, GUARD_S, OPENED, TIMED_OUT, Gate, describe
from triton_interpret import REPO, Interpreted, load_module, require_triton

KERNEL_FILE = REPO / "tests" / "gpu" / "gate_kernel.py"
#: A guard, in spins, that the interpreter cannot spend while a test looks.
LONG = 10**12
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def module() -> Any:
    """A private, interpreted copy of gate_kernel.py."""
    return load_module(KERNEL_FILE, "_gate_kernel_interpreted", interpret=True)


@pytest.fixture
def made() -> list[Gate]:
    """The gates a test made (``worker`` opens them all before it joins its threads)."""
    return []


@pytest.fixture
def make(module: Any, made: list[Gate]) -> Callable[[int], Gate]:
    """Closed CPU gates with the interpreted kernel and a guard of the given spins."""

    def new(guard: int) -> Gate:
        gate = Gate(CPU, kernel=Interpreted(module.hold), guard=guard)
        made.append(gate)
        return gate

    return new


@pytest.fixture
def worker(
    made: list[Gate],
) -> Iterator[Callable[[Callable[[], None]], threading.Thread]]:
    """Starts a daemon thread (the held 'stream'). Afterwards every gate is opened, so a
    failed test leaves no thread spinning, and every thread is joined."""
    started: list[threading.Thread] = []

    def start(body: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=body, daemon=True)
        started.append(thread)
        thread.start()
        return thread

    yield start
    for gate in made:
        gate.open()
    for thread in started:
        thread.join(GUARD_S)


def _until_armed(gate: Gate) -> None:
    """Wait for the kernel to report ARMED (it has started spinning); a failure guard of
    GUARD_S, never an ordering assert."""
    deadline = time.monotonic() + GUARD_S
    while int(gate.state[1]) != ARMED:
        assert time.monotonic() < deadline, "the gate's kernel never started"
        time.sleep(0.001)


def test_work_behind_a_closed_gate_waits_until_it_is_opened(
    make: Callable[[int], Gate],
    worker: Callable[[Callable[[], None]], threading.Thread],
) -> None:
    """What is queued after hold() runs only once open() is called, and the gate reports
    it was opened, not let go by its guard."""
    gate = make(LONG)
    done: list[str] = []

    def held_stream() -> None:
        gate.hold()
        done.append("after the gate")

    thread = worker(held_stream)
    _until_armed(gate)
    assert done == [] and thread.is_alive()  # certain: the flag is not set
    gate.open()
    thread.join(GUARD_S)
    assert done == ["after the gate"]
    assert gate.outcome() == "opened"
    gate.check()


def test_a_gate_opened_before_it_is_held_passes_at_once(
    make: Callable[[int], Gate],
) -> None:
    """open() before hold(): the kernel finds the flag set and ends without spinning."""
    gate = make(LONG)
    gate.open()
    gate.open()  # a second open is harmless
    gate.hold()  # on this thread: returns only because the flag is set
    assert int(gate.state[1]) == OPENED
    gate.check()


def test_a_gate_never_opened_ends_at_its_guard_and_says_so(
    make: Callable[[int], Gate],
) -> None:
    """A gate nobody opens spins out its guard, reports TIMED_OUT, and check() fails
    naming the guard (the host was blocked on held work)."""
    gate = make(50)
    gate.hold()
    assert int(gate.state[1]) == TIMED_OUT
    assert gate.outcome() == "timed out"
    with pytest.raises(AssertionError, match="guard"):
        gate.check()


def test_a_gate_holds_once_and_a_gate_never_held_fails_its_check(
    make: Callable[[int], Gate],
) -> None:
    """hold() twice is refused; check() of a gate never held fails; codes have names."""
    gate = make(LONG)
    with pytest.raises(AssertionError, match="not held"):
        gate.check()
    gate.open()
    gate.hold()
    with pytest.raises(AssertionError, match="holds once"):
        gate.hold()
    assert [describe(code) for code in range(5)] == [
        "not held",
        "armed",
        "opened",
        "timed out",
        "unknown (4)",
    ]


def test_the_gate_kernel_compiles_for_cuda_with_volatile_loads_and_the_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled kernel (the GPU's branch, which the interpreter cannot take) lowers to
    PTX for sm_90: its flag loads are volatile (re-read on each spin, never hoisted) and
    its guard reads the global timer; it assembles to a cubin."""
    require_triton()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    module = load_module(KERNEL_FILE, "_gate_kernel_compiled", interpret=False)
    signature = {"state": "*i32", "limit": "i64", "TIMER": "constexpr"}
    source = ASTSource(module.hold, signature, {"TIMER": True})
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 1, "enable_fp_fusion": False},
    )
    ptx = compiled.asm["ptx"]
    assert "ld.volatile.global" in ptx
    assert "%globaltimer" in ptx
    assert len(compiled.asm["cubin"]) > 0
