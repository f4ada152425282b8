"""``relay bench --spans``: ``vllm_drafts``' counted scatter (Note [Counted scatters]
in relay/runtime.py) against its floors, the same torch calls with relay's CPU host
checks or bare. Offsets and counts are int32, as vLLM's ``query_start_loc`` is."""

from __future__ import annotations

import statistics
import types
from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs
import torch

from relay import runtime
from relay.bench.timing import quartiles, time_interleaved, timer_for

__all__ = ["SIDES", "SpanWork", "measure", "plain_step", "relay_step", "workload"]

DRAFTS = 3
POOL = 513
BATCHES = (1, 8, 64, 256)


@attrs.frozen
class SpanWork:
    slots: torch.Tensor
    sampled: torch.Tensor
    drafts: torch.Tensor
    made: torch.Tensor
    starts: torch.Tensor
    counts: torch.Tensor
    size: int


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
        slots.to(device), sampled, drafts, made.to(device),
        starts.to(device, torch.int32), counts.to(device, torch.int32), int(sizes.sum()),
    )  # fmt: skip


def relay_step(
    work: SpanWork, device: torch.device, debug: bool = False
) -> tuple[Callable[[], None], Any, Any]:
    from relay.maps.vllm_drafts import VllmDraftsFutureMap, VllmDraftsPayload

    relay = VllmDraftsFutureMap(device, POOL, num_speculative_tokens=DRAFTS, debug=debug)  # fmt: skip
    payload = VllmDraftsPayload(
        sampled_token_ids=work.sampled, draft_token_ids=work.drafts,
        num_draft_tokens=work.made,
    )  # fmt: skip
    batch = types.SimpleNamespace(
        slots=work.slots, req_ids=None, query_starts=work.starts,
        num_draft_tokens=work.counts, input_ids=torch.full((work.size,), -1, device=device),
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
    input_ids = torch.full((work.size,), -1, device=device)
    check = check and device.type == "cpu"
    few = idx.numel() <= runtime.HOST_SLOTS_IN_PYTHON_MAX
    slots = runtime.slot_set(POOL)
    size = input_ids.numel()

    def apart(starts: torch.Tensor, counts: torch.Tensor) -> None:
        """relay's span check: counts 0 to K, spans in order inside the target."""
        if starts.numel() <= runtime.HOST_POSITIONS_IN_PYTHON_MAX:
            at: list[int] = starts.tolist()
            each: list[int] = counts.tolist()
            if min(each) < 0 or max(each) > DRAFTS:
                raise IndexError(each)
            end = 0
            for a, c in zip(at, each):
                if a < end:
                    raise IndexError(at)
                end = a + 1 + c
            if end > size:
                raise IndexError(at)
            return
        held, made = starts.numpy(), counts.numpy()  # one view op each
        if made.min() < 0 or made.max() > DRAFTS:
            raise IndexError(made)
        ends = held + made
        if (held[1:] - ends[:-1]).min() < 1 or held[0] < 0 or ends[-1] + 1 > size:
            raise IndexError(held)

    def step() -> None:
        if check and few:
            if not slots.issuperset(idx.tolist()):
                raise IndexError(idx)
        elif check:
            lo, hi = idx.aminmax()
            if cast(int, lo.tolist()) < 0 or cast(int, hi.tolist()) >= POOL:
                raise IndexError(idx)
        sampled_buf.index_copy_(0, idx, sampled)
        drafts_buf.index_copy_(0, idx, drafts)
        a = sampled_buf.index_select(0, idx)
        b = drafts_buf.index_select(0, idx)
        starts = starts32.long()
        counts = counts32.long()
        if check:
            apart(starts, counts)
        at = (starts + 1).unsqueeze(1) + cols
        keep = cols < counts.unsqueeze(1)
        at_kept, b_kept = at[keep], b[keep]
        input_ids.index_copy_(0, starts, a)
        input_ids.index_copy_(0, at_kept, b_kept)

    return step, input_ids


def measure(
    batches: Sequence[int] = BATCHES,
    device: torch.device | None = None,
    *,
    repeat: int = 15,
    warmup: int = 3,
    sample_ms: float = 0.25,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Per batch size: median us per side, quartiles of the ratios, same values."""
    device = device or torch.device("cpu")
    results = []
    for batch in batches:
        work = workload(batch, device, seed)
        generated, relay, relay_batch = relay_step(work, device)
        generated()  # allocates nothing, but warms the columns cache
        floors = [plain_step(work, relay, device, check) for check in (True, False)]
        for floor, _ in floors:
            floor()
        same = all(torch.equal(relay_batch.input_ids, ids) for _, ids in floors)
        times = time_interleaved(
            [generated, *(floor for floor, _ in floors)], timer_for(device),
            repeat=repeat, warmup=warmup, target_ns=int(sample_ms * 1e6),
        )  # fmt: skip
        result: dict[str, Any] = {"batch": batch, "same": same}
        result["us"] = {k: statistics.median(t) / 1e3 for k, t in zip(SIDES, times)}
        for k, t in zip(SIDES[1:], times[1:]):
            result[f"generated/{k}"] = quartiles(times[0], t)
        results.append(result)
    return results


SIDES = ("generated", "floor", "bare")
