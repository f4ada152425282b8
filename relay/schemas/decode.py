"""Relay of plain (non-speculative) decoding: the sampled token, nothing else."""

import torch

from relay.schema import Field, Guard, Lane, Schema

SCHEMA = Schema(
    name="DecodeFutureMap",
    doc="""Relay of plain decoding: forward N's sampled tokens, gathered by forward N+1.

    The fastest correct plain-decoding relay, as sglang runs it today: one indexed
    write at the end of forward N and one gather at the start of forward N+1, no
    placeholders and no fence. Every request grows by exactly one token per step, so
    the scheduler computes the next sequence lengths on the host itself
    (``seq_lens + 1``). Pick ``DecodeSeqLensFutureMap`` instead when the forward
    decides the lengths (for example when it can stop a request early).
    """,
    seeded=True,
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="next_token_ids",
            target="input_ids",
            guard=Guard.NON_NEGATIVE,
            graph_written=True,
            doc="The token sampled for each request: the next forward's input token.",
        ),
    ],
)
