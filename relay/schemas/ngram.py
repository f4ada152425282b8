"""Relay of n-gram speculative decoding, as the reference engine relays it (sglang's own
relay, call for call, is ``sglang_ngram``)."""

import torch

from relay.schema import (
    BatchRows,
    Field,
    Guard,
    HostCopy,
    IfNone,
    Lane,
    Scatter,
    Schema,
    Tails,
    TailsKv,
    Unwritten,
)

SCHEMA = Schema(
    name="NgramFutureMap",
    doc="""Relay of n-gram speculative decoding: what a verify step hands the next.

    The drafts come from n-gram matches in each request's own context, with no draft
    model. A verify step stashes the drafts the target accepted (``accept_tokens``,
    with their count ``accept_lens``) and the bonus token; the next step gathers the
    bonus into its draft input (``spec_info``) and lays the accepted drafts into it
    packed, each request's from the start and for the count its batch laid out,
    then appends them to the request's context and matches its n-grams there. A row
    no verify step has written reads zeros, and a batch without speculative state
    (``spec_info`` is None, as in prefill) is left alone. The new lengths are
    published right after verification.
    """,
    optional_parents={"spec_info": IfNone.SKIP},
    seeded=True,
    owners="rids",
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="bonus_tokens",
            target="spec_info.bonus_tokens",
            guard=Guard.NON_NEGATIVE,
            graph_written=True,
            doc="The bonus token: the target model's token after the accepted drafts.",
        ),
        Field(
            "accept_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("draft_token_num",),
            target="spec_info.accept_tokens",
            resolve=Scatter(
                offsets="spec_info.accept_starts",
                lengths="spec_info.accept_lens",
                rows=BatchRows(starts="spec_info.accept_rows"),
            ),
            unwritten=Unwritten.ZEROS,
            guard=Guard.NON_NEGATIVE,
            graph_written=True,
            doc="The drafts the target accepted, left-aligned; each request's "
            "first ``accept_lens`` are laid into the packed ``spec_info.accept_tokens`` "
            "from its start offset (its row of ``spec_info.accept_rows``).",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"),
            guard=Guard.POSITIVE,
            # add=0: the published length counts the token a row decodes now, whose
            # KV goes at column ``length - 1`` of the slot's row
            tails=Tails(
                rows="mix_running_indices",
                add=0,
                kv=TailsKv(locations="out_cache_loc", table="req_to_token"),
            ),
            graph_written=True,
            doc="Each request's sequence length after verification (accepted tokens "
            "included); a mixed batch's decode rows bind it late, and their KV write "
            "locations with it (resolve_tails).",
        ),
    ],
)
