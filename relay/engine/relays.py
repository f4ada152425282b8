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

from typing import TYPE_CHECKING, Any, Protocol

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
    from relay.maps.ngram import NgramFutureMap

    AnyMap = DecodeFutureMap | DecodeSeqLensFutureMap | EagleFutureMap | NgramFutureMap

# Note [Tracing the fence wait]
# The fence wait is inside the generated resolve_seq_lens_cpu, and ranges never go
# inside generated code (Note [Ranges that cost nothing when off] in
# relay/engine/trace.py), nor does the engine reach into a map's private fence. So
# a traced run's fence-wait range wraps the whole schedule-side resolve, whose time
# is the wait but for one gather and a host copy of a few rows.

# Note [Seeding a prebuilt request]
# A prebuilt request's row is seeded (its first token, and in speculative decoding
# its draft state and length) while a forward may still be in flight on that row for
# the slot's previous owner (a finished request's extra step, a retracted request's
# step). ``seed`` below hands the rows to the map's generated ``seed``, which queues
# them for its next ``resolve_future`` (on the forward stream, behind every launched
# forward: Note [Seeds] in relay/runtime.py); the engine calls it on the forward
# stream too, after releasing the slots freed since the last launch, so neither the
# release nor the lengths' publish lands out of order.

__all__ = ["DirectRelay", "DraftOutput", "Extras", "MapRelay", "Relay"]

#: topk_p, topk_index and hidden states of a draft extension.
DraftOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
#: What a step hands the next besides its tokens: EAGLE's ``DraftOutput``, or n-gram
#: speculation's accepted drafts (n, draft_token_num) and their counts (n,) int32.
Extras = tuple[torch.Tensor, ...]


class Relay(Protocol):
    """The hand-over between steps, as the scheduler and the forward see it."""

    # Scheduler side.
    def resolve_lengths(self, batch: ForwardBatch) -> None:
        """Set ``seq_lens``, ``seq_lens_cpu`` and ``seq_lens_sum`` of a decode batch."""

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        """Set what the forward reads that is known once a decode batch's rows are final."""

    def scheduled(self, batch: ForwardBatch) -> None:
        """``batch`` (any mode) is about to launch: host-side bookkeeping only."""

    def seeded(self, slots: list[int], seq_lens: list[int]) -> None:
        """Prebuilt requests took ``slots``, with these lengths: host bookkeeping only."""

    # Forward side.
    def resolve_future(self, batch: ForwardBatch) -> None:
        """At the start of a decode forward: fill the inputs the previous forward stashed."""

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """Hand the new lengths to the scheduler (mid-forward)."""

    def stash(
        self, slots: torch.Tensor, tokens: torch.Tensor, extras: Extras | None
    ) -> None:
        """Hand this step's tokens (and draft state) to the next forward."""

    def release(self, slots: torch.Tensor) -> None:
        """The requests of ``slots`` ended (debug maps catch a later stale read)."""

    def seed(
        self,
        slots: torch.Tensor,
        tokens: torch.Tensor,
        extras: Extras | None,
        seq_lens: torch.Tensor,
    ) -> None:
        """On the forward stream: seed prebuilt requests' rows (Note [Seeding a
        prebuilt request])."""


def _host_slots(batch: ForwardBatch) -> torch.Tensor:
    return torch.tensor([req.slot for req in batch.reqs], dtype=torch.int64)


