"""Relay of multi-layer EAGLE: the draft model runs its own layers, so no hidden states."""

from relay.schema import Schema

EAGLE = Schema.load("eagle.py")

SCHEMA = EAGLE.derive(
    name="EagleMultiLayerFutureMap",
    doc="""Relay of multi-layer EAGLE speculative decoding.

    The draft is a small model of its own layers and does not read the target's
    hidden states, so only the bonus token, the first top-k and the new sequence
    lengths cross the step boundary.
    """,
    drop=["hidden_states"],
)
