"""Golden corpus: a forward lane alone (no schedule lane, no fence, no publish).

Reaches: gather into deep nested targets, an optional eager field with a guard, a forward field
with no target (stashed, never resolved), an optional lazy field with its dtype from
the payload, guards, a payload attribute renamed by ``source``, and fields and a
schema with no doc string.
"""

import torch

from relay.schema import FROM_PAYLOAD, Alloc, Field, Guard, Lane, Schema

SCHEMA = Schema(
    name="ForwardOnlyFutureMap",
    fields=[
        Field(
            "tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="next_tokens",
            target="draft.tree.input.tokens",
            guard=Guard.NON_NEGATIVE,
            doc="Tokens for the next forward, gathered four attributes deep.",
        ),
        Field(
            "scores",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("topk", 2),
            optional=True,
            target="draft.scores",
            guard=Guard.NON_NEGATIVE,
        ),
        Field(
            "counts",
            lane=Lane.FORWARD,
            dtype=torch.int32,
            guard=Guard.POSITIVE,
            doc="Stashed for the engine's own use; no target, so never resolved.",
        ),
        Field(
            "hidden",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            shape=("hidden",),
            alloc=Alloc.LAZY,
            optional=True,
            target="draft.hidden",
            doc="Only some steps carry it.",
        ),
    ],
)
