"""Relay of vLLM 0.33's V1 model runner's async hand-over: the sampled token and drafts."""

import torch

from relay.schema import (
    BatchRows,
    Field,
    Guard,
    HostCopy,
    Lane,
    Scatter,
    ScheduleSlots,
    Schema,
)

SCHEMA = Schema(
    name="VllmV1DraftsFutureMap",
    doc="""Relay of vLLM 0.33's V1 model runner under async scheduling (docs/integrating.md).

    Step N stashes, for each request that sampled (a partial prefill did not), its
    sampled token (int32, as V1's sampler hands it) and the drafts the step proposed
    (int64, as the drafter makes them; as many as the step's draft width, 0 without
    speculation, at most ``num_speculative_tokens``). Step N+1 hands them to the
    requests it finds in step N, wherever their rows are now: into the flat int32
    ``input_ids``, the token at the position before the request's scheduled drafts
    (vLLM's ``cu_num_tokens[i] - 1 - num_draft_tokens[i]``), then those drafts, cast to
    int32 as they are laid in, as V1 casts them. Every other position is the engine's:
    a request absent from step N keeps the host's ids, whose -1 draft placeholders the
    engine clamps later. Each handed-over request's span stays inside its own row of
    the batch (its row ``token_rows``, every row's start ``query_start_loc``): one
    running onto the next row, a prefill's first token say, is refused before
    ``input_ids`` changes. Each request keeps one slot for its life, so the step-to-step
    row map is the slots tensor in row order.

    Step N also publishes how many tokens each request kept (its sampled token and the
    drafts verification accepted); the scheduler reads them back by request.
    """,
    indices="slots",
    owners="req_ids",
    schedule=ScheduleSlots(indices="slots", owners="req_ids"),
    fields=[
        Field(
            "sampled_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int32,
            source="sampled_token_ids",
            target="input_ids",
            resolve=Scatter(
                offsets="token_positions",
                rows=BatchRows(starts="query_start_loc", index="token_rows"),
                rest_checked=False,
            ),
            guard=Guard.NON_NEGATIVE,
            doc="The token step N sampled: the first input of the request's span.",
        ),
        Field(
            "draft_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("num_speculative_tokens",),
            source="draft_token_ids",
            target="input_ids",
            resolve=Scatter(
                offsets="token_positions",
                lengths="num_draft_tokens",
                after="sampled_tokens",
                rest_checked=False,
                cast=torch.int32,
            ),
            guard=Guard.NON_NEGATIVE,
            doc="The drafts step N proposed (int64, as the drafter's argmax makes "
            "them); the scheduled ones follow the token.",
        ),
        Field(
            "kept_counts",
            lane=Lane.SCHEDULE,
            dtype=torch.int32,
            source="num_kept",
            target="kept_counts",
            host=HostCopy(mirror="kept_counts_cpu"),
            guard=Guard.NON_NEGATIVE,
            doc="How many tokens step N kept per request (the sampled one and the "
            "accepted drafts), for the scheduler, on the host.",
        ),
    ],
)
