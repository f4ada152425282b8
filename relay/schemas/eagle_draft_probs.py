"""Relay of EAGLE with the draft's full distribution, for probabilistic verification."""

import torch

from relay.schema import Alloc, Field, Lane, Schema

EAGLE = Schema.load("eagle.py")

SCHEMA = EAGLE.derive(
    name="EagleDraftProbsFutureMap",
    doc="""Relay of EAGLE speculative decoding with the draft's full probabilities.

    Sampling-based verification needs the draft's whole distribution over the
    vocabulary. At P x vocab float32 that buffer is gigabytes, so it is lazy and
    optional: it is allocated only when a payload first carries it.
    """,
    before="new_seq_lens",
    add=[
        Field(
            "draft_probs",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("vocab",),
            alloc=Alloc.LAZY,
            optional=True,
            target="spec_info.draft_probs",
            doc="The draft's probabilities over the vocabulary for its first token.",
        ),
    ],
)
