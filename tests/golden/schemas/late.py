"""Golden corpus: what a relay leaves to others and binds late.

Reaches: a graph-written field on each lane (the constructor adopts the engine's
buffers, writes pass None, ``graph_wrote``), kept fields (``stash_partial``, an
optional kept field left out of ``stash``), a stream-ordered schedule resolve, and
late-bound tails with KV locations, a host mirror and a host sum (``resolve_tails``).
"""

import torch

from relay.schema import (
    FROM_PAYLOAD,
    Alloc,
    Field,
    HostCopy,
    Lane,
    Schema,
    Tails,
    TailsKv,
)

SCHEMA = Schema(
    name="LateFutureMap",
    doc="A relay whose graph writes some rows and whose mixed batches bind tails late.",
    owners="rids",
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="bonus_tokens",
            target="spec_info.bonus_tokens",
            graph_written=True,
            doc="The bonus token, scattered by the verify graph where it ran.",
        ),
        Field(
            "topk_p",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("topk",),
            target="spec_info.topk_p",
            kept=True,
            doc="Kept through a partial stash.",
        ),
        Field(
            "hidden_states",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            shape=("hidden",),
            alloc=Alloc.LAZY,
            optional=True,
            kept=True,
            target="spec_info.hidden_states",
            doc="Kept when a stash leaves it out.",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(
                mirror="seq_lens_cpu", sum="seq_lens_sum", stream_ordered=True
            ),
            graph_written=True,
            tails=Tails(
                rows="mix_running_indices",
                kv=TailsKv(locations="out_cache_loc", table="req_to_token"),
                prefix="prefix_lens",
            ),
            doc="Lengths after verification; late-bound into mixed batches' tails.",
        ),
    ],
)
