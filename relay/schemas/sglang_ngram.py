"""Relay of n-gram speculative decoding, faithful to sglang 0.5.23's FutureMap."""

import torch

from relay.schema import (
    FROM_PAYLOAD,
    Alloc,
    Field,
    Guard,
    HostCopy,
    IfNone,
    Lane,
    Schema,
    TargetShape,
    Unwritten,
)

SCHEMA = Schema(
    name="SglangNgramFutureMap",
    doc="""Relay of n-gram speculation as sglang 0.5.23 relays it (docs/sglang.md).

    A verify step stashes the drafts the target accepted and how many, by the draft
    input's ``future_indices``; the next step gathers them into its draft input,
    the drafts flattened to one dimension. No bonus token is relayed. Both buffers
    are allocated by the first stash, with its dtypes, and read as zeros until a
    row is first written (accept length 0). A batch with no draft input is left
    alone. The accepted lengths are published right after verification, and the
    scheduler reads them behind the fence, on the device and on the host. With no
    bonus token to gather there is no mixed batch (sglang turns mixed chunked
    prefill off for n-gram), so no late-bound tails either. Debug mode names each
    row's request from the batch's ``reqs`` (sglang's request objects, by ``rid``).
    """,
    indices="spec_info.future_indices",
    owners="reqs",
    optional_parents={
        "spec_info": IfNone.SKIP,
        "spec_info.future_indices": IfNone.SKIP,
    },
    fields=[
        Field(
            "accept_tokens",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            shape=("draft_token_num",),
            alloc=Alloc.LAZY,
            target="spec_info.accept_tokens",
            target_shape=TargetShape.FLAT,
            unwritten=Unwritten.ZEROS,
            doc="The drafts the target accepted, left-aligned; only the first "
            "``accept_lens`` of a request's are meaningful.",
        ),
        Field(
            "accept_lens",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            alloc=Alloc.LAZY,
            target="spec_info.accept_lens",
            unwritten=Unwritten.ZEROS,
            doc="How many drafts the target accepted (0 in a row never verified).",
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            host=HostCopy(
                mirror="seq_lens_cpu", sum="seq_lens_sum", stream_ordered=True
            ),
            guard=Guard.NON_NEGATIVE,
            doc="Each request's sequence length after verification (accepted tokens "
            "included).",
        ),
    ],
)
