"""vLLM 0.33's two hand-overs of sampled tokens and drafts, as reference models.

Written from what the release's model runners do (docs/integrating.md's vLLM section
describes it in relay's words): plain per-request state and per-position loops, no
buffers, streams or debug bookkeeping, nothing of relay's schema vocabulary. The
bundled ``vllm_v1_drafts`` and ``vllm_v2_drafts`` maps run beside them in lockstep
(``tests/faithful/``), which compares every ``input_ids`` the two build.

- ``V1Runner``: step N's sampled token and drafts live at step N's batch row; step
  N+1 finds a request's row through the previous step's row map (requests whose
  token was discarded, partial prefills, left out) and writes the token at the
  position before the request's scheduled drafts, then the drafts, into the flat
  int32 ``input_ids`` the host filled; every other position keeps the host's value
  (its -1 draft placeholders included, which the runner clamps to 0 later).
- ``V2Runner``: each request keeps one state row for its life holding its last
  sampled token and its drafts (columns past the step's draft count hold -1). For
  each request of step N+1 with ``n`` drafts scheduled (``num_logits = 1 + n``), the
  token goes at ``query_end - num_logits`` once the request's prefill is done
  (``seq_len - num_logits >= prefill_len``) and the drafts fill the last ``n``
  positions whenever ``seq_len > prefill_len``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["V1Runner", "V2Runner"]


class V1Runner:
    """vLLM V1's ``_prepare_input_ids`` under async scheduling."""

    def __init__(self) -> None:
        #: Step N's outputs by step-N row, and each request's step-N row.
        self.sampled: list[int] = []
        self.drafts: list[list[int]] = []
        self.prev_row: dict[object, int] = {}

    def sampled_step(
        self,
        req_ids: Sequence[object],
        sampled: Sequence[int],
        drafts: Sequence[Sequence[int]],
        discarded: Sequence[object] = (),
    ) -> None:
        """The end of step N: the batch's sampled tokens and drafts (every row has the
        step's draft width, maybe 0) by row; ``discarded`` requests (a partial prefill)
        sampled nothing and are left out of the row map."""
        self.sampled = list(sampled)
        self.drafts = [list(row) for row in drafts]
        self.prev_row = {
            rid: i for i, rid in enumerate(req_ids) if rid not in set(discarded)
        }

    def prepare_input_ids(
        self,
        req_ids: Sequence[object],
        cu_num_tokens: Sequence[int],
        scheduled_drafts: dict[object, int],
        host_ids: Sequence[int],
    ) -> list[int]:
        """Step N+1's ``input_ids`` before the clamp: the host's ids, then, for each
        request found in the row map, its token at ``cu_num_tokens[i] - 1 - d`` and
        its first ``d`` drafts after it (``d`` the drafts scheduled for it)."""
        ids = list(host_ids)
        for i, rid in enumerate(req_ids):
            prev = self.prev_row.get(rid)
            if prev is None:
                continue
            d = scheduled_drafts.get(rid, 0)
            last = cu_num_tokens[i] - 1
            ids[last - d] = self.sampled[prev]
            for j in range(d):
                ids[last - d + 1 + j] = self.drafts[prev][j]
        return ids

    @staticmethod
    def clamp(ids: Sequence[int]) -> list[int]:
        """What the model reads: the scheduler's -1 placeholders clamped to 0."""
        return [max(v, 0) for v in ids]


class V2Runner:
    """vLLM V2's per-request state and its combine of sampled and draft tokens."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.last_sampled: dict[object, int] = {}
        self.draft_tokens: dict[object, list[int]] = {}
        self.prefill_len: dict[object, int] = {}

    def add_request(self, rid: object, prefill_len: int) -> None:
        """A request takes a state row: its drafts start as zeros."""
        self.prefill_len[rid] = prefill_len
        self.draft_tokens[rid] = [0] * self.width
        self.last_sampled.setdefault(rid, 0)

    def remove_request(self, rid: object) -> None:
        self.prefill_len.pop(rid, None)
        self.draft_tokens.pop(rid, None)
        self.last_sampled.pop(rid, None)

    def post_update(self, rid: object, sampled: Sequence[int]) -> None:
        """After sampling: the last token sampled, when the request sampled any."""
        if sampled:
            self.last_sampled[rid] = sampled[-1]

    def set_drafts(self, rid: object, drafts: Sequence[int], count: int) -> None:
        """After the drafter: the row's drafts, the columns past ``count`` -1."""
        row = [*drafts[:count], *([-1] * (self.width - count))]
        self.draft_tokens[rid] = row[: self.width]

    def combine(
        self,
        req_ids: Sequence[object],
        query_start_loc: Sequence[int],
        seq_lens: Sequence[int],
        num_drafts: Sequence[int],
        ids: list[int],
    ) -> list[int]:
        """Step N+1's ``input_ids`` from the host-prepared ones (prompt tokens)."""
        ids = list(ids)
        for i, rid in enumerate(req_ids):
            n = num_drafts[i]
            num_logits = 1 + n
            end = query_start_loc[i + 1]
            start = end - num_logits
            seq_len = seq_lens[i]
            prefill = self.prefill_len[rid]
            if seq_len <= prefill:
                continue
            if seq_len - num_logits >= prefill:
                ids[start] = self.last_sampled[rid]
            for j in range(n):
                ids[end - n + j] = self.draft_tokens[rid][j]
        return ids
