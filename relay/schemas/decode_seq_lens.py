"""Relay of plain decoding that also hands the new sequence lengths to the scheduler."""

import torch

from relay.schema import Field, Guard, HostCopy, Lane, Schema

SCHEMA = Schema(
    name="DecodeSeqLensFutureMap",
    doc="""Relay of plain decoding: the sampled tokens, and the new sequence lengths.

    The seed-era design: besides the sampled token (gathered by forward N+1), forward
    N publishes each request's new sequence length, and the scheduler resolves it
    behind the fence, on the device and on the host. It costs a publish, a fence and
    a host copy per step more than ``DecodeFutureMap``; pick it only when the host
    cannot compute the lengths itself (the forward may change them by other than
    one token per step).
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
            doc="The token sampled for each request: the next forward's input token.",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"),
            guard=Guard.POSITIVE,
            doc="Each request's sequence length after the forward.",
        ),
    ],
)
