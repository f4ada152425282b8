"""Misuse of the generated maps: each bad line carries ``# E: <mypy error code>``.

Checked by ``tests/typing/test_typing.py``: mypy must report exactly the marked
(line, code) pairs. Never imported by pytest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.decode_seq_lens import DecodeSeqLensFutureMap
from relay.maps.eagle import EagleFutureMap, EaglePayload
from relay.maps.eagle_confidence import EagleConfidenceFutureMap
from relay.maps.sglang_eagle import SglangEagleFutureMap
from relay.maps.vllm_drafts import VllmDraftsFutureMap, VllmDraftsPayload


@dataclass
class SpecInfo:
    bonus_tokens: torch.Tensor
    topk_p: torch.Tensor
    topk_index: torch.Tensor
    hidden_states: torch.Tensor | None


@dataclass
class Batch:
    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    spec_info: SpecInfo


@dataclass
class NoHostMirrorBatch:
    """Lacks ``seq_lens_cpu``, which ``resolve_seq_lens_cpu`` writes."""

    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_sum: int


@dataclass
class FloatSumBatch:
    """``seq_lens_sum`` has the wrong type: the map writes an int."""

    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: str


@dataclass
class StrictHiddenSpecInfo:
    """``hidden_states`` may not be None here, but the map's attribute may be."""

    bonus_tokens: torch.Tensor
    topk_p: torch.Tensor
    topk_index: torch.Tensor
    hidden_states: torch.Tensor


@dataclass
class StrictHiddenBatch:
    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    spec_info: StrictHiddenSpecInfo


def misuse(batch: Batch, tokens: torch.Tensor) -> None:
    decode = DecodeFutureMap("cpu", 9)
    seq_lens = DecodeSeqLensFutureMap("cpu", 9)
    eagle = EagleFutureMap("cpu", 9, topk=4)
    EagleFutureMap("cpu", 9)  # E: call-arg
    EagleFutureMap("cpu", 9, topk="4")  # E: arg-type
    EagleConfidenceFutureMap("cpu", 9, topk=4)  # E: call-arg

    DecodePayload(next_tokens_ids=tokens)  # E: call-arg
    EaglePayload(bonus_tokens=tokens, topk_p=tokens)  # E: call-arg
    EaglePayload(bonus_tokens=tokens, topk_p=tokens, topk_index=tokens, hidden=tokens)  # E: call-arg
    EaglePayload(bonus_tokens=[1, 2], topk_p=tokens, topk_index=tokens)  # E: arg-type

    payload = EaglePayload(bonus_tokens=tokens, topk_p=tokens, topk_index=tokens)
    payload.topk_p = tokens  # E: misc
    eagle.stash(batch.req_pool_indices, DecodePayload(next_token_ids=tokens))  # E: arg-type
    decode.stash([1, 2], DecodePayload(next_token_ids=tokens))  # E: arg-type
    seq_lens.publish(batch.req_pool_indices, new_seq_len=tokens)  # E: call-arg
    seq_lens.publish(batch.req_pool_indices, 5)  # E: arg-type
    decode.publish(batch.req_pool_indices, tokens)  # E: attr-defined
    decode.invalidate(batch, batch.req_pool_indices)  # E: attr-defined

    seq_lens.resolve_seq_lens_cpu(NoHostMirrorBatch(tokens, tokens, tokens, 0))  # E: arg-type
    seq_lens.resolve_seq_lens_cpu(FloatSumBatch(tokens, tokens, tokens, tokens, ""))  # E: arg-type
    eagle.resolve_future(StrictHiddenBatch(tokens, tokens, tokens, tokens, 0, StrictHiddenSpecInfo(tokens, tokens, tokens, tokens)))  # E: arg-type
    eagle.resolve_future(decode)  # E: arg-type

    hidden_rows: int = eagle.hidden_states_buf.shape[0]  # E: union-attr
    eagle.resolve_seq_lens(batch)  # E: attr-defined
    total: str = batch.seq_lens_sum  # E: assignment
    del hidden_rows, total


@dataclass
class UncountedBatch:
    """Lacks ``num_draft_tokens``, the consumer's counts a counted scatter reads."""

    slots: torch.Tensor
    req_ids: list[str]
    query_starts: torch.Tensor
    input_ids: torch.Tensor


@dataclass
class LookupWithoutIds:
    """A scheduler-side object lacking ``req_ids``, the schedule lane's owners."""

    slots: torch.Tensor
    drafts_made: torch.Tensor
    drafts_made_cpu: torch.Tensor


def lookup_misuse(
    relay: VllmDraftsFutureMap, lookup: LookupWithoutIds, batch: UncountedBatch
) -> None:
    relay.resolve_drafts_made_cpu(lookup)  # E: arg-type
    relay.resolve_drafts_made_cpu(batch)  # E: arg-type
    relay.resolve_future(lookup)  # E: arg-type


def counted_misuse(batch: UncountedBatch, tokens: torch.Tensor) -> None:
    relay = VllmDraftsFutureMap("cpu", 9, num_speculative_tokens=3)
    VllmDraftsFutureMap("cpu", 9)  # E: call-arg
    VllmDraftsPayload(sampled_token_ids=tokens, draft_token_ids=tokens)  # E: call-arg
    relay.resolve_future(batch)  # E: arg-type


@dataclass
class RequiredSlotsInput:
    """A draft input whose slots cannot be set to None: not the staged handle."""

    future_indices: torch.Tensor
    future_dsa_topk_indices_available: bool


def staged_misuse(slots: torch.Tensor, handle: RequiredSlotsInput) -> None:
    SglangEagleFutureMap("cpu", 9, need_topk="yes")  # E: arg-type
    relay = SglangEagleFutureMap("cpu", 9)
    relay.make_staged_spec_input(slots, handle)  # E: arg-type
