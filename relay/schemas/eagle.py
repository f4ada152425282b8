"""Relay of EAGLE speculative decoding."""

import torch

from relay.schema import FROM_PAYLOAD, Alloc, Field, Guard, HostCopy, Lane, Schema

SCHEMA = Schema(
    name="EagleFutureMap",
    doc="""Relay of EAGLE speculative decoding: what a verify-and-draft step hands the next.

    After verification the bonus token, the draft's first top-k and the last hidden
    state are stashed for the next step's draft, which gathers them into its draft
    input (``spec_info``) as sglang does: one gather per field, no placeholders. The
    accepted lengths are published mid-forward, before the draft extension, so the
    scheduler can plan the next batch while the draft still runs.
    """,
    seeded=True,
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="bonus_tokens",
            target="spec_info.bonus_tokens",
            guard=Guard.NON_NEGATIVE,
            graph_written=True,
            doc="The bonus token: the target model's token after the accepted drafts.",
        ),
        Field(
            "topk_p",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("topk",),
            target="spec_info.topk_p",
            graph_written=True,
            doc="Probabilities of the draft's first top-k candidates.",
        ),
        Field(
            "topk_index",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("topk",),
            target="spec_info.topk_index",
            guard=Guard.NON_NEGATIVE,
            graph_written=True,
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
            host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"),
            guard=Guard.POSITIVE,
            graph_written=True,
            doc="Each request's sequence length after verification (accepted tokens included).",
        ),
    ],
)
