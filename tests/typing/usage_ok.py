"""Typed use of the generated maps from an engine's own batch types: must pass ``mypy --strict``.

Checked by ``tests/typing/test_typing.py``; never imported by pytest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from relay.maps.decode import DecodeBatch, DecodeFutureMap, DecodePayload
from relay.maps.decode_seq_lens import (
    DecodeSeqLensBatch,
    DecodeSeqLensFutureMap,
    DecodeSeqLensPayload,
)
from relay.maps.eagle import EagleBatch, EagleFutureMap, EaglePayload
from relay.maps.eagle_confidence import EagleConfidenceFutureMap, EagleConfidencePayload
from relay.maps.eagle_dsa import EagleDsaFutureMap, EagleDsaPayload
from relay.maps.eagle_multilayer import EagleMultiLayerFutureMap, EagleMultiLayerPayload
from relay.maps.sglang_decode import SglangDecodeFutureMap, SglangDecodePayload
from relay.maps.sglang_eagle import SglangEagleFutureMap
from relay.maps.vllm_drafts import (
    VllmDraftsBatch,
    VllmDraftsFutureMap,
    VllmDraftsPayload,
    VllmDraftsScheduleBatch,
)


def _empty() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


@dataclass
class SpecInfo:
    """The engine's own speculative-decoding state: the attributes the EAGLE maps touch."""

    bonus_tokens: torch.Tensor = field(default_factory=_empty)
    topk_p: torch.Tensor = field(default_factory=_empty)
    topk_index: torch.Tensor = field(default_factory=_empty)
    hidden_states: torch.Tensor | None = None
    dsa_topk_indices: torch.Tensor | None = None
    draft_confidence: torch.Tensor = field(default_factory=_empty)


@dataclass
class ScheduleBatch:
    """The engine's own batch: no inheritance from relay, matched structurally."""

    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor = field(default_factory=_empty)
    seq_lens: torch.Tensor = field(default_factory=_empty)
    seq_lens_cpu: torch.Tensor = field(default_factory=_empty)
    seq_lens_sum: int = 0
    draft_confidence_cpu: torch.Tensor = field(default_factory=_empty)
    spec_info: SpecInfo = field(default_factory=SpecInfo)


class FrozenIndicesBatch:
    """A batch whose slots are a read-only property: the maps only read them."""

    def __init__(self, indices: torch.Tensor) -> None:
        self._indices = indices
        self.input_ids = _empty()
        self.seq_lens = _empty()
        self.seq_lens_cpu = _empty()
        self.seq_lens_sum = 0

    @property
    def req_pool_indices(self) -> torch.Tensor:
        return self._indices


def decode_step(
    relay: DecodeFutureMap, batch: ScheduleBatch, tokens: torch.Tensor
) -> None:
    indices = batch.req_pool_indices
    relay.resolve_future(batch)
    relay.stash(indices, DecodePayload(next_token_ids=tokens))
    relay.release(indices)


def decode_seq_lens_step(
    relay: DecodeSeqLensFutureMap, batch: ScheduleBatch, tokens: torch.Tensor
) -> int:
    indices = batch.req_pool_indices
    relay.resolve_future(batch)
    relay.stash(indices, DecodeSeqLensPayload(next_token_ids=tokens))
    relay.publish(indices, tokens + 1)
    relay.publish(indices, new_seq_lens=tokens + 1)
    relay.resolve_seq_lens_cpu(batch)
    relay.release(indices)
    return batch.seq_lens_sum


def eagle_step(relay: EagleFutureMap, batch: ScheduleBatch) -> torch.Tensor | None:
    indices = batch.req_pool_indices
    n = int(indices.numel())
    payload = EaglePayload(
        bonus_tokens=torch.zeros(n, dtype=torch.int64),
        topk_p=torch.rand(n, 4),
        topk_index=torch.zeros(n, 4, dtype=torch.int64),
    )
    with_hidden = EaglePayload(
        bonus_tokens=payload.bonus_tokens,
        topk_p=payload.topk_p,
        topk_index=payload.topk_index,
        hidden_states=torch.zeros(n, 8, dtype=torch.bfloat16),
    )
    relay.stash(indices, payload)
    relay.stash(indices, with_hidden)
    relay.resolve_future(batch)
    relay.publish(indices, torch.ones(n, dtype=torch.int64))
    relay.resolve_seq_lens_cpu(batch)
    hidden: torch.Tensor | None = relay.hidden_states_buf
    if hidden is not None:
        _rows: int = hidden.shape[0]
    topk: torch.Tensor = relay.topk_p_buf
    del topk
    return batch.spec_info.hidden_states


def protocols(batch: ScheduleBatch, frozen: FrozenIndicesBatch) -> None:
    decode_batch: DecodeBatch = batch
    seq_lens_batch: DecodeSeqLensBatch = batch
    eagle_batch: EagleBatch = batch
    read_only: DecodeSeqLensBatch = frozen
    del decode_batch, seq_lens_batch, eagle_batch, read_only


