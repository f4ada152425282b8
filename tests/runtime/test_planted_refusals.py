"""Planted bugs that relay refuses with an error, not a debug report: a driver runs a
map's forward-side calls on a forward ``ThreadStream`` (Note [Seeded schedules] in
relay/cpu_stream.py), with a bug planted in what it hands relay, and the refusal,
naming the map, the field and the request, reaches the host in every seeded schedule,
with debug on and off, nothing written. The same driver without the plant runs clean."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
import torch
from relay_runtime_support import GUARD_S, thread_streams
from schedule_support import SEEDS, replaying, seed_id

from relay import RelayError
from relay.cpu_stream import Gate, ThreadStream
from relay.schema import (
    BatchRows,
    Field,
    Guard,
    HostCopy,
    Lane,
    Scatter,
    Schema,
    Tails,
    TailsKv,
)
from relay.testing import Namespace, load_map_class

pytestmark = pytest.mark.usefixtures("clocks_on", "schedule")
MODES = pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
PAD = -1


@pytest.fixture(params=[None, *SEEDS], ids=seed_id)
def schedule(request: pytest.FixtureRequest) -> Iterator[None]:
    """Threads free, then each seeded schedule (the captured output names the seed)."""
    with replaying(request.param):
        if request.param is not None:
            print(f"seeded schedule {request.param}")
        yield


def _forward(stream: ThreadStream, *steps: Callable[[], None]) -> BaseException | None:
    """Run ``steps`` in order on ``stream``; the first error one raised, if any."""
    errors: list[BaseException] = []
    done = Gate()

    def task() -> None:
        try:
            for step in steps:
                step()
        except BaseException as error:  # handed to the host below
            errors.append(error)
        finally:
            done.set()

    stream.submit(task)
    assert done.wait(GUARD_S), "the forward never ran"
    return errors[0] if errors else None


CHAIN = Schema(
    name="PlantedChainFutureMap",
    fields=[
        Field(
            "tok",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            resolve=Scatter(offsets="starts"),
            target="input_ids",
            guard=Guard.NON_NEGATIVE,
        ),
        Field(
            "drafts",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=(3,),
            resolve=Scatter(offsets="starts", lengths="counts", after="tok"),
            target="input_ids",
            guard=Guard.NON_NEGATIVE,
        ),
    ],
)


#: CHAIN with every batch row's bounds declared: rows 0 and 1 are the two requests',
#: row 2 a prefill row the scatter does not write.
BOUNDED = attrs.evolve(
    CHAIN,
    fields=[
        attrs.evolve(
            CHAIN.fields[0],
            resolve=Scatter(
                offsets="starts", rows=BatchRows(starts="row_starts", index="rows")
            ),
        ),
        CHAIN.fields[1],
    ],
)


def _chain_steps(
    debug: bool, counts: list[int], schema: Schema = CHAIN
) -> tuple[Namespace, BaseException | None]:
    """Step N stashes two requests' token and 3 drafts; step N+1 lays them at 0 and 4
    with ``counts`` drafts each (3 and 2 laid out), then a prefill row at 7."""
    cls = load_map_class(schema)
    payload = importlib.import_module(cls.__module__).PlantedChainPayload
    relay = cls("cpu", 8, debug=debug)
    batch = Namespace(
        req_pool_indices=torch.tensor([2, 4]),
        starts=torch.tensor([0, 4]),
        counts=torch.tensor(counts),
        row_starts=torch.tensor([0, 4, 7, 8]),
        rows=torch.tensor([0, 1]),
        input_ids=torch.tensor([PAD, PAD, PAD, PAD, PAD, PAD, PAD, 99]),
    )
    stash = payload(
        tok=torch.tensor([10, 20]),
        drafts=torch.tensor([[11, 12, 13], [21, 22, 23]]),
        counts=torch.tensor([3, 3]),
    )
    with thread_streams("forward") as (forward,):
        error = _forward(
            forward,
            lambda: relay.stash(torch.tensor([2, 4]), stash),
            lambda: relay.resolve_future(batch),
        )
    return batch, error


@MODES
def test_the_chain_driver_runs_clean(debug: bool) -> None:
    batch, error = _chain_steps(debug, [3, 2])
    assert error is None, error
    assert batch.input_ids.tolist() == [10, 11, 12, 13, 20, 21, 22, 99]


@MODES
@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ([4, 2], r"row 0 \(slot 2\) has a count of 4 value\(s\), outside \[0, 3\]"),
        (
            [3, -1],
            r"row 1 \(slot 4\) has a count of -1 value\(s\), outside \[0, 3\]",
        ),
    ],
    ids=["above-the-width", "negative"],
)
def test_a_planted_count_is_refused_before_the_write(
    debug: bool, counts: list[int], message: str
) -> None:
    batch, error = _chain_steps(debug, counts)
    assert isinstance(error, RelayError), error
    assert str(error).startswith("PlantedChainFutureMap."), error
    assert batch.input_ids.tolist() == [PAD] * 7 + [99]
    assert re.search(message, str(error)), error


def test_a_planted_span_over_a_prefill_token_is_named_in_debug_mode() -> None:
    """Request 1's 3 drafts where 2 were laid out run over position 7, the first token
    of a row the scatter does not write (a prefill row: 99). Without the batch's rows
    declared only debug mode can tell (the map knows the scattered requests' starts
    only: docs/schema.md)."""
    batch, error = _chain_steps(True, [3, 3])
    assert isinstance(error, RelayError), error
    assert "PlantedChainFutureMap.drafts: the request in row 1 (slot 4)" in str(
        error
    ), error
    assert "position 7" in str(error) and "99" in str(error), error
    assert batch.input_ids.tolist() == [PAD] * 7 + [99]


@MODES
def test_a_planted_span_over_a_prefill_token_is_refused_with_rows_declared(
    debug: bool,
) -> None:
    """The same span, with ``Scatter(rows=BatchRows(...))``: refused in both modes,
    naming the map, the field, the request, its row and the fix, nothing written; the
    counts the batch laid out run clean."""
    batch, error = _chain_steps(debug, [3, 2], BOUNDED)
    assert error is None, error
    assert batch.input_ids.tolist() == [10, 11, 12, 13, 20, 21, 22, 99]
    batch, error = _chain_steps(debug, [3, 3], BOUNDED)
    assert isinstance(error, RelayError), error
    assert str(error).startswith(
        "PlantedChainFutureMap.drafts: the request in row 1 (slot 4) would lay its 3 "
        "value(s) at positions 5 to 7, outside its batch row 1 (positions 4 to 6 by "
        "batch.row_starts): position 7 is batch row 2's first, another request's. "
        "Lay out each request's row for the values it is handed"
    ), error
    assert batch.input_ids.tolist() == [PAD] * 7 + [99]


def test_a_planted_span_into_the_next_request_is_refused() -> None:
    """Debug off: request 0 with its 3 drafts laid at 0 runs into request 1 at 3."""
    cls = load_map_class(CHAIN)
    payload = importlib.import_module(cls.__module__).PlantedChainPayload
    relay = cls("cpu", 8)
    batch = Namespace(
        req_pool_indices=torch.tensor([2, 4]),
        starts=torch.tensor([0, 3]),
        counts=torch.tensor([3, 0]),
        input_ids=torch.full((8,), PAD),
    )
    stash = payload(
        tok=torch.tensor([10, 20]),
        drafts=torch.tensor([[11, 12, 13], [21, 22, 23]]),
        counts=torch.tensor([3, 3]),
    )
    with thread_streams("forward") as (forward,):
        error = _forward(
            forward,
            lambda: relay.stash(torch.tensor([2, 4]), stash),
            lambda: relay.resolve_future(batch),
        )
    assert isinstance(error, RelayError), error
    assert "row 1 (slot 4) starts at 3, inside the 4 position(s)" in str(error)
    assert batch.input_ids.tolist() == [PAD] * 8


TAILS = Schema(
    name="PlantedTailsFutureMap",
    fields=[
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(mirror="seq_lens_cpu"),
            guard=Guard.NON_NEGATIVE,
            tails=Tails(
                rows="mix_running_indices",
                kv=TailsKv(locations="out_cache_loc", table="req_to_token"),
                add=0,
            ),
        )
    ],
)


def _tails_steps(debug: bool, published: list[int]) -> tuple[Namespace, Any]:
    """Step N publishes two requests' lengths; step N+1, a mixed batch, binds them."""
    relay = load_map_class(TAILS)("cpu", 8, debug=debug)
    batch = Namespace(
        req_pool_indices=torch.tensor([2, 5]),
        mix_running_indices=torch.tensor([2, 5]),
        seq_lens=torch.tensor([9, 9, 9]),
        seq_lens_cpu=torch.tensor([9, 9, 9]),
        out_cache_loc=torch.tensor([-3, -3, -3]),
        req_to_token=torch.arange(8 * 10).reshape(8, 10),
    )
    before = dict(vars(batch))
    with thread_streams("forward") as (forward,):
        error = _forward(
            forward,
            lambda: relay.publish(torch.tensor([2, 5]), torch.tensor(published)),
            lambda: relay.resolve_tails(batch),
        )
    return batch, (error, before)


@MODES
def test_the_tails_driver_runs_clean(debug: bool) -> None:
    batch, (error, _) = _tails_steps(debug, [4, 1])
    assert error is None, error
    assert batch.out_cache_loc.tolist() == [-3, 23, 50]


@MODES
def test_a_planted_length_of_zero_is_refused_before_column_minus_one(
    debug: bool,
) -> None:
    """A driver publishing a fresh request's length before its token (0, which
    ``Guard.NON_NEGATIVE`` allows) would read ``req_to_token[slot, -1]``."""
    batch, (error, before) = _tails_steps(debug, [4, 0])
    assert isinstance(error, RelayError), error
    message = str(error)
    assert message.startswith("PlantedTailsFutureMap.new_seq_lens: batch.req_to_token")
    assert "decode row 1 (slot 5) would read column -1" in message
    assert vars(batch) == before
