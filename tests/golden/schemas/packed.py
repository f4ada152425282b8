"""Golden corpus: the packed layout (Note [Packed layout]).

Reaches: two packed dtype groups (scalar, 1-D, multi-dim and fixed-width rows), a dtype
with one packable field (kept in its own buffer), and fields the layout leaves alone:
an optional lazy field and a required lazy one (both in resolve_future's gather
block), a placeholder and a schedule field.
"""

import torch

from relay.schema import FROM_PAYLOAD, Alloc, Field, Lane, Layout, Resolve, Schema

SCHEMA = Schema(
    name="PackedFutureMap",
    doc="Forward fields packed by dtype.",
    layout=Layout.PACKED,
    fields=[
        Field(
            "tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
            doc="A placeholder field: never packed.",
        ),
        Field("bonus", lane=Lane.FORWARD, dtype=torch.int64, target="spec_info.bonus"),
        Field(
            "index",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("topk",),
            target="spec_info.index",
        ),
        Field(
            "tree",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("topk", 2),
            target="spec_info.tree",
        ),
        Field(
            "scores",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=(3,),
            target="spec_info.scores",
        ),
        Field("mask", lane=Lane.FORWARD, dtype=torch.bool, target="spec_info.mask"),
        Field(
            "hidden",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            shape=("hidden",),
            alloc=Alloc.LAZY,
            optional=True,
            target="spec_info.hidden",
        ),
        Field(
            "logits",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            shape=("vocab",),
            alloc=Alloc.LAZY,
            target="spec_info.logits",
            doc="A required lazy field: in the gather block, checked before it.",
        ),
        Field("lengths", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens"),
    ],
)
