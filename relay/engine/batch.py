"""Requests and the batches the scheduler hands to the forward.

``ForwardBatch`` fits the generated ``DecodeBatch`` and ``EagleBatch`` protocols
structurally; mypy checks that where the engine passes it to a map.
"""

from __future__ import annotations

import enum

import attrs
import torch
from torch import Tensor

from relay.engine.model import PackedDrafts
from relay.engine.workload import RequestSpec

__all__ = ["ForwardBatch", "ForwardMode", "Request", "RequestState", "Seeds"]
__all__ += ["SpecInfo", "StepOutput", "placeholders"]


class RequestState(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    #: Holds a slot; its prompt is prefilled in chunks, not all of it yet.
    PREFILLING = "prefilling"
    RUNNING = "running"
    #: At its output limit: no longer scheduled, finished when its last results arrive.
    CAPPED = "capped"
    FINISHED = "finished"


@attrs.define(eq=False)
class Request:
    """A request's scheduler-side state."""

    spec: RequestSpec
    slot: int = 0
    state: RequestState = RequestState.WAITING
    output: list[int] = attrs.field(factory=list)
    text: list[str] = attrs.field(factory=list)
    #: Sequence length after the newest processed step (host).
    seq_len: int = 0
    finish_reason: str | None = None
    #: KV pages reserved at admission (when admission reserves the worst case) and
    #: pages allocated so far.
    reserved_pages: int = 0
    pages: int = 0
    #: What a prefill must put in the cache: the prompt, or after a retraction the
    #: prompt and the tokens output so far (fixed when it is retracted).
    context: tuple[int, ...] = ()
    #: Tokens of ``context`` prefilled so far (chunked prefill).
    prefilled: int = 0
    #: Bumped by each retraction: rows of batches built before it are stale (Note
    #: [Rows of a retracted request]).
    epoch: int = 0


class ForwardMode(enum.Enum):
    """What a forward does."""

    PREFILL = "prefill"
    DECODE = "decode"
    #: A data-parallel rank with no requests this step: empty operations only.
    IDLE = "idle"


def _empty(dtype: torch.dtype = torch.int64) -> Tensor:
    return torch.empty(0, dtype=dtype)


def placeholders(size: int, end: Tensor) -> Tensor:
    """(size,) int64: -1 before ``end`` (a one-element tensor), 0 from it on."""
    positions = torch.arange(size, device=end.device)
    return torch.where(positions < end, -1, 0)


@attrs.define(eq=False)
class SpecInfo:
    """Speculative-decoding inputs of a batch, filled by the relay on the forward stream."""

    topk_p: Tensor = attrs.field(factory=lambda: _empty(torch.float32))
    topk_index: Tensor = attrs.field(factory=_empty)
    hidden_states: Tensor | None = None
    #: (n,) the bonus token of the previous verify: the draft's first input token.
    bonus_tokens: Tensor = attrs.field(factory=_empty)
    #: N-gram speculation: the previous verify's accepted drafts, appended to each
    #: request's context before matching, packed (Note [Packed accepted drafts] in
    #: relay/engine/runner.py): (n * draft_token_num,), row i's ``accept_lens[i]``
    #: from ``accept_starts[i]``; ``accept_rows`` is (n + 1,), every row's start and
    #: then the end of the last.
    accept_tokens: Tensor = attrs.field(factory=_empty)
    accept_lens: Tensor = attrs.field(factory=_empty)
    accept_starts: Tensor = attrs.field(factory=_empty)
    accept_rows: Tensor = attrs.field(factory=_empty)

    def lay_out_drafts(self, counts: Tensor, width: int) -> None:
        """Each row's count of accepted drafts: the packed layout the relay lays them
        into, on the counts' device (no host read), and its target: placeholders (-1)
        where the drafts go, zeros past them (Note [Scatter destinations] in
        relay/runtime.py)."""
        n = counts.shape[0]
        rows = counts.new_zeros(n + 1)
        torch.cumsum(counts, 0, out=rows[1:])
        self.accept_lens, self.accept_rows, self.accept_starts = counts, rows, rows[:n]
        self.accept_tokens = placeholders(n * width, rows[n:])

    def drafts(self, width: int) -> PackedDrafts:
        """The accepted drafts as the n-gram verify reads them."""
        return PackedDrafts(
            self.accept_tokens, self.accept_starts, self.accept_lens, width
        )


@attrs.define(eq=False)
class ForwardBatch:
    """One forward's inputs. The scheduler builds it; after launch only the forward touches it."""

    mode: ForwardMode
    reqs: list[Request]
    #: (n,) int64 device slots, >= 1.
    req_pool_indices: Tensor
    #: Prefill: right-padded prompts (n, L). Decode: (n,) input tokens, gathered by
    #: the relay at the start of the forward (empty until then).
    input_ids: Tensor
    #: Prefill: prompt lengths. Decode: lengths including the input token, set by
    #: the relay before launch (empty until then).
    seq_lens: Tensor
    seq_lens_cpu: Tensor
    seq_lens_sum: int = 0
    spec_info: SpecInfo = attrs.field(factory=SpecInfo)
    #: Host maximum of ``seq_lens``: the attention width.
    max_seq_len: int = 0
    #: Slots whose requests ended since the previous launch, released on the forward
    #: stream before this batch runs (after every forward that could still read them).
    released: Tensor | None = None
    #: The engine loop's step number (names the step's trace ranges).
    step: int = 0
    #: Each row's ``Request.epoch`` when the batch was built.
    epochs: list[int] = attrs.field(factory=list)
    #: Prefill: where each row's chunk starts in its context (device), its length
    #: (device), and whether it is the context's last chunk (host): only those rows
    #: produce a token.
    starts: Tensor | None = None
    chunk_lens: Tensor | None = None
    final: list[bool] = attrs.field(factory=list)
    #: Decode with mixed batches: a prefill chunk that rides in the same forward.
    chunk: ForwardBatch | None = None
    #: A mixed batch whose decode rows the forward binds late: their slots (all rows
    #: are tails); empty otherwise (Note [Late-bound tails] in relay/engine/runner.py).
    mix_running_indices: Tensor = attrs.field(factory=_empty)
    #: Decode: (n,) where each row's new token's keys and values go, read from
    #: ``req_to_token`` at the row's length, in the forward (bound by the map with the
    #: lengths in a mixed batch whose lengths are bound late); empty until then (Note
    #: [The request-to-token table] in relay/engine/model.py).
    out_cache_loc: Tensor = attrs.field(factory=_empty)
    #: Decode: the KV cache's request-to-token table (pool_size, max_context), set by
    #: the forward before it resolves.
    req_to_token: Tensor = attrs.field(factory=lambda: _empty().view(0, 0))

    @classmethod
    def idle(cls, device: torch.device) -> ForwardBatch:
        """A batch with no requests: every relay operation on it is a no-op."""
        empty = _empty().to(device)
        return cls(ForwardMode.IDLE, [], empty, empty, empty, _empty())

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def rids(self) -> list[int]:
        """Each row's request id, by which relay's messages name it; -1 for a row past
        the batch's requests (a static bucket's padded rows, Note [Padded rows] in
        relay/engine/graphs.py)."""
        rids = [req.spec.rid for req in self.reqs]
        padded = self.req_pool_indices.numel() - len(rids)
        return rids + [-1] * padded if padded > 0 else rids

    def select(self, kept: list[int]) -> None:
        """Keep rows ``kept`` only (after the fence)."""
        rows_cpu = torch.tensor(kept, dtype=torch.int64)
        rows = rows_cpu.to(self.req_pool_indices.device)
        self.reqs = [self.reqs[i] for i in kept]
        self.epochs = [self.epochs[i] for i in kept]
        self.req_pool_indices = self.req_pool_indices[rows]
        self.seq_lens = self.seq_lens[rows]
        self.seq_lens_cpu = self.seq_lens_cpu[rows_cpu]
        self.seq_lens_sum = int(self.seq_lens_cpu.sum())


@attrs.define(eq=False)
class Seeds:
    """Prebuilt requests to seed before the next forward, on the forward stream."""

    #: (m,) device slots; (m, L) right-padded prompts and (m,) their lengths, whose KV
    #: arrives from the prefill server; (m,) the first tokens it sampled.
    slots: Tensor
    prompts: Tensor
    prompt_lens: Tensor
    first_tokens: Tensor
    #: Slots freed since the last launch, released before the seed is written.
    released: Tensor


@attrs.define(eq=False)
class StepOutput:
    """What a forward leaves for the scheduler, on the host, once the step is done:
    (n, width) tokens, of which row i's first ``counts[i]`` are its new output tokens,
    and (n,) sequence lengths after the step."""

    tokens: Tensor | None = None
    counts: Tensor | None = None
    new_seq_lens: Tensor | None = None
    #: The results of a mixed batch's prefill chunk.
    chunk: StepOutput | None = None
