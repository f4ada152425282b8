"""Relay of EAGLE with a per-draft-token confidence published for the scheduler."""

import torch

from relay.schema import FROM_PAYLOAD, Alloc, Field, Guard, Lane, Schema

SCHEMA = Schema(
    name="EagleConfidenceFutureMap",
    doc="""Relay of EAGLE speculative decoding with a draft confidence for the scheduler.

    Besides the new sequence lengths, verification publishes one float32
    confidence per draft token, which the scheduler reads on the host to choose
    the next step's draft length.
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
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host_mirror="seq_lens_cpu",
            host_sum="seq_lens_sum",
            guard=Guard.POSITIVE,
            doc="Each request's sequence length after verification (accepted tokens included).",
        ),
        Field(
            "draft_confidence",
            lane=Lane.SCHEDULE,
            dtype=torch.float32,
            shape=("draft_tokens",),
            target="spec_info.draft_confidence",
            host_mirror="draft_confidence_cpu",
            doc="The draft's confidence in each of its tokens, as verification measured it.",
        ),
    ],
)
