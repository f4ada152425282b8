"""Relay of EAGLE on a model with sparse attention that reuses its top-k indices."""

import torch

from relay.schema import Alloc, Field, Guard, Lane, Schema

EAGLE = Schema.load("eagle.py")

SCHEMA = EAGLE.derive(
    name="EagleDsaFutureMap",
    doc="""Relay of EAGLE speculative decoding on a DeepSeek-sparse-attention model.

    The sparse-attention indexer's selected KV positions are relayed so the next
    step can start from them. They appear only once a request's context is long
    enough, so the field is optional and lazy: it may first arrive in a later
    payload, and gets its buffer then.
    """,
    before="new_seq_lens",
    add=[
        Field(
            "dsa_topk_indices",
            lane=Lane.FORWARD,
            dtype=torch.int32,
            shape=("dsa_topk",),
            alloc=Alloc.LAZY,
            optional=True,
            target="spec_info.dsa_topk_indices",
            guard=Guard.NON_NEGATIVE,
            doc="KV positions the sparse-attention indexer selected for each request.",
        ),
    ],
)
