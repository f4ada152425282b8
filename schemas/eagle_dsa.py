"""Relay of EAGLE on a model with sparse attention that reuses its top-k indices."""

import torch

from relay.schema import FROM_PAYLOAD, Alloc, Field, Guard, Lane, Schema

SCHEMA = Schema(
    name="EagleDsaFutureMap",
    doc="""Relay of EAGLE speculative decoding on a DeepSeek-sparse-attention model.

    The sparse-attention indexer's selected KV positions are relayed so the next
    step can start from them. They appear only once a request's context is long
    enough, so the field is optional and lazy: it may first arrive in a later
    payload, and gets its buffer then.
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
