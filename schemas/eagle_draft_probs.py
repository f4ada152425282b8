"""Relay of EAGLE with the draft's full distribution, for probabilistic verification."""

import torch

from relay.schema import FROM_PAYLOAD, Alloc, Field, Guard, Lane, Schema

SCHEMA = Schema(
    name="EagleDraftProbsFutureMap",
    doc="""Relay of EAGLE speculative decoding with the draft's full probabilities.

    Sampling-based verification needs the draft's whole distribution over the
    vocabulary. At P x vocab float32 that buffer is gigabytes, so it is lazy and
    optional: it is allocated only when a payload first carries it.
    """,
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="bonus_tokens",
            target="spec_info.bonus_tokens",
            guard=Guard.NON_NEGATIVE,
            doc="The bonus token: the target model's token after the accepted drafts.",
        ),
        Field(
            "topk_p",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("topk",),
            target="spec_info.topk_p",
            doc="Probabilities of the draft's first top-k candidates.",
        ),
        Field(
            "topk_index",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("topk",),
            target="spec_info.topk_index",
            guard=Guard.NON_NEGATIVE,
            doc="Token ids of the draft's first top-k candidates.",
        ),
        Field(
            "hidden_states",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            shape=("hidden",),
            alloc=Alloc.LAZY,
            optional=True,
            target="spec_info.hidden_states",
            doc="The target model's last hidden state, relayed only when the draft reads it.",
        ),
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
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host_mirror="seq_lens_cpu",
            host_sum="seq_lens_sum",
            guard=Guard.POSITIVE,
            doc="Each request's sequence length after verification (accepted tokens included).",
        ),
    ],
)
