"""Relay of multi-layer EAGLE: the draft model runs its own layers, so no hidden states."""

import torch

from relay.schema import Field, Guard, Lane, Schema

SCHEMA = Schema(
    name="EagleMultiLayerFutureMap",
    doc="""Relay of multi-layer EAGLE speculative decoding.

    The draft is a small model of its own layers and does not read the target's
    hidden states, so only the bonus token, the first top-k and the new sequence
    lengths cross the step boundary.
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
