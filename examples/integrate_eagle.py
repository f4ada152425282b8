"""A generated EAGLE map driven in the call order of an sglang-style overlap loop.

Run:  .venv/bin/python examples/integrate_eagle.py
Type: .venv/bin/mypy --strict examples/integrate_eagle.py

docs/integrating.md walks through replacing a hand-written FutureMap with a
generated one; this is its loop in miniature, on the CPU, with a stand-in model.
Each relay call is printed where an engine makes it:

- scheduler, building batch N+1: ``resolve_seq_lens_cpu`` (waits on the fence of
  N's publish, then fills ``seq_lens``, ``seq_lens_cpu``, ``seq_lens_sum``);
- forward stream, first thing in forward N+1: ``resolve_future`` (fills the draft
  input ``spec_info`` from N's stash);
- forward stream, right after verification: ``publish`` (the ``on_publish`` hook);
- forward stream, end of the forward: ``stash``;
- forward stream, before the next forward, for slots whose requests ended:
  ``release``.

It also shows a CUDA-graph padded batch (padding rows point at the scratch slot 0)
and a data-parallel idle rank (an empty batch: every call is a no-op). The map is
built with ``debug=True``, as an engine's CI would run it: a missing stash, a slot
read twice or a stale slot would raise here.
"""

from __future__ import annotations

import dataclasses

import torch

from relay.maps.eagle import EagleBatch, EagleFutureMap, EaglePayload

TOPK, HIDDEN = 2, 4


@dataclasses.dataclass
class DraftInput:
    """The engine's draft input; fits the generated ``EagleSpecInfo`` protocol."""

    bonus_tokens: torch.Tensor
    topk_p: torch.Tensor
    topk_index: torch.Tensor
    hidden_states: torch.Tensor | None = None


@dataclasses.dataclass
class Batch:
    """The engine's batch; fits the generated ``EagleBatch`` protocol."""

    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    spec_info: DraftInput


def new_batch(slots: list[int]) -> Batch:
    """A batch as the scheduler builds it: slots known, the rest still to resolve."""
    empty = torch.empty(0, dtype=torch.int64)
    return Batch(
        req_pool_indices=torch.tensor(slots, dtype=torch.int64),
        seq_lens=empty,
        seq_lens_cpu=empty,
        seq_lens_sum=0,
        spec_info=DraftInput(
            bonus_tokens=empty,
            topk_p=torch.empty(0, TOPK),
            topk_index=torch.empty(0, TOPK, dtype=torch.int64),
        ),
    )


def verify_and_draft(
    batch: EagleBatch, accepted: int
) -> tuple[torch.Tensor, EaglePayload]:
    """Stand-in for verify + draft extend: new lengths, and what the next step needs."""
    n = batch.req_pool_indices.numel()
    new_seq_lens = batch.seq_lens + accepted + 1
    bonus = batch.req_pool_indices * 100 + new_seq_lens  # a token id to recognize
    payload = EaglePayload(
        bonus_tokens=bonus,
        topk_p=torch.full((n, TOPK), 0.5),
        topk_index=bonus[:, None] + torch.arange(1, TOPK + 1),
        hidden_states=torch.zeros(n, HIDDEN),
    )
    return new_seq_lens, payload


def forward(
    relay: EagleFutureMap, batch: Batch, step: int, *, resolve: bool, accepted: int
) -> None:
    """Forward N on the forward stream: resolve, verify, publish, draft, stash."""
    slots = batch.req_pool_indices
    if resolve:
        relay.resolve_future(batch)  # first thing: the draft input from N-1's stash
        print(
            f"step {step} forward:   resolve_future -> bonus_tokens {batch.spec_info.bonus_tokens.tolist()}"
        )
    new_seq_lens, payload = verify_and_draft(batch, accepted)
    relay.publish(slots, new_seq_lens)  # on_publish: mid-forward, records the fence
    print(f"step {step} forward:   publish new_seq_lens {new_seq_lens.tolist()}")
    relay.stash(slots, payload)  # end of the forward
    print(f"step {step} forward:   stash bonus_tokens {payload.bonus_tokens.tolist()}")


def main() -> None:
    # Rows 1..7 are request slots; row 0 is the scratch row padded batches point at.
    relay = EagleFutureMap("cpu", pool_size=8, topk=TOPK, debug=True)

    # Step 1, a prefill of two requests in slots 3 and 5: nothing to resolve yet; the
    # prompt lengths are known on the host.
    prefill = new_batch([3, 5])
    prefill.seq_lens = torch.tensor([6, 9])
    forward(relay, prefill, 1, resolve=False, accepted=0)

    # Step 2, a decode of the same requests, built while step 1 would still run.
    decode = new_batch([3, 5])
    relay.resolve_seq_lens_cpu(decode)  # scheduler: fence wait, then the lengths
    print(
        f"step 2 scheduler: resolve_seq_lens_cpu -> seq_lens {decode.seq_lens.tolist()}, "
        f"seq_lens_cpu {decode.seq_lens_cpu.tolist()}, seq_lens_sum {decode.seq_lens_sum}"
    )
    forward(relay, decode, 2, resolve=True, accepted=2)

    # Step 3: the request in slot 5 ended after step 2. Its slot is released on the
    # forward stream before the next forward. Slot 3 goes on; the CUDA-graph runner
    # pads its batch to the captured size 4 with rows pointing at the scratch slot 0.
    decode = new_batch([3])
    relay.resolve_seq_lens_cpu(decode)
    print(
        f"step 3 scheduler: resolve_seq_lens_cpu -> seq_lens {decode.seq_lens.tolist()}"
    )
    relay.release(torch.tensor([5]))
    print("step 3 forward:   release [5]")
    padded = new_batch([3, 0, 0, 0])
    relay.resolve_future(padded)
    print(
        f"step 3 forward:   resolve_future, padded to 4 -> bonus_tokens {padded.spec_info.bonus_tokens.tolist()[:1]} and 3 scratch rows"
    )
    new_seq_lens, payload = verify_and_draft(decode, accepted=1)
    relay.publish(decode.req_pool_indices, new_seq_lens)  # the real rows only
    relay.stash(decode.req_pool_indices, payload)
    print(
        f"step 3 forward:   publish and stash slot 3 only: new_seq_lens {new_seq_lens.tolist()}"
    )

    # Another data-parallel rank, with no requests yet, joins the step with an empty
    # batch: every call is a no-op and allocates nothing (no row to size it from).
    rank1 = EagleFutureMap("cpu", pool_size=8, topk=TOPK, debug=True)
    idle = new_batch([])
    empty = torch.empty(0, dtype=torch.int64)
    rank1.resolve_seq_lens_cpu(idle)
    rank1.resolve_future(idle)
    rank1.publish(empty, empty)
    rank1.stash(
        empty,
        EaglePayload(
            bonus_tokens=empty,
            topk_p=torch.empty(0, TOPK),
            topk_index=torch.empty(0, TOPK, dtype=torch.int64),
            hidden_states=torch.empty(0, HIDDEN),
        ),
    )
    print(
        f"idle rank:        every call a no-op; lazy hidden_states buffer still unallocated: {rank1.hidden_states_buf is None}"
    )

    # Debug mode (CI): reading slot 3 again without a new stash is caught.
    again = new_batch([3])
    again.seq_lens = new_seq_lens
    relay.resolve_future(again)
    try:
        relay.resolve_future(again)
    except RuntimeError as error:
        print(
            f"debug: a second resolve_future without a stash fails: {str(error).splitlines()[0]}"
        )


if __name__ == "__main__":
    main()
