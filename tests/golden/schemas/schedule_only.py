"""Golden corpus: a schedule lane alone (no forward lane, no payload class, no stash).

Reaches: several schedule fields (one resolve method each, one fence with several
consumers), a schedule-lane placeholder, a host sum without a host mirror (on a
placeholder and on a gather), a host mirror without a sum, a required lazy schedule
field, an optional schedule field (a keyword of ``publish`` that defaults to None),
and a custom ``indices``.
"""

import torch

from relay.schema import Alloc, Field, Guard, HostCopy, Lane, Resolve, Schema

SCHEMA = Schema(
    name="ScheduleOnlyFutureMap",
    doc="Lengths and scores the scheduler reads behind the fence.",
    indices="slots",
    fields=[
        Field(
            "lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            resolve=Resolve.PLACEHOLDER,
            host=HostCopy(sum="seq_lens_sum"),
            guard=Guard.POSITIVE,
            doc="Sequence lengths; placeholders in seq_lens until resolved.",
        ),
        Field(
            "score",
            lane=Lane.SCHEDULE,
            dtype=torch.float32,
            shape=(4,),
            target="scores",
            host=HostCopy(mirror="scores_cpu"),
            optional=True,
        ),
        Field(
            "accepted",
            lane=Lane.SCHEDULE,
            dtype=torch.int32,
            alloc=Alloc.LAZY,
            target="stats.accepted",
            host=HostCopy(sum="stats.accepted_sum"),
            doc="Allocated on the first publish that carries it.",
        ),
    ],
)
