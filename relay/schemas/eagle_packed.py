"""Relay of EAGLE speculative decoding, packed: one gather per dtype."""

import attrs

from relay.schema import Layout, Schema

EAGLE = Schema.load("eagle.py")

SCHEMA = EAGLE.derive(
    name="EaglePackedFutureMap",
    doc="""Relay of EAGLE speculative decoding with the packed layout: one gather per dtype.

    The same relay as ``eagle``, but the bonus token and the top-k token ids (both
    int64) share one ``(pool_size, 1 + topk)`` buffer, so the next step's draft
    input is resolved with one gather for both (three gathers in all with hidden
    states, against four). Pick it where the forward-side resolve's launches count
    (small batches on a GPU, the latency case); the batch then gets ``bonus_tokens``
    and ``topk_index`` as views of one gathered block, not contiguous tensors, so
    pick ``eagle`` where the draft's kernels need them contiguous.
    """,
    layout=Layout.PACKED,
    # A packed buffer is the map's own, so no graph may write the fields it packs;
    # the lengths stay the map's to write too (an engine whose graphs write the
    # relay's rows picks ``eagle``).
    replace=[
        attrs.evolve(EAGLE.field(f.name), graph_written=False)
        for f in EAGLE.fields
        if f.graph_written
    ],
)
