"""vLLM 0.33's V2 hand-over of sampled tokens and drafts through the bundled
``vllm_v2_drafts`` map: the engine glue of docs/integrating.md's worked example.

``V2Relay`` replaces the runner's ``last_sampled_tokens`` and ``draft_tokens`` state
and the token/draft half of its combine kernel; everything it takes is what the runner
already has on the device: ``b`` is the runner's input batch (``req_ids``,
``query_start_loc``, ``seq_lens``, ``num_draft_tokens``, per row), ``prefill_len`` its
rows' prefill lengths. Tokens and drafts stay int64, as the runner's state holds them:
the map casts them into the int32 ``input_ids``. relay's slots start at 1 (row 0 is
the scratch row). ``tests/faithful/test_vllm_faithful.py`` runs it against a model of
the runner's own combine.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from relay.maps.vllm_v2_drafts import VllmV2DraftsFutureMap as Map
from relay.maps.vllm_v2_drafts import VllmV2DraftsPayload as Payload
from relay.slots import SlotTable
from relay.testing import Namespace


# -- engine glue (docs/integrating.md counts these lines) -------------------------------
class V2Relay:
    def __init__(self, device: str, reqs: int, k: int, debug: bool) -> None:
        self.k = k
        self.map = Map(device, reqs + 1, num_speculative_tokens=k, debug=debug)
        self.slots = SlotTable(reqs + 1, [self.map], device=device)

    def add_request(self, rid: str) -> None:  # the runner zeroes a new row's drafts
        zeros = torch.zeros((1, self.k), dtype=torch.int64)
        seed = Payload(
            sampled_token_ids=None,
            draft_token_ids=zeros,
            num_draft_tokens=torch.tensor([self.k]),
        )
        self.map.seed(torch.tensor([self.slots.take(rid)]), seed, owners=[rid])

    def combine(self, input_ids: Tensor, b: Any, prefill_len: Tensor) -> None:
        num_logits = 1 + b.num_draft_tokens
        self.map.resolve_future(
            Namespace(
                slots=self.slots.indices(b.req_ids),
                req_ids=b.req_ids,
                input_ids=input_ids,
                query_start_loc=b.query_start_loc,
                logits_starts=b.query_start_loc[1:] - num_logits,
                sampled_ready=b.seq_lens - num_logits >= prefill_len,
                num_draft_tokens=b.num_draft_tokens * (b.seq_lens > prefill_len),
            )
        )

    def post_update(
        self, b: Any, last: Tensor, n_sampled: Tensor, drafts: Tensor, n_spec: int
    ) -> None:  # drafts: -1 past n_spec, as V2 keeps them
        counts = torch.full((len(b.req_ids),), n_spec, dtype=torch.int32)
        sampled = n_sampled > 0  # a request that sampled none keeps its token
        for rows, tokens in ((sampled, last[sampled]), (~sampled, None)):
            rids = [r for r, kept in zip(b.req_ids, rows.tolist()) if kept]
            payload = Payload(
                sampled_token_ids=tokens,
                draft_token_ids=drafts[rows],
                num_draft_tokens=counts[rows],
            )
            self.map.stash(self.slots.indices(rids), payload, owners=rids)


# -- end of engine glue -------------------------------------------------------------------
