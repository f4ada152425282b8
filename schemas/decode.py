"""Relay of plain (non-speculative) decoding."""

import torch

from relay.schema import Field, Guard, Lane, Resolve, Schema

SCHEMA = Schema(
    name="DecodeFutureMap",
    doc="""Relay of plain decoding: forward N's sampled tokens and new sequence lengths.

    The sampled token is stashed for forward N+1, which finds it through the
    placeholder the scheduler left in ``input_ids``; the new sequence lengths are
    published for the scheduler, which needs them on the host to plan memory.
    """,
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="next_token_ids",
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
            guard=Guard.NON_NEGATIVE,
            doc="The token sampled for each request: the next forward's input token.",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host_mirror="seq_lens_cpu",
            host_sum="seq_lens_sum",
            guard=Guard.POSITIVE,
            doc="Each request's sequence length after the forward.",
        ),
    ],
)
