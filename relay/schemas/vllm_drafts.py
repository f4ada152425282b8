"""Relay of vLLM V1's async hand-over: the sampled token and 0 to K drafts per request,
sampled as int64 and laid into int32 ``input_ids``."""

import torch

from relay.schema import (
    Field,
    Guard,
    HostCopy,
    Lane,
    Scatter,
    ScheduleSlots,
    Schema,
)

SCHEMA = Schema(
    name="VllmDraftsFutureMap",
    doc="""Relay of vLLM-style speculative decoding with a variable draft count.

    Step N stashes each request's sampled token and its drafts (up to
    ``num_speculative_tokens``, of which ``num_draft_tokens`` are real) into the
    request's slot. Step N+1, whose rows may be in any order, lays them into its flat
    ``input_ids``: the sampled token at
    the request's start offset (vLLM's ``query_start_loc[:-1]``, int32 taken), then the
    request's scheduled drafts right after it. Each request keeps one slot for its
    life, so the step-to-step row map is the slots tensor in row order.

    Step N also publishes each request's draft count; the scheduler looks it up by
    request (its own object's ``slots`` and ``req_ids``, nothing of the forward's
    batch) to decide how many drafts step N+1 schedules.
    """,
    indices="slots",
    owners="req_ids",
    schedule=ScheduleSlots(indices="slots", owners="req_ids"),
    fields=[
        Field(
            "sampled_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="sampled_token_ids",
            target="input_ids",
            resolve=Scatter(offsets="query_starts", cast=torch.int32),
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
                offsets="query_starts",
                lengths="num_draft_tokens",
                after="sampled_tokens",
                cast=torch.int32,
            ),
            guard=Guard.NON_NEGATIVE,
            doc="The drafts proposed at step N; the scheduled ones follow the token.",
        ),
        Field(
            "drafts_made",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            source="num_draft_tokens",
            target="drafts_made",
            host=HostCopy(mirror="drafts_made_cpu"),
            guard=Guard.NON_NEGATIVE,
            doc="How many drafts step N made per request, for the scheduler, on the host.",
        ),
    ],
)
