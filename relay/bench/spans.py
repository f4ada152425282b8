"""``relay bench --spans``: ``vllm_drafts``' counted scatter (Note [Counted scatters]
in relay/runtime.py) against its floors, the same torch calls with relay's CPU host
checks or bare. Offsets and counts are int32, as vLLM's ``query_start_loc`` is."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from relay import runtime

__all__ = ["SpanWork", "plain_step", "relay_step", "sides", "workload"]

DRAFTS = 3
POOL = 513


#: A step's slots, sampled tokens, drafts made and kept (``counts``) at ``starts``.
SpanWork = types.SimpleNamespace


def workload(batch: int, device: torch.device, seed: int = 0) -> SpanWork:
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(POOL - 1, generator=g)[:batch] + 1
    made = torch.randint(0, DRAFTS + 1, (batch,), generator=g)
    counts = torch.minimum(made, torch.randint(0, DRAFTS + 1, (batch,), generator=g))
    sizes = counts + 1
    starts = torch.cumsum(sizes, 0) - sizes
    sampled = torch.randint(0, 32_000, (batch,), generator=g).to(device)
    drafts = torch.randint(0, 32_000, (batch, DRAFTS), generator=g).to(device)
    return SpanWork(
        slots=slots.to(device), sampled=sampled, drafts=drafts, made=made.to(device),
        starts=starts.to(device, torch.int32), counts=counts.to(device, torch.int32),
        size=int(sizes.sum()),
    )  # fmt: skip


def relay_step(
    work: SpanWork, device: torch.device
) -> tuple[Callable[[], None], Any, Any]:
    from relay.maps.vllm_drafts import VllmDraftsFutureMap, VllmDraftsPayload

    relay = VllmDraftsFutureMap(device, POOL, num_speculative_tokens=DRAFTS)
    payload = VllmDraftsPayload(
        sampled_token_ids=work.sampled, draft_token_ids=work.drafts,
        num_draft_tokens=work.made,
    )  # fmt: skip
    batch = types.SimpleNamespace(
        slots=work.slots, req_ids=None, query_starts=work.starts,
        num_draft_tokens=work.counts,
        input_ids=torch.full((work.size,), -1, dtype=torch.int32, device=device),
    )  # fmt: skip

    def step() -> None:
        relay.stash(work.slots, payload)
        relay.resolve_future(batch)

    return step, relay, batch


def plain_step(
    work: SpanWork, relay: Any, device: torch.device, check: bool = True
) -> tuple[Callable[[], None], torch.Tensor]:
    """A floor over ``relay``'s buffers, and the ``input_ids`` it fills."""
    sampled_buf: torch.Tensor = relay.sampled_tokens_buf
    drafts_buf: torch.Tensor = relay.draft_tokens_buf
    idx, sampled, drafts = work.slots, work.sampled, work.drafts
    starts32, counts32 = work.starts, work.counts
    cols = torch.arange(DRAFTS, device=device)
    input_ids = torch.full((work.size,), -1, dtype=torch.int32, device=device)
    check = check and device.type == "cpu"
    size = input_ids.numel()

    def step() -> None:  # relay's own host checks: the slots, then the spans
        if check and not runtime.host_slots_ok(idx, POOL):
            raise IndexError(idx)
        sampled_buf.index_copy_(0, idx, sampled)
        drafts_buf.index_copy_(0, idx, drafts)
        a = sampled_buf.index_select(0, idx).int()  # int64 tokens, int32 input_ids
        b = drafts_buf.index_select(0, idx).int()
        starts = starts32.long()
        counts = counts32.long()
        if check and not runtime._spans_ok(starts, [counts], [DRAFTS], 1, size):
            raise IndexError(starts)
        at = (starts + 1).unsqueeze(1) + cols
        keep = cols < counts.unsqueeze(1)
        at_kept, b_kept = at[keep], b[keep]
        input_ids.index_copy_(0, starts, a)
        input_ids.index_copy_(0, at_kept, b_kept)

    return step, input_ids


def sides(
    batch: int, device: torch.device, seed: int
) -> tuple[dict[str, Callable[[], None]], bool]:
    """The generated step and its floors, one step in; whether they lay in the same."""
    work = workload(batch, device, seed)
    generated, relay, relay_batch = relay_step(work, device)
    floors = [plain_step(work, relay, device, check) for check in (True, False)]
    steps = {"generated": generated, "floor": floors[0][0], "bare": floors[1][0]}
    for step in steps.values():
        step()
    same = all(torch.equal(relay_batch.input_ids, ids) for _, ids in floors)
    return steps, same
