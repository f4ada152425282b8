"""Seeds ordered by construction (Note [Seeds] in relay/runtime.py): a seed is written by
the first forward launched after it, never by one launched before it and not started
yet, whichever thread seeds. Each race is built on relay's CPU stream with a gated
task, no timing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from relay_runtime_support import GUARD_S, thread_streams

from relay.cpu_stream import Gate, ThreadStream
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.testing import Namespace

POOL = 6
SLOT = 2


def tokens(*values: int) -> DecodePayload:
    """A decode payload of the given tokens."""
    return DecodePayload(next_token_ids=torch.tensor(values))


def forward(relay: DecodeFutureMap, reads: list[int], stash: int | None) -> None:
    """One decode step of the request in ``SLOT``: read its input, stash its output."""
    batch = Namespace(req_pool_indices=torch.tensor([SLOT]))
    relay.resolve_future(batch)
    reads.append(int(batch.input_ids[0]))
    if stash is not None:
        relay.stash(torch.tensor([SLOT]), tokens(stash))


def launch(stream: ThreadStream, gate: Gate, fn: Callable[[], None]) -> None:
    """Queue ``fn`` on ``stream`` behind ``gate``: launched, not started."""

    def task() -> None:
        assert gate.wait(GUARD_S), "test gate never opened"
        fn()

    stream.submit(task)


@pytest.mark.parametrize("debug", [False, True], ids=["debug off", "debug on"])
def test_a_seed_skips_the_forward_launched_before_it(debug: bool) -> None:
    """The slot's previous request's last forward is launched but not started when the
    scheduler seeds the slot for a new request: that forward reads its own token and
    its stash does not replace the seed; the next forward reads the seed."""
    relay = DecodeFutureMap("cpu", POOL, debug=debug)
    relay.stash(torch.tensor([SLOT]), tokens(7))  # the old request's pending token
    reads: list[int] = []
    with thread_streams("forward") as (stream,):
        gate = Gate()
        launch(stream, gate, lambda: forward(relay, reads, stash=8))  # old request
        relay.seed(torch.tensor([SLOT]), tokens(100))  # new request, on the host
        gate.set()

        def new_request() -> None:
            relay.release(torch.tensor([SLOT]))  # in stream order, as engines do
            forward(relay, reads, stash=None)

        stream.submit(new_request)
        stream.synchronize()
    assert reads == [7, 100]


def test_a_seed_from_another_stream_skips_the_forward_launched_before_it() -> None:
    """The same race with the seed made by a task on a second stream that runs while
    the forward launched before it waits: ordered by launch, not by which runs first."""
    relay = DecodeFutureMap("cpu", POOL)
    relay.stash(torch.tensor([SLOT]), tokens(7))
    reads: list[int] = []
    with thread_streams("forward", "transfer") as (stream, transfer):
        gate = Gate()
        launch(stream, gate, lambda: forward(relay, reads, stash=8))
        transfer.submit(lambda: relay.seed(torch.tensor([SLOT]), tokens(100)))
        transfer.synchronize()  # the seed is queued; the forward has not started
        gate.set()
        stream.submit(lambda: forward(relay, reads, stash=None))
        stream.synchronize()
    assert reads == [7, 100]


def test_a_seed_made_in_a_forward_task_is_read_by_the_next_one() -> None:
    """relay's own engine seeds on the forward stream: a task that seeds, then the next
    forward task, which reads the seed (the seed's place is its task's launch)."""
    relay = DecodeFutureMap("cpu", POOL)
    reads: list[int] = []
    with thread_streams("forward") as (stream,):
        gate = Gate()
        launch(stream, gate, lambda: relay.seed(torch.tensor([SLOT]), tokens(5)))
        stream.submit(lambda: forward(relay, reads, stash=None))
        gate.set()
        stream.synchronize()
    assert reads == [5]


def test_seeds_on_the_host_apply_in_host_order() -> None:
    """With no stream, a resolve writes every seed made before it, the newest of one
    slot last; a seed made after it waits for the next resolve."""
    relay = DecodeFutureMap("cpu", POOL)
    relay.seed(torch.tensor([SLOT]), tokens(3))
    relay.seed(torch.tensor([SLOT]), tokens(4))
    reads: list[int] = []
    forward(relay, reads, stash=None)
    relay.seed(torch.tensor([SLOT]), tokens(9))
    assert relay.output_tokens_buf[SLOT].item() == 4 and relay._state.seeds
    forward(relay, reads, stash=None)
    assert reads == [4, 9]
