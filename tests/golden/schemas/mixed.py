"""Golden corpus: both lanes, every way a forward value is read.

Reaches: a forward placeholder resolved by ``resolve_future`` and a schedule field
with a host mirror and a host sum together, a required lazy forward field (raises
until first stashed), a lazy field with a fixed dtype and fixed row dims, an eager
field with symbolic and fixed dims, two forward placeholders, and a schedule
placeholder mirrored to the host.
"""

import torch

from relay.schema import Alloc, Field, Guard, HostCopy, Lane, Resolve, Schema

SCHEMA = Schema(
    name="MixedFutureMap",
    doc="""Both lanes at once.

    A second paragraph, indented as doc strings are.
    """,
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
            guard=Guard.NON_NEGATIVE,
            doc="The token sampled last; placeholders in input_ids until resolved.",
        ),
        Field(
            "positions",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="positions",
            resolve=Resolve.PLACEHOLDER,
        ),
        Field(
            "logits",
            lane=Lane.FORWARD,
            dtype=torch.bfloat16,
            shape=(3, 2),
            alloc=Alloc.LAZY,
            target="spec.logits",
            doc="Required, but allocated on the first stash.",
        ),
        Field(
            "topk_p",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("topk", 2),
            target="spec.topk_p",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"),
            doc="Lengths after this step.",
        ),
        Field(
            "budget",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="budget",
            resolve=Resolve.PLACEHOLDER,
            host=HostCopy(mirror="budget_cpu"),
        ),
    ],
)
