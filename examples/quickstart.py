"""Two decode steps through a generated relay, on the CPU, printing each hand-over.

Run:  .venv/bin/python examples/quickstart.py
Type: .venv/bin/mypy --strict examples/quickstart.py

``relay.maps.decode_seq_lens`` is generated from ``relay/schemas/decode_seq_lens.py`` by
``relay generate``. It relays two fields: ``output_tokens`` (forward lane, gathered
into ``batch.input_ids`` by the next forward) and ``new_seq_lens`` (schedule lane,
gathered into ``batch.seq_lens`` behind the fence, with a host copy in
``seq_lens_cpu`` and the sum in ``seq_lens_sum``). The engine's batch can be any
class with those attributes. (The bundled ``decode`` map relays the tokens only,
for engines whose host computes the lengths itself.)
"""

from __future__ import annotations

import dataclasses

import torch

from relay.maps.decode_seq_lens import (
    DecodeSeqLensBatch,
    DecodeSeqLensFutureMap,
    DecodeSeqLensPayload,
)


@dataclasses.dataclass
class Batch:
    """The engine's own batch type; mypy checks it against ``DecodeBatch`` structurally."""

    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int


def new_batch(slots: list[int], seq_lens: list[int]) -> Batch:
    lens = torch.tensor(seq_lens)
    return Batch(
        req_pool_indices=torch.tensor(slots),
        input_ids=torch.zeros(len(slots), dtype=torch.int64),
        seq_lens=lens,
        seq_lens_cpu=lens.clone(),
        seq_lens_sum=int(lens.sum()),
    )


def fake_forward(batch: DecodeSeqLensBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in for the model: 'samples' input + 100 and grows each sequence by one."""
    return batch.input_ids + 100, batch.seq_lens + 1


def main() -> None:
    relay = DecodeSeqLensFutureMap(
        "cpu", pool_size=8
    )  # rows 1..7: request slots, 0: scratch
    slots = torch.tensor([3, 5])

    # Step N: a forward whose inputs are already known (e.g. right after prefill).
    batch_n = new_batch([3, 5], seq_lens=[10, 20])
    batch_n.input_ids = torch.tensor([11, 12])
    tokens, new_lens = fake_forward(batch_n)
    relay.publish(slots, new_lens)  # schedule lane: mid-forward, records the fence
    relay.stash(
        slots, DecodeSeqLensPayload(next_token_ids=tokens)
    )  # forward lane: at the end
    print(
        f"step N   forward:   sampled {tokens.tolist()}, new seq_lens {new_lens.tolist()}"
    )

    # Meanwhile the scheduler builds batch N+1 without waiting for N's tokens.
    batch_next = new_batch([3, 5], seq_lens=[0, 0])
    relay.resolve_seq_lens_cpu(
        batch_next
    )  # waits on the fence, then gathers and copies
    print(
        f"step N+1 scheduler: seq_lens {batch_next.seq_lens.tolist()}, "
        f"seq_lens_cpu {batch_next.seq_lens_cpu.tolist()}, seq_lens_sum {batch_next.seq_lens_sum}"
    )

    # Step N+1 forward: the first thing it does is gather the tokens forward N stashed.
    relay.resolve_future(batch_next)
    print(f"step N+1 forward:   input_ids gathered: {batch_next.input_ids.tolist()}")

    # Idle rank: zero indices make every method a no-op.
    empty = new_batch([], seq_lens=[])
    relay.resolve_future(empty)
    print(f"idle rank: empty batch left as is, input_ids {empty.input_ids.tolist()}")

    # Debug mode: every value may be consumed once.
    checked = DecodeSeqLensFutureMap("cpu", pool_size=8, debug=True)
    checked.stash(slots, DecodeSeqLensPayload(next_token_ids=torch.tensor([7, 9])))
    again = new_batch([3, 5], seq_lens=[1, 1])
    checked.resolve_future(again)
    print(f"debug: first resolve reads {again.input_ids.tolist()}")
    try:
        checked.resolve_future(again)  # no stash in between: the rows were consumed
    except RuntimeError as error:
        print(f"debug: second resolve without a stash fails: {error}")


if __name__ == "__main__":
    main()
