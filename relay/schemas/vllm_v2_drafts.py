"""Relay of vLLM 0.33's V2 model runner: each request's last sampled token and drafts."""

import torch

from relay.schema import BatchRows, Field, Guard, Lane, Scatter, Schema

SCHEMA = Schema(
    name="VllmV2DraftsFutureMap",
    doc="""Relay of vLLM 0.33's V2 model runner (the default; docs/integrating.md).

    Each request keeps one slot for its life, holding its last sampled token and its
    drafts, int64 as V2's request state holds them. A step stashes the token of each
    request that sampled one and the drafts the step proposed for every request of the
    batch (a request still in its prefill stashes drafts alone, its token kept); a
    request taking its slot is seeded with zero drafts. The next step lays them into
    the flat int32 ``input_ids``, each value cast as it is laid in: with ``n`` drafts
    scheduled, the token at ``query_end - 1 - n`` only once the request's prefill is
    done (``seq_len - 1 - n >= prefill_len``: a prompt tail keeps its prompt token
    there), and the ``n`` drafts after it whenever the sequence is past its prefill
    (``seq_len > prefill_len``; 0 counted otherwise). Draft columns past the step's
    count hold -1, which nothing reads. Each request's span stays inside its row of
    ``query_start_loc``: one running onto the next row is refused before ``input_ids``
    changes.
    """,
    indices="slots",
    owners="req_ids",
    seeded=True,
    fields=[
        Field(
            "last_sampled",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            optional=True,
            kept=True,
            source="sampled_token_ids",
            target="input_ids",
            resolve=Scatter(
                offsets="logits_starts",
                when="sampled_ready",
                rows=BatchRows(starts="query_start_loc"),
                cast=torch.int32,
            ),
            guard=Guard.NON_NEGATIVE,
            doc="The last token the request sampled (kept while it samples none).",
        ),
        Field(
            "draft_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("num_speculative_tokens",),
            source="draft_token_ids",
            target="input_ids",
            resolve=Scatter(
                offsets="logits_starts",
                lengths="num_draft_tokens",
                after="last_sampled",
                cast=torch.int32,
            ),
            guard=Guard.NON_NEGATIVE,
            doc="The drafts the request's latest step proposed; the scheduled ones "
            "follow the token's position.",
        ),
    ],
)
