"""Relay of EAGLE speculative decoding with its extras, faithful to sglang 0.5.23."""

import torch

from relay.schema import (
    Alloc,
    Carried,
    Field,
    Guard,
    HostCopy,
    IfNone,
    Lane,
    Schema,
    Staged,
    Switch,
    Tails,
    TailsKv,
    extra,
)

SCHEMA = Schema(
    name="SglangEagleFutureMap",
    doc="""Relay of EAGLE-family speculation as sglang 0.5.23 relays it (docs/sglang.md).

    Verification publishes the new lengths (and, with a ragged verify, a confidence
    per draft token) for the scheduler; the end of the step stashes the bonus token
    and the draft's extras (top-k, hidden state, draft probabilities, the sparse
    indexer's KV positions) for the next step's draft input, which gathers them by
    its ``future_indices``. Each extra is allocated by the first payload that carries
    it, with that payload's dtype and row; the top-k pair and the hidden state only by
    a map built to relay them (``need_topk``, ``need_hidden_states``: the algorithm
    decides). A batch with no draft input is left alone. A request leaving a staging
    area gets a fresh draft input from ``make_staged_spec_input``. Debug mode names
    each row's request from the batch's ``reqs`` (sglang's request objects, by ``rid``).
    """,
    indices="spec_info.future_indices",
    owners="reqs",
    optional_parents={
        "spec_info": IfNone.SKIP,
        "spec_info.future_indices": IfNone.SKIP,
    },
    staged=Staged("make_staged_spec_input"),
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
        extra(
            "topk_p",
            shape=("topk",),
            target="spec_info.topk_p",
            gate=Switch("need_topk"),
            doc="Probabilities of the draft's first top-k candidates (relayed where the "
            "algorithm drafts with them).",
        ),
        extra(
            "topk_index",
            shape=("topk",),
            target="spec_info.topk_index",
            gate=Switch("need_topk"),
            doc="Token ids of the draft's first top-k candidates (relayed with "
            "``topk_p``).",
        ),
        extra(
            "hidden_states",
            shape=("hidden",),
            target="spec_info.hidden_states",
            gate=Switch("need_hidden_states"),
            doc="The target model's last hidden state (relayed where the draft model "
            "reads it).",
        ),
        extra(
            "draft_probs",
            shape=("vocab",),
            target="spec_info.draft_probs",
            gate=Carried("topk_p"),
            doc="The draft's probabilities over the vocabulary, for rejection sampling "
            "(read only beside the top-k candidates, as sglang reads them).",
        ),
        extra(
            "dsa_topk_indices",
            shape=("dsa_topk",),
            target="spec_info.dsa_topk_indices",
            gate="spec_info.future_dsa_topk_indices_available",
            doc="KV positions the sparse-attention indexer selected for each request "
            "(read only where the draft input says its rows hold them).",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(
                mirror="seq_lens_cpu",
                sum="seq_lens_sum",
                stream_ordered=True,
                optional=True,
            ),
            guard=Guard.NON_NEGATIVE,
            graph_written=True,
            tails=Tails(
                rows="mix_running_indices",
                kv=TailsKv(locations="out_cache_loc", table="req_to_token"),
                prefix="prefix_lens",
            ),
            doc="Each request's sequence length after verification (accepted tokens "
            "included).",
        ),
        Field(
            "confidence",
            lane=Lane.SCHEDULE,
            dtype=torch.float32,
            shape=("draft_tokens",),
            alloc=Alloc.LAZY,
            optional=True,
            target="confidence",
            host=HostCopy(mirror="confidence_cpu"),
            doc="The draft's confidence in each of its tokens, as verification "
            "measured it (a ragged verify only).",
        ),
    ],
)
