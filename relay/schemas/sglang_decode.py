"""Relay of plain decoding, faithful to sglang 0.5.23's FutureMap."""

import torch

from relay.schema import Field, Guard, Lane, Members, Schema

SCHEMA = Schema(
    name="SglangDecodeFutureMap",
    doc="""Relay of plain decoding as sglang 0.5.23 relays it (docs/sglang.md).

    Forward N stashes each request's sampled token under the name sglang's payload
    gives it (``bonus_tokens``); forward N+1 gathers them into ``input_ids`` by the
    batch's request-pool slots. Nothing else is relayed: every request grows by one
    token per step, so the host computes the next lengths itself, and sglang's
    lengths buffer, which plain decoding writes and never reads, is left out. Not
    seeded: sglang hands a prebuilt request's first token to ``stash`` itself. Debug
    mode names each row's request from the batch's ``reqs`` (sglang's request objects,
    by ``rid``); under beam search a decode batch carries its beam members' slots
    after those rows, listed by ``beam_tail``, and each is named by its leader.
    """,
    owners=Members("reqs", tail="beam_tail"),
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="bonus_tokens",
            target="input_ids",
            guard=Guard.NON_NEGATIVE,
            doc="The token sampled for each request: the next forward's input token.",
        ),
    ],
)
