"""Golden corpus: the hand-over declarations of ported relays.

Reaches: slots read through an optional parent that a resolve skips when it is None,
a second optional parent that a resolve refuses, rows never written read as zeros,
a flattened target, seeding, and a declared owner attribute for debug mode.
"""

import torch

from relay.schema import (
    Field,
    IfNone,
    Lane,
    Schema,
    TargetShape,
    Unwritten,
)

SCHEMA = Schema(
    name="HandoverFutureMap",
    doc="Slots and targets under optional parents, zeros rows, a flat target.",
    indices="spec_info.future_indices",
    optional_parents={"spec_info": IfNone.SKIP, "draft": IfNone.REFUSE},
    seeded=True,
    owners="rids",
    fields=[
        Field(
            "accept_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("draft_tokens",),
            target="spec_info.accept_tokens",
            target_shape=TargetShape.FLAT,
            unwritten=Unwritten.ZEROS,
        ),
        Field(
            "accept_lens",
            lane=Lane.FORWARD,
            dtype=torch.int32,
            target="spec_info.accept_lens",
            unwritten=Unwritten.ZEROS,
        ),
        Field(
            "draft_scores",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=(2,),
            target="draft.scores",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
        ),
    ],
)