class MapRelay:
    """The overlap hand-over, through a generated ``DecodeFutureMap``,
    ``DecodeSeqLensFutureMap``, ``EagleFutureMap`` or ``NgramFutureMap``."""

    def __init__(
        self,
        future_map: AnyMap,
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
        elif isinstance(
            self.map, (self.maps.decode_seq_lens, self.maps.eagle, self.maps.ngram)
        ):
            # Blocks until the newest forward has published (not until it has finished),
            # also on a CPU worker stream (Note [Host order of CPU records]).
            with (
                self.ranges(RESOLVE_SEQ_LENS, batch.step),
                self.ranges(FENCE_WAIT, batch.step),  # Note [Tracing the fence wait]
            ):
                self.map.resolve_seq_lens_cpu(batch)

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        pass  # every input is gathered by resolve_future on the forward stream

    def scheduled(self, batch: ForwardBatch) -> None:
        if self._next_lens_cpu is None:
            return
        # Plain decoding: each step adds one token (sglang's host ``seq_lens + 1``).
        for part in (batch, batch.chunk):
            if part is not None and part.reqs:
                self._next_lens_cpu[_host_slots(part)] = part.seq_lens_cpu + 1

    def seeded(self, slots: list[int], seq_lens: list[int]) -> None:
        if self._next_lens_cpu is not None:
            self._next_lens_cpu[torch.tensor(slots)] = torch.tensor(seq_lens)

    def resolve_future(self, batch: ForwardBatch) -> None:
        self.map.resolve_future(batch)

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        if isinstance(
            self.map, (self.maps.decode_seq_lens, self.maps.eagle, self.maps.ngram)
        ):
            self.map.publish(slots, new_seq_lens)

    def release(self, slots: torch.Tensor) -> None:
        self.map.release(slots)

    def seed(
        self,
        slots: torch.Tensor,
        tokens: torch.Tensor,
        extras: Extras | None,
        seq_lens: torch.Tensor,
    ) -> None:
        # Note [Seeding a prebuilt request]: the map's seed queues the rows for its
        # next resolve_future, on the forward stream; the lengths are published here.
        self.map.seed(slots, self._payload(tokens, extras))
        self.publish(slots, seq_lens)

    def stash(
        self, slots: torch.Tensor, tokens: torch.Tensor, extras: Extras | None
    ) -> None:
        self.map.stash(slots, self._payload(tokens, extras))

    def _payload(self, tokens: torch.Tensor, extras: Extras | None) -> Any:
        """The payload of the map's class for this step's tokens and extras."""
        if isinstance(self.map, self.maps.ngram):
            assert extras is not None, "n-gram speculation stashes accepted drafts"
            accept_tokens, accept_lens = extras
            return self.maps.ngram_payload(
                bonus_tokens=tokens,
                accept_tokens=accept_tokens,
                accept_lens=accept_lens,
            )
        if isinstance(self.map, self.maps.eagle):
            assert extras is not None, "speculative decoding stashes a draft"
            topk_p, topk_index, hidden = extras
            return self.maps.eagle_payload(
                bonus_tokens=tokens,
                topk_p=topk_p,
                topk_index=topk_index,
                hidden_states=hidden,
            )
        if isinstance(self.map, self.maps.decode_seq_lens):
            return self.maps.decode_seq_lens_payload(next_token_ids=tokens)
        assert isinstance(self.map, self.maps.decode), type(self.map)
        return self.maps.decode_payload(next_token_ids=tokens)


class DirectRelay:
    """The synchronous hand-over: per-slot tensors read after the previous step finished.

    ``mode`` names what the extras are: ``decode`` (none), ``eagle`` or ``ngram``.
    """

    def __init__(
        self,
        pool_size: int,
        device: torch.device,
        ranges: Ranges = no_ranges,
        mode: str = "decode",
    ) -> None:
        self.ranges = ranges
        self.mode = mode
        self.tokens = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(pool_size, dtype=torch.int64, device=device)
        #: Per-slot rows of the extras, allocated on the first stash.
        self.extras: Extras | None = None
        self.pool_size = pool_size

    def resolve_lengths(self, batch: ForwardBatch) -> None:
        with self.ranges(HOST_SEQ_LENS, batch.step):
            batch.seq_lens = self.seq_lens[batch.req_pool_indices]
            batch.seq_lens_cpu = batch.seq_lens.cpu()
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        slots = batch.req_pool_indices
        batch.input_ids = self.tokens[slots]
        if self.extras is None:
            return
        info = batch.spec_info
        info.bonus_tokens = batch.input_ids
        rows = tuple(store[slots] for store in self.extras)
        if self.mode == "ngram":
            info.accept_tokens, info.accept_lens = rows
        else:
            info.topk_p, info.topk_index, info.hidden_states = rows

    def scheduled(self, batch: ForwardBatch) -> None:
        pass  # lengths come from the finished step's publish

    def seeded(self, slots: list[int], seq_lens: list[int]) -> None:
        pass  # the seed's publish sets them

    def resolve_future(self, batch: ForwardBatch) -> None:
        pass  # inputs are real values already

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        self.seq_lens[slots] = new_seq_lens

    def release(self, slots: torch.Tensor) -> None:
        pass  # plain tensors: nothing tracks a slot's owner

    def seed(
        self,
        slots: torch.Tensor,
        tokens: torch.Tensor,
        extras: Extras | None,
        seq_lens: torch.Tensor,
    ) -> None:
        self.stash(slots, tokens, extras)
        self.publish(slots, seq_lens)

    def stash(
        self, slots: torch.Tensor, tokens: torch.Tensor, extras: Extras | None
    ) -> None:
        if slots.numel() == 0:
            return
        self.tokens[slots] = tokens
        if extras is not None:
            if self.extras is None:
                self.extras = tuple(_rows_like(e, self.pool_size) for e in extras)
            for store, value in zip(self.extras, extras):
                store[slots] = value


def _rows_like(value: torch.Tensor, pool_size: int) -> torch.Tensor:
    """A per-slot store for rows shaped like ``value``'s."""
    return torch.zeros(
        (pool_size, *value.shape[1:]), dtype=value.dtype, device=value.device
    )
