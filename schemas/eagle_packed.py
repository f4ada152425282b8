"""Relay of EAGLE speculative decoding, packed: one gather per dtype."""

import torch

from relay.schema import FROM_PAYLOAD, Alloc, Field, Guard, Lane, Layout, Schema

SCHEMA = Schema(
    name="EaglePackedFutureMap",
    doc="""Relay of EAGLE speculative decoding with the packed layout: one gather per dtype.

    The same relay as ``eagle``, but the bonus token and the top-k token ids (both
    int64) share one ``(pool_size, 1 + topk)`` buffer, so the next step's draft
    input is resolved with one gather for both (three gathers in all with hidden
    states, against four). Pick it where the forward-side resolve's launches count
    (small batches on a GPU, the latency case); the batch then gets ``bonus_tokens``
    and ``topk_index`` as views of one gathered block, not contiguous tensors, so
    pick ``eagle`` where the draft's kernels need them contiguous.
    """,
    layout=Layout.PACKED,
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
    ],
)
