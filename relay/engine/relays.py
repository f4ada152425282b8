"""How step N's outputs reach step N+1: through a generated map, or directly.

``MapRelay`` is the overlap path: the scheduler writes placeholders and resolves
lengths behind the map's fence; the forward resolves the placeholders on its own
stream. ``DirectRelay`` is the synchronous baseline: the previous step has
finished, so the scheduler reads its outputs from plain per-slot tensors. The
synchronous run checks the overlap run, so the two share no hand-over code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from relay.engine.batch import ForwardBatch

if TYPE_CHECKING:  # the classes come from the run's Maps (Note [One set of map classes per run])
    from relay.engine.maps import Maps
    from relay.maps.decode import DecodeFutureMap
    from relay.maps.eagle import EagleFutureMap

__all__ = ["DirectRelay", "DraftOutput", "MapRelay", "Relay"]

#: topk_p, topk_index and hidden states of a draft extension.
DraftOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Relay(Protocol):
    """The hand-over between steps, as the scheduler and the forward see it."""

    # Scheduler side, for a decode batch.
    def resolve_lengths(self, batch: ForwardBatch) -> None:
        """Set ``seq_lens``, ``seq_lens_cpu`` and ``seq_lens_sum`` of the batch."""

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        """Set ``input_ids`` (values or placeholders) once the rows are final."""

    # Forward side.
    def resolve_future(self, batch: ForwardBatch) -> None:
        """At the start of a decode forward: fill what ``prepare_inputs`` left pending."""

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """Hand the new lengths to the scheduler (mid-forward)."""

    def stash(self, slots: torch.Tensor, tokens: torch.Tensor, draft: DraftOutput | None) -> None:
        """Hand this step's tokens (and draft state) to the next forward."""

    def release(self, slots: torch.Tensor) -> None:
        """The requests of ``slots`` ended (debug maps catch a later stale read)."""


class MapRelay:
    """The overlap hand-over, through a generated ``DecodeFutureMap`` or ``EagleFutureMap``."""

    def __init__(self, future_map: DecodeFutureMap | EagleFutureMap, maps: Maps) -> None:
        self.map = future_map
        self.maps = maps  # future_map's class and its payload classes, generated together

    def resolve_lengths(self, batch: ForwardBatch) -> None:
        # Blocks until the newest forward has published (not until it has finished),
        # also on a CPU worker stream (Note [Host order of CPU records]).
        self.map.resolve_seq_lens_cpu(batch)

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        self.map.invalidate(batch, batch.req_pool_indices)

    def resolve_future(self, batch: ForwardBatch) -> None:
        self.map.resolve_future(batch)

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        self.map.publish(slots, new_seq_lens)

    def release(self, slots: torch.Tensor) -> None:
        self.map.release(slots)

    def stash(self, slots: torch.Tensor, tokens: torch.Tensor, draft: DraftOutput | None) -> None:
        if isinstance(self.map, self.maps.eagle):
            assert draft is not None, "speculative decoding stashes a draft"
            topk_p, topk_index, hidden = draft
            self.map.stash(
                slots,
                self.maps.eagle_payload(
                    bonus_tokens=tokens, topk_p=topk_p, topk_index=topk_index, hidden_states=hidden
                ),
            )
        else:
            assert isinstance(self.map, self.maps.decode), type(self.map)
            self.map.stash(slots, self.maps.decode_payload(next_token_ids=tokens))


class DirectRelay:
    """The synchronous hand-over: per-slot tensors read after the previous step finished."""

    def __init__(self, pool_size: int, device: torch.device) -> None:
        self.tokens = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self.draft: DraftOutput | None = None  # per-slot rows, allocated on the first stash
        self.pool_size = pool_size

    def resolve_lengths(self, batch: ForwardBatch) -> None:
        batch.seq_lens = self.seq_lens[batch.req_pool_indices]
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def prepare_inputs(self, batch: ForwardBatch) -> None:
        slots = batch.req_pool_indices
        batch.input_ids = self.tokens[slots]
        if self.draft is not None:
            topk_p, topk_index, hidden = self.draft
            batch.spec_info.topk_p = topk_p[slots]
            batch.spec_info.topk_index = topk_index[slots]
            batch.spec_info.hidden_states = hidden[slots]

    def resolve_future(self, batch: ForwardBatch) -> None:
        pass  # inputs are real values already

    def publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        self.seq_lens[slots] = new_seq_lens

    def release(self, slots: torch.Tensor) -> None:
        pass  # plain tensors: nothing tracks a slot's owner

    def stash(self, slots: torch.Tensor, tokens: torch.Tensor, draft: DraftOutput | None) -> None:
        if slots.numel() == 0:
            return
        self.tokens[slots] = tokens
        if draft is not None:
            if self.draft is None:
                self.draft = (_rows_like(draft[0], self.pool_size),
                              _rows_like(draft[1], self.pool_size),
                              _rows_like(draft[2], self.pool_size))
            for store, value in zip(self.draft, draft):
                store[slots] = value


def _rows_like(value: torch.Tensor, pool_size: int) -> torch.Tensor:
    """A per-slot store for rows shaped like ``value``'s."""
    return torch.zeros((pool_size, *value.shape[1:]), dtype=value.dtype, device=value.device)
