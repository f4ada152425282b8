"""Relay of EAGLE on a model with sparse attention that reuses its top-k indices."""

import torch

from relay.schema import Alloc, Field, Guard, Lane, Schema

EAGLE = Schema.load("eagle.py")

SCHEMA = EAGLE.derive(
    name="EagleDsaFutureMap",
    doc="""Relay of EAGLE speculative decoding on a DeepSeek-sparse-attention model.

    The indexer's selected KV positions, for the next step: they appear once a
    context is long enough, so the field is optional and lazy (its first payload).
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
