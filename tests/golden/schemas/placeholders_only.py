"""Golden corpus: a resolve_future that never gathers with the batch's slots.

Reaches: a forward lane read only through a placeholder and an optional gather, so
no resolve vouches for the slots and every write checks them on the host (Note
[Slots on the host]).
"""

import torch

from relay.schema import Field, Lane, Resolve, Schema

SCHEMA = Schema(
    name="PlaceholdersOnlyFutureMap",
    doc="Tokens by placeholder; draft scores only when a step carries them.",
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
            doc="Placeholders in input_ids until resolved.",
        ),
        Field(
            "scores",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=(2,),
            optional=True,
            target="draft_scores",
            doc="Gathered only after a stash that carried them.",
        ),
    ],
)
