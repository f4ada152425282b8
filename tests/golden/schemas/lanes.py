"""Golden corpus: a schedule lane that names its own slots and owners.

Reaches: ``ScheduleSlots(indices=...)`` through an optional parent (the schedule
resolves return where the scheduler's object holds none), ``ScheduleSlots(owners=...)``
apart from the forward ``owners``, the schedule lane's batch Protocol with a nested
object of its own beside the forward batch's, and late-bound tails (``resolve_tails``
takes the forward batch).
"""

import torch

from relay.schema import (
    Field,
    HostCopy,
    IfNone,
    Lane,
    Resolve,
    ScheduleSlots,
    Schema,
    Tails,
)

SCHEMA = Schema(
    name="LanesFutureMap",
    doc="Tokens for the forward, lengths for a scheduler that names its own slots.",
    owners="rids",
    schedule=ScheduleSlots(indices="lookup.slots", owners="request_ids"),
    optional_parents={"lookup": IfNone.SKIP},
    fields=[
        Field(
            "tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
            doc="The sampled token: placeholders in input_ids until resolved.",
        ),
        Field(
            "lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"),
            tails=Tails(rows="mix_running_indices"),
            doc="Sequence lengths, looked up by the scheduler's own slots.",
        ),
        Field(
            "drafts",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            shape=(2,),
            optional=True,
            target="draft_counts",
            host=HostCopy(mirror="draft_counts_cpu"),
            doc="Drafts made per request, on the host only.",
        ),
    ],
)
