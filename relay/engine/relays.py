"""How step N's outputs reach step N+1: through a generated map, or directly.

``MapRelay`` is the overlap path: the forward gathers the previous forward's stash
on its own stream (``resolve_future``); in speculative decoding the scheduler
resolves the lengths behind the map's fence, in plain decoding it computes them on
the host (every request grows by one token per step). ``DirectRelay`` is the
synchronous baseline: the previous step has finished, so the scheduler reads its
outputs from plain per-slot tensors. The synchronous run checks the overlap run, so
the two share no hand-over code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from relay.engine.batch import ForwardBatch
from relay.engine.trace import (
    FENCE_WAIT,
    HOST_SEQ_LENS,
    RESOLVE_SEQ_LENS,
    Ranges,
    no_ranges,
)

if (
    TYPE_CHECKING
):  # the classes come from the run's Maps (Note [One set of map classes per run])
    from relay.engine.maps import Maps
    from relay.maps.decode import DecodeFutureMap
    from relay.maps.decode_seq_lens import DecodeSeqLensFutureMap
    from relay.maps.eagle import EagleFutureMap

# Note [Tracing the fence wait]
# The fence wait is inside the generated resolve_seq_lens_cpu, and ranges never go
# inside generated code (Note [Ranges that cost nothing when off] in
# relay/engine/trace.py). So a traced run waits on the map's fence itself first, in
# a range of its own; the map's own wait then finds the newest publish complete and
# returns at once. Only traced runs do this: with tracing off the map waits alone.

__all__ = ["DirectRelay", "DraftOutput", "MapRelay", "Relay"]

#: topk_p, topk_index and hidden states of a draft extension.
DraftOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Relay(Protocol):
    """The hand-over between steps, as the scheduler and the forward see it."""

    # Scheduler side.
    def resolve_lengths(self, batch: ForwardBatch) -> None:
        """Set ``seq_lens``, ``seq_lens_cpu`` and ``seq_lens_sum`` of a decode batch."""

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        """Set what the forward reads that is known once a decode batch's rows are final."""

    def scheduled(self, batch: ForwardBatch) -> None:
        """``batch`` (any mode) is about to launch: host-side bookkeeping only."""

    # Forward side.
    def resolve_future(self, batch: ForwardBatch) -> None:
        """At the start of a decode forward: fill the inputs the previous forward stashed."""

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """Hand the new lengths to the scheduler (mid-forward)."""

    def stash(
        self, slots: torch.Tensor, tokens: torch.Tensor, draft: DraftOutput | None
    ) -> None:
        """Hand this step's tokens (and draft state) to the next forward."""

    def release(self, slots: torch.Tensor) -> None:
        """The requests of ``slots`` ended (debug maps catch a later stale read)."""


def _host_slots(batch: ForwardBatch) -> torch.Tensor:
    return torch.tensor([req.slot for req in batch.reqs], dtype=torch.int64)


