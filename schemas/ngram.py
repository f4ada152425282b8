"""Relay of n-gram speculative decoding."""

import torch

from relay.schema import Field, Guard, Lane, Schema

# Two declarations of the schema language will replace conventions this file relies
# on today:
# - ``accept_tokens`` and ``accept_lens`` must read as zeros in a row no stash has
#   written yet (an accept length of 0). Today they are eager buffers, which start
#   at zero with debug off; an engine stashes zeros for them explicitly at prefill.
#   A field-level declaration that rows read before their first write are zeros goes
#   on both fields.
# - ``accept_tokens`` is (pool x draft_token_num); a target-shape declaration that
#   flattens the row dimension into the batch dimension goes on it, for engines whose
#   verify input is one flat token vector.
# - ``spec_info`` may be ``None`` on a batch that carries no speculative state; an
#   optional-parent declaration goes on the ``spec_info.*`` targets.

SCHEMA = Schema(
    name="NgramFutureMap",
    doc="""Relay of n-gram speculative decoding: what a verify step hands the next.

    The drafts come from n-gram matches in each request's own context, with no draft
    model. A verify step stashes the drafts the target accepted (``accept_tokens``,
    ``accept_lens``) and the bonus token; the next step gathers them into its draft
    input (``spec_info``), appends them to the request's context and matches its
    n-grams there. A row that no verify step has written reads accept length 0. The
    accepted lengths are published right after verification, as in EAGLE.
    """,
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="bonus_tokens",
            target="spec_info.bonus_tokens",
            guard=Guard.NON_NEGATIVE,
            doc="The bonus token: the target model's token after the accepted drafts.",
        ),
        Field(
            "accept_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("draft_token_num",),
            target="spec_info.accept_tokens",
            guard=Guard.NON_NEGATIVE,
            doc="The drafts the target accepted, left-aligned; only the first "
            "``accept_lens`` of a row are meaningful.",
        ),
        Field(
            "accept_lens",
            lane=Lane.FORWARD,
            dtype=torch.int32,
            target="spec_info.accept_lens",
            guard=Guard.NON_NEGATIVE,
            doc="How many drafts the target accepted (0 in a row never verified).",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host_mirror="seq_lens_cpu",
            host_sum="seq_lens_sum",
            guard=Guard.POSITIVE,
            doc="Each request's sequence length after verification (accepted tokens "
            "included).",
        ),
    ],
)