def other_maps(batch: ScheduleBatch) -> float:
    indices = batch.req_pool_indices
    n = int(indices.numel())
    confidence = EagleConfidenceFutureMap("cpu", 9, topk=1, draft_tokens=3, debug=True)
    confidence.stash(
        indices,
        EagleConfidencePayload(
            bonus_tokens=torch.zeros(n),
            topk_p=torch.rand(n, 1),
            topk_index=torch.zeros(n, 1),
        ),
    )
    confidence.publish(indices, torch.ones(n), torch.rand(n, 3))
    confidence.resolve_seq_lens_cpu(batch)
    confidence.resolve_draft_confidence_cpu(batch)

    dsa = EagleDsaFutureMap(torch.device("cpu"), 9, topk=1)
    dsa.stash(
        indices,
        EagleDsaPayload(
            bonus_tokens=torch.zeros(n),
            topk_p=torch.rand(n, 1),
            topk_index=torch.zeros(n, 1),
            dsa_topk_indices=torch.zeros(n, 2, dtype=torch.int32),
        ),
    )
    dsa.resolve_future(batch)

    multilayer = EagleMultiLayerFutureMap("cpu", 9, topk=1)
    multilayer.stash(
        indices,
        EagleMultiLayerPayload(
            bonus_tokens=torch.zeros(n),
            topk_p=torch.rand(n, 1),
            topk_index=torch.zeros(n, 1),
        ),
    )
    multilayer.resolve_future(batch)
    return float(batch.draft_confidence_cpu.sum())


@dataclass
class VllmBatch:
    """vLLM's decode rows: slots in row order, request ids, offsets and draft counts."""

    slots: torch.Tensor
    req_ids: list[str]
    query_starts: torch.Tensor
    num_draft_tokens: torch.Tensor
    input_ids: torch.Tensor


def counted_scatter(
    batch: VllmBatch, sampled: torch.Tensor, drafts: torch.Tensor
) -> None:
    relay = VllmDraftsFutureMap("cpu", 9, num_speculative_tokens=3)
    payload = VllmDraftsPayload(
        sampled_token_ids=sampled,
        draft_token_ids=drafts,
        num_draft_tokens=batch.num_draft_tokens,
    )
    relay.stash(batch.slots, payload, owners=batch.req_ids)
    relay.publish(batch.slots, batch.num_draft_tokens, owners=batch.req_ids)
    relay.resolve_future(batch)
    fits: VllmDraftsBatch = batch
    del fits


@dataclass
class DraftLookup:
    """The scheduler's own object: only what the schedule lane's resolve touches."""

    slots: torch.Tensor
    req_ids: list[str]
    drafts_made: torch.Tensor = field(default_factory=_empty)
    drafts_made_cpu: torch.Tensor = field(default_factory=_empty)


def scheduler_lookup(relay: VllmDraftsFutureMap, lookup: DraftLookup) -> list[int]:
    relay.resolve_drafts_made_cpu(lookup)
    fits: VllmDraftsScheduleBatch = lookup
    del fits
    counts: list[int] = lookup.drafts_made_cpu.tolist()
    return counts


@dataclass
class StagedDraftInput:
    """An engine's own draft input, as sglang's: optional slots and the indices flag."""

    future_indices: torch.Tensor | None = None
    future_dsa_topk_indices_available: bool = False


def staged(slots: torch.Tensor) -> StagedDraftInput:
    relay = SglangEagleFutureMap("cpu", 9, need_topk=False, need_hidden_states=False)
    handle = StagedDraftInput()
    relay.make_staged_spec_input(slots, handle)
    return handle


class BeamTailEntry(NamedTuple):
    """sglang's entry of a beam group's member rows in a decode batch's tail."""

    group: object
    leader_idx: int
    start: int
    end: int


@dataclass
class BeamTail:
    """sglang's ``BeamTail``: read as the map's ``_rt.MemberTail`` as it is."""

    num_base_rows: int
    entries: list[BeamTailEntry]


@dataclass
class Req:
    rid: str


@dataclass
class BeamBatch:
    """An sglang-like decode batch: its requests, then its beam members' slots."""

    req_pool_indices: torch.Tensor
    reqs: list[Req]
    beam_tail: BeamTail | None = None
    input_ids: torch.Tensor = field(default_factory=_empty)


def beam_step(batch: BeamBatch, tokens: torch.Tensor) -> torch.Tensor:
    relay = SglangDecodeFutureMap("cpu", 9, debug=True)
    relay.stash(batch.req_pool_indices, SglangDecodePayload(bonus_tokens=tokens))
    relay.resolve_future(batch)
    return batch.input_ids
