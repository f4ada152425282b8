"""The floor: each bundled map's step written as its bare torch calls.

The baseline answers "does relay cost more than the map an engine keeps by hand?";
the floor answers "how much of a step is relay's own Python?". A floor is the step
of one generated map with everything but its torch calls taken out: the same
``index_copy_`` and ``index_select`` calls on the same buffers, the same fence calls,
the same host copy and sum, and the attribute writes that hand the results to the
batch. No checks, no helpers, no payload object, no debug branch.

It is specialized to its shape (Note [Floor specialized to its shape]), and it
exists for the CPU only: on a GPU the generated host copy goes through a private
stream into a pinned mirror, which is device policy, not a bare call.

``tests/bench/test_floor.py`` asserts that each floor dispatches exactly the data
and view ops of its generated map, method by method, and resolves the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from relay.bench.sides import (
    Batch,
    Generated,
    Side,
    Workload,
    advance_seq_lens,
    generated_side,
    observed,
    same_value,
)
from relay.bench.sizes import Shape
from relay.cpu_stream import CpuEvent

__all__ = ["FLOORS", "FloorMap", "compare_floor", "floor_side", "has_floor"]

# Note [Floor specialized to its shape]
# A generated map decides per call what the floor decided when it was built: whether
# the optional hidden state is carried (``hidden_states is not None``, the carried
# flag), whether its lazy buffer exists yet, and which host sum fits the batch (a
# Python sum of ``tolist()`` up to ``relay.runtime.HOST_SUM_IN_PYTHON_MAX`` values,
# numpy's above: the same calls the generated map makes at that batch).
# Those decisions are part of relay's cost, so the floor leaves them out: it is the
# least a step of that design can cost, a lower bound and never a strawman. What it
# keeps is what any caller pays: one Python call per method (the driver's, the same
# as for every side), the reads of ``batch.req_pool_indices`` and the workload's
# values, and the attribute writes that hand results to the batch.

#: Mirrors relay.runtime.HOST_SUM_IN_PYTHON_MAX (the op-parity tests fail if the two
#: diverge): up to this many values the generated sum dispatches no op.
_SUM_IN_PYTHON_MAX = 64


class FloorMap:
    """The buffers of a floor, named as the generated map's (``<field>_buf``), so the
    values check compares them buffer by buffer."""

    def __init__(self, **buffers: torch.Tensor | None) -> None:
        for name, buf in buffers.items():
            setattr(self, name, buf)


Calls = tuple[tuple[str, Callable[[], None]], ...]


def _zeros(device: torch.device, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)


def _token_lane(
    shape: Shape, device: torch.device, work: Workload, batch: Batch, owner: str
) -> tuple[torch.Tensor, Callable[[], None], Callable[[], None]]:
    """Plain decoding's ``output_tokens``: the buffer, ``resolve_future`` and
    ``stash``, bare."""
    tokens = _zeros(device, shape.pool, dtype=torch.int64)
    values: dict[str, Any] = work.view(["next_token_ids"], owner)
    indices = work.indices

    def resolve_future() -> None:
        batch.input_ids = tokens.index_select(0, batch.req_pool_indices)

    def stash() -> None:
        tokens.index_copy_(0, indices, values["next_token_ids"])

    return tokens, resolve_future, stash


def _decode(
    shape: Shape, device: torch.device, work: Workload, batch: Batch
) -> tuple[FloorMap, Calls]:
    tokens, resolve_future, stash = _token_lane(
        shape, device, work, batch, "decode floor"
    )

    def scheduler() -> None:
        advance_seq_lens(batch)  # the scheduler's own code, the same on every side

    stash()
    return FloorMap(output_tokens_buf=tokens), (
        ("resolve_future", resolve_future),
        ("stash", stash),
        ("scheduler: seq_lens + 1", scheduler),
    )


def _schedule_lane(
    shape: Shape, device: torch.device, work: Workload, batch: Batch, owner: str
) -> tuple[torch.Tensor, Callable[[], None], Callable[[], None]]:
    """``new_seq_lens``: the buffer, ``publish`` and ``resolve_seq_lens_cpu``, bare."""
    lens = _zeros(device, shape.pool, dtype=torch.int64)
    event = CpuEvent()  # what relay.device.Fence records and waits on, on the CPU
    values: dict[str, Any] = work.view(["new_seq_lens"], owner)
    indices = work.indices

    def publish() -> None:
        lens.index_copy_(0, indices, values["new_seq_lens"])
        event.record()

    # On the CPU the gather is already a host tensor, but seq_lens_cpu must be a copy
    # the scheduler may advance apart from seq_lens (Note [CPU host mirror]).
    if shape.batch <= _SUM_IN_PYTHON_MAX:

        def resolve_seq_lens_cpu() -> None:
            event.synchronize()
            rows = lens.index_select(0, batch.req_pool_indices)
            batch.seq_lens = rows
            host = rows.clone()
            batch.seq_lens_cpu = host
            batch.seq_lens_sum = sum(host.tolist())

    else:

        def resolve_seq_lens_cpu() -> None:
            event.synchronize()
            rows = lens.index_select(0, batch.req_pool_indices)
            batch.seq_lens = rows
            host = rows.clone()
            batch.seq_lens_cpu = host
            batch.seq_lens_sum = int(host.numpy().sum())

    return lens, publish, resolve_seq_lens_cpu


def _decode_seq_lens(
    shape: Shape, device: torch.device, work: Workload, batch: Batch
) -> tuple[FloorMap, Calls]:
    owner = "decode_seq_lens floor"
    tokens, resolve_future, stash = _token_lane(shape, device, work, batch, owner)
    lens, publish, resolve_seq_lens_cpu = _schedule_lane(
        shape, device, work, batch, owner
    )
    stash()
    return FloorMap(output_tokens_buf=tokens, new_seq_lens_buf=lens), (
        ("resolve_future", resolve_future),
        ("publish", publish),
        ("stash", stash),
        ("resolve_seq_lens_cpu", resolve_seq_lens_cpu),
    )


def _eagle(
    shape: Shape, device: torch.device, work: Workload, batch: Batch
) -> tuple[FloorMap, Calls]:
    pool, topk = shape.pool, shape.topk
    tokens = _zeros(device, pool, dtype=torch.int64)
    topk_p = _zeros(device, pool, topk, dtype=torch.float32)
    topk_index = _zeros(device, pool, topk, dtype=torch.int64)
    hidden = (
        _zeros(device, pool, shape.hidden, dtype=torch.bfloat16)
        if shape.hidden
        else None
    )
    lens, publish, resolve_seq_lens_cpu = _schedule_lane(
        shape, device, work, batch, "eagle floor"
    )
    names = ["bonus_tokens", "topk_p", "topk_index", "hidden_states"]
    v: dict[str, Any] = work.view(names, "eagle floor")
    indices = work.indices

    if hidden is None:

        def resolve_future() -> None:
            i, spec = batch.req_pool_indices, batch.spec_info
            spec.bonus_tokens = tokens.index_select(0, i)
            spec.topk_p = topk_p.index_select(0, i)
            spec.topk_index = topk_index.index_select(0, i)
            spec.hidden_states = None

        def stash() -> None:
            tokens.index_copy_(0, indices, v["bonus_tokens"])
            topk_p.index_copy_(0, indices, v["topk_p"])
            topk_index.index_copy_(0, indices, v["topk_index"])

    else:
        hidden_buf = hidden

        def resolve_future() -> None:
            i, spec = batch.req_pool_indices, batch.spec_info
            spec.bonus_tokens = tokens.index_select(0, i)
            spec.topk_p = topk_p.index_select(0, i)
            spec.topk_index = topk_index.index_select(0, i)
            spec.hidden_states = hidden_buf.index_select(0, i)

        def stash() -> None:
            tokens.index_copy_(0, indices, v["bonus_tokens"])
            topk_p.index_copy_(0, indices, v["topk_p"])
            topk_index.index_copy_(0, indices, v["topk_index"])
            hidden_buf.index_copy_(0, indices, v["hidden_states"])

    stash()
    floor = FloorMap(
        output_tokens_buf=tokens,
        topk_p_buf=topk_p,
        topk_index_buf=topk_index,
        hidden_states_buf=hidden,
        new_seq_lens_buf=lens,
    )
    return floor, (
        ("resolve_future", resolve_future),
        ("publish", publish),
        ("stash", stash),
        ("resolve_seq_lens_cpu", resolve_seq_lens_cpu),
    )


def _eagle_packed(
    shape: Shape, device: torch.device, work: Workload, batch: Batch
) -> tuple[FloorMap, Calls]:
    """As ``eagle``, with the bonus token and the top-k indices side by side in one
    int64 buffer: one gather for both, split into views (Note [Packed layout])."""
    pool, topk = shape.pool, shape.topk
    packed = _zeros(device, pool, 1 + topk, dtype=torch.int64)
    widths = (1, topk)
    tokens = packed.select(1, 0)
    topk_index = packed.narrow(1, 1, topk)
    topk_p = _zeros(device, pool, topk, dtype=torch.float32)
    hidden = (
        _zeros(device, pool, shape.hidden, dtype=torch.bfloat16)
        if shape.hidden
        else None
    )
    lens, publish, resolve_seq_lens_cpu = _schedule_lane(
        shape, device, work, batch, "eagle_packed floor"
    )
    names = ["bonus_tokens", "topk_p", "topk_index", "hidden_states"]
    v: dict[str, Any] = work.view(names, "eagle_packed floor")
    indices = work.indices

    if hidden is None:

        def resolve_future() -> None:
            i, spec = batch.req_pool_indices, batch.spec_info
            rows = packed.index_select(0, i)
            spec.topk_p = topk_p.index_select(0, i)
            bonus, spec.topk_index = rows.split_with_sizes(widths, 1)
            spec.bonus_tokens = bonus.squeeze(1)
            spec.hidden_states = None

        def stash() -> None:
            tokens.index_copy_(0, indices, v["bonus_tokens"])
            topk_p.index_copy_(0, indices, v["topk_p"])
            topk_index.index_copy_(0, indices, v["topk_index"])

    else:
        hidden_buf = hidden

        def resolve_future() -> None:
            i, spec = batch.req_pool_indices, batch.spec_info
            rows = packed.index_select(0, i)
            spec.topk_p = topk_p.index_select(0, i)
            spec.hidden_states = hidden_buf.index_select(0, i)
            bonus, spec.topk_index = rows.split_with_sizes(widths, 1)
            spec.bonus_tokens = bonus.squeeze(1)

        def stash() -> None:
            tokens.index_copy_(0, indices, v["bonus_tokens"])
            topk_p.index_copy_(0, indices, v["topk_p"])
            topk_index.index_copy_(0, indices, v["topk_index"])
            hidden_buf.index_copy_(0, indices, v["hidden_states"])

    stash()
    floor = FloorMap(
        output_tokens_buf=tokens,
        topk_p_buf=topk_p,
        topk_index_buf=topk_index,
        hidden_states_buf=hidden,
        new_seq_lens_buf=lens,
    )
    return floor, (
        ("resolve_future", resolve_future),
        ("publish", publish),
        ("stash", stash),
        ("resolve_seq_lens_cpu", resolve_seq_lens_cpu),
    )


Builder = Callable[[Shape, torch.device, Workload, Batch], tuple[FloorMap, Calls]]

#: The floor of each bundled schema's design, by schema name.
FLOORS: dict[str, Builder] = {
    "decode": _decode,
    "decode_seq_lens": _decode_seq_lens,
    "eagle": _eagle,
    "eagle_packed": _eagle_packed,
}


def has_floor(schema: str, device: torch.device) -> bool:
    """Whether ``schema`` has a floor on ``device`` (bundled designs, on the CPU)."""
    return schema in FLOORS and device.type == "cpu"


def floor_side(schema: str, shape: Shape, device: torch.device, work: Workload) -> Side:
    """The floor of ``schema`` at ``shape`` over ``work``'s tensors, primed with one
    stash so the first resolve has rows to read."""
    if not has_floor(schema, device):
        raise LookupError(
            f"no floor for {schema!r} on {device.type} (relay/bench/floor.py: "
            f"bundled designs {', '.join(FLOORS)}, on the CPU)"
        )
    batch = Batch.new(work.indices, work.seq_lens)
    floor, calls = FLOORS[schema](shape, device, work, batch)
    return Side("floor", floor, batch, calls)


def compare_floor(
    schema: str,
    generated: Generated,
    shape: Shape,
    device: torch.device,
    *,
    steps: int,
    seed: int = 0,
) -> list[str]:
    """Drive the generated map (debug off) and its floor through ``steps`` steps with
    fresh outputs each step, and list every difference in what the next forward and
    the scheduler see, and in buffers of the same name (empty: none).

    The hidden state, where the shape relays it, is carried from the first stash:
    the floor is specialized to its shape (Note [Floor specialized to its shape]).
    """
    g = torch.Generator().manual_seed(seed)
    spec = bool(shape.topk)
    work = Workload.random(shape, device, g, spec=spec)
    gen = generated_side(generated, shape, device, work)
    floor = floor_side(schema, shape, device, work)
    problems: list[str] = []
    where = f"{schema} {shape.label} floor"
    for step in range(steps):
        work.renew(shape, device, g, spec=spec)
        gen.step()
        floor.step()
        work.advance()
        want, got = dict(observed(gen, True)), dict(observed(floor, True))
        problems += [
            f"{where} step {step}: {key} differs (generated {want[key]!r:.60}, "
            f"floor {got[key]!r:.60})"
            for key in want
            if not same_value(want[key], got[key])
        ]
        floor_bufs = floor.buffers()
        problems += [
            f"{where} step {step}: {key} differs"
            for key, buf in gen.buffers().items()
            if key not in floor_bufs or not same_value(buf, floor_bufs[key])
        ]
    return problems
