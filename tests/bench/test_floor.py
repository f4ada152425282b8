"""The floor of ``relay bench``: the same torch calls as each generated map, bare.

No timing is asserted: the floor must do the generated map's work, op for op and value
for value, and nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from relay import runtime
from relay.bench import floor
from relay.bench.counts import StepCount, count_step
from relay.bench.floor import FLOORS, compare_floor, floor_side, has_floor
from relay.bench.sides import Generated, Pair, Workload, discover, generated_side
from relay.bench.sizes import Shape
from relay.cpu_stream import CpuEvent
from relay.device import HostMirror, policy_for

CPU = torch.device("cpu")
FOUND, _ = discover()
# Batch 1 (a one-element index), a small batch, and one above the host-sum threshold.
SHAPES = {
    False: [Shape(17, 1), Shape(17, 4), Shape(257, 100)],
    True: [Shape(17, 1, 1, 8), Shape(17, 4, 2, 0), Shape(257, 100, 3, 16)],
}
CASES = [
    pytest.param(pair, gen, shape, id=f"{pair.schema}-{shape.label}")
    for pair, gen in FOUND
    for shape in SHAPES[pair.spec]
]


def _ops(count: StepCount) -> list[tuple[str, tuple[str, ...], int]]:
    return [(m.method, m.ops, m.views) for m in count.methods]


def _steady_counts(pair: Pair, gen: Generated, shape: Shape) -> tuple[Any, Any]:
    work = Workload.random(shape, CPU, torch.Generator().manual_seed(0), spec=pair.spec)
    generated = generated_side(gen, shape, CPU, work)
    bare = floor_side(pair.schema, shape, CPU, work)
    generated.step()  # the first step reads the priming stash; count a steady one
    bare.step()
    return count_step(generated), count_step(bare)


def test_every_compared_schema_has_a_floor() -> None:
    """Each bundled pair the bench compares has a floor on the CPU, and none elsewhere."""
    assert FOUND
    for pair, _ in FOUND:
        assert has_floor(pair.schema, CPU)
        assert not has_floor(pair.schema, torch.device("meta"))


@pytest.mark.parametrize("pair,gen,shape", CASES)
def test_floor_dispatches_the_generated_ops(
    pair: Pair, gen: Generated, shape: Shape
) -> None:
    """Method by method, the floor dispatches exactly the generated map's data ops, in
    order, and as many view ops (debug off)."""
    generated, bare = _steady_counts(pair, gen, shape)
    assert _ops(bare) == _ops(generated)
    assert bare.ops > 0


@pytest.mark.parametrize("pair,gen,shape", CASES)
def test_floor_resolves_the_generated_values(
    pair: Pair, gen: Generated, shape: Shape
) -> None:
    """Over several steps with fresh outputs, the floor hands the next forward and the
    scheduler what the generated map does, and its buffers hold the same rows."""
    for seed in range(2):
        assert compare_floor(pair.schema, gen, shape, CPU, steps=4, seed=seed) == []


def test_a_floor_that_skips_work_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A floor that leaves a write out differs in ops and in values, so neither check
    can pass a floor cheaper than the work."""
    pair, gen = next((p, g) for p, g in FOUND if p.schema == "decode")
    build = FLOORS["decode"]

    def lazy(*args: Any) -> Any:
        buffers, calls = build(*args)
        return buffers, tuple(
            (name, (lambda: None) if name == "stash" else call) for name, call in calls
        )

    monkeypatch.setitem(FLOORS, "decode", lazy)
    shape = Shape(17, 4)
    generated, bare = _steady_counts(pair, gen, shape)
    assert _ops(bare) != _ops(generated)
    problems = compare_floor("decode", gen, shape, CPU, steps=2)
    assert any("next tokens differs" in p for p in problems)
    assert any("output_tokens_buf differs" in p for p in problems)


def test_floor_sums_as_the_runtime_does() -> None:
    """The floor's host sum switches from Python to torch where the runtime's does."""
    assert floor._SUM_IN_PYTHON_MAX == runtime.HOST_SUM_IN_PYTHON_MAX


def test_no_floor_off_the_cpu() -> None:
    """Asking for a floor where there is none names the file that holds the floors."""
    shape = Shape(17, 4)
    work = Workload.random(shape, CPU, torch.Generator().manual_seed(0), spec=False)
    with pytest.raises(LookupError, match="relay/bench/floor.py"):
        floor_side("decode", shape, torch.device("meta"), work)


def test_floor_fence_and_host_copy_are_the_cpu_policy() -> None:
    """The floor's bare fence is a ``CpuEvent`` and its host copy a ``clone``, as the CPU
    device policy does: the fence dispatches no op, so the op check cannot see it."""
    policy = policy_for(CPU)
    assert type(policy.new_event()) is CpuEvent
    rows = torch.arange(3)
    host = HostMirror(CPU, 8).copy(rows)
    assert host is not rows
    assert host.data_ptr() != rows.data_ptr()
    assert torch.equal(host, rows)
