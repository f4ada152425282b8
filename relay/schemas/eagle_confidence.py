"""Relay of EAGLE with a per-draft-token confidence published for the scheduler."""

import torch

from relay.schema import Field, HostCopy, Lane, Schema

EAGLE = Schema.load("eagle.py")

SCHEMA = EAGLE.derive(
    name="EagleConfidenceFutureMap",
    doc="""Relay of EAGLE speculative decoding with a draft confidence for the scheduler.

    Besides the new sequence lengths, verification publishes one float32
    confidence per draft token, which the scheduler reads on the host to choose
    the next step's draft length.
    """,
    add=[
        Field(
            "draft_confidence",
            lane=Lane.SCHEDULE,
            dtype=torch.float32,
            shape=("draft_tokens",),
            target="spec_info.draft_confidence",
            host=HostCopy(mirror="draft_confidence_cpu"),
            doc="The draft's confidence in each of its tokens, as verification measured it.",
        ),
    ],
)