class MapRelay:
    """The overlap hand-over, through a generated ``DecodeFutureMap``,
    ``DecodeSeqLensFutureMap`` or ``EagleFutureMap``."""

    def __init__(
        self,
        future_map: DecodeFutureMap | DecodeSeqLensFutureMap | EagleFutureMap,
        maps: Maps,
        ranges: Ranges = no_ranges,
    ) -> None:
        self.map = future_map
        # future_map's class and its payload classes, generated together.
        self.maps = maps
        self.ranges = ranges
        # DecodeFutureMap relays tokens only: the host keeps each slot's next length.
        self._next_lens_cpu = (
            torch.zeros(future_map.pool_size, dtype=torch.int64)
            if isinstance(future_map, maps.decode)
            else None
        )

    def resolve_lengths(self, batch: ForwardBatch) -> None:
        if self._next_lens_cpu is not None:
            with self.ranges(HOST_SEQ_LENS, batch.step):
                lens = self._next_lens_cpu[_host_slots(batch)]
                batch.seq_lens_cpu = lens
                batch.seq_lens = lens.to(batch.req_pool_indices.device)
                batch.seq_lens_sum = int(lens.sum())
        elif isinstance(self.map, (self.maps.decode_seq_lens, self.maps.eagle)):
            # Blocks until the newest forward has published (not until it has finished),
            # also on a CPU worker stream (Note [Host order of CPU records]).
            with self.ranges(RESOLVE_SEQ_LENS, batch.step):
                if self.ranges is not no_ranges:
                    # Note [Tracing the fence wait]
                    with self.ranges(FENCE_WAIT, batch.step):
                        self.map._fence.wait()
                self.map.resolve_seq_lens_cpu(batch)

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        pass  # every input is gathered by resolve_future on the forward stream

    def scheduled(self, batch: ForwardBatch) -> None:
        if self._next_lens_cpu is not None and batch.reqs:
            # Plain decoding: each step adds one token (sglang's host ``seq_lens + 1``).
            self._next_lens_cpu[_host_slots(batch)] = batch.seq_lens_cpu + 1

    def resolve_future(self, batch: ForwardBatch) -> None:
        self.map.resolve_future(batch)

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        if isinstance(self.map, (self.maps.decode_seq_lens, self.maps.eagle)):
            self.map.publish(slots, new_seq_lens)

    def release(self, slots: torch.Tensor) -> None:
        self.map.release(slots)

    def stash(
        self, slots: torch.Tensor, tokens: torch.Tensor, draft: DraftOutput | None
    ) -> None:
        if isinstance(self.map, self.maps.eagle):
            assert draft is not None, "speculative decoding stashes a draft"
            topk_p, topk_index, hidden = draft
            self.map.stash(
                slots,
                self.maps.eagle_payload(
                    bonus_tokens=tokens,
                    topk_p=topk_p,
                    topk_index=topk_index,
                    hidden_states=hidden,
                ),
            )
        elif isinstance(self.map, self.maps.decode_seq_lens):
            self.map.stash(
                slots, self.maps.decode_seq_lens_payload(next_token_ids=tokens)
            )
        else:
            assert isinstance(self.map, self.maps.decode), type(self.map)
            self.map.stash(slots, self.maps.decode_payload(next_token_ids=tokens))


class DirectRelay:
    """The synchronous hand-over: per-slot tensors read after the previous step finished."""

    def __init__(
        self, pool_size: int, device: torch.device, ranges: Ranges = no_ranges
    ) -> None:
        self.ranges = ranges
        self.tokens = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self.draft: DraftOutput | None = (
            None  # per-slot rows, allocated on the first stash
        )
        self.pool_size = pool_size

    def resolve_lengths(self, batch: ForwardBatch) -> None:
        with self.ranges(HOST_SEQ_LENS, batch.step):
            batch.seq_lens = self.seq_lens[batch.req_pool_indices]
            batch.seq_lens_cpu = batch.seq_lens.cpu()
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        slots = batch.req_pool_indices
        batch.input_ids = self.tokens[slots]
        if self.draft is not None:
            batch.spec_info.bonus_tokens = batch.input_ids
            topk_p, topk_index, hidden = self.draft
            batch.spec_info.topk_p = topk_p[slots]
            batch.spec_info.topk_index = topk_index[slots]
            batch.spec_info.hidden_states = hidden[slots]

    def scheduled(self, batch: ForwardBatch) -> None:
        pass  # lengths come from the finished step's publish

    def resolve_future(self, batch: ForwardBatch) -> None:
        pass  # inputs are real values already

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        self.seq_lens[slots] = new_seq_lens

    def release(self, slots: torch.Tensor) -> None:
        pass  # plain tensors: nothing tracks a slot's owner

    def stash(
        self, slots: torch.Tensor, tokens: torch.Tensor, draft: DraftOutput | None
    ) -> None:
        if slots.numel() == 0:
            return
        self.tokens[slots] = tokens
        if draft is not None:
            if self.draft is None:
                self.draft = (
                    _rows_like(draft[0], self.pool_size),
                    _rows_like(draft[1], self.pool_size),
                    _rows_like(draft[2], self.pool_size),
                )
            for store, value in zip(self.draft, draft):
                store[slots] = value


def _rows_like(value: torch.Tensor, pool_size: int) -> torch.Tensor:
    """A per-slot store for rows shaped like ``value``'s."""
    return torch.zeros(
        (pool_size, *value.shape[1:]), dtype=value.dtype, device=value.device
    )
