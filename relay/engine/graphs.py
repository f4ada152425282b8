"""Decode forwards over static buffers, one set per batch-size bucket: captured once in a
CUDA graph and replayed on CUDA, run eagerly over the same buffers on the CPU.

A decode step's batch is copied into the smallest bucket that holds it, the rows past
it pointing at the scratch slot (Note [Padded rows]). Each mode's forward is two
phases with the publish between them (Note [Two phases around the publish]); the
relay's ``resolve_future`` is the first thing of the first phase unless the maps run
in debug mode, whose checks read values on the host (Note [The resolve inside the
graph]). Where the relay adopted buffers of its own (``Relay.written``), the forward
writes the relay's rows into them itself, as it runs (Note [Graph-written relay
buffers] in relays.py). Prefill, mixed batches and batches larger than the largest
bucket run the eager forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import Tensor

from relay.engine.batch import ForwardBatch, ForwardMode, SpecInfo, placeholders
from relay.engine.model import (
    Forwards,
    KVCache,
    ModelConfig,
    PackedDrafts,
    TargetModel,
    VerifyResult,
)
from relay.engine.relays import Extras, Relay, Written
from relay.engine.spec import SpecConfig

__all__ = ["GraphRunner", "StaticInputs", "buckets_for"]

# Note [Padded rows]
# A batch of n rows runs in the smallest bucket of size >= n. Rows n and on get slot 0,
# the scratch slot no request owns, length 1 and zero inputs: their attention reads
# and their cache writes land in the scratch slot's rows, and every other op of the
# forward is row by row, so the real rows' results are those of an unpadded batch.
# A resolve inside the graph gathers the scratch row of every relay buffer for them,
# which holds whatever was last written there (nothing, the capture's stash, or a
# padded row's own write into a graph-written buffer); the copy into the static
# inputs replaces those rows by zeros, so no garbage index reaches an embedding
# lookup.

# Note [Two phases around the publish]
# Speculative decoding publishes the new lengths mid-forward, after the verify and
# before the cache commit and the next draft (Note [Late-bound tails] in runner.py
# says why early). A publish records the map's fence, which a CUDA graph cannot
# hold, so each mode's forward is two graphs: the resolve and the verify (plain
# decoding: the decode), then the commit and the draft, with the publish and the
# stash between and after them, eagerly, over the real rows only. As sglang splits
# its target-verify and draft graphs.

# Note [The resolve inside the graph]
# A captured ``resolve_future`` replays the gathers it recorded, into the tensors it
# bound at capture (docs/gpu.md, "Using relay under CUDA graphs"): the static slots
# in, the static inputs out. Two things a replay does not redo: debug mode's checks
# (host reads; with debug on the resolve runs eagerly before the replay, over the
# real rows), and a map's seeds, applied on the host at its next resolve (the relay
# then resolves once eagerly before the replay, which applies them; the replay's
# gathers read the same rows again). Lazily allocated fields are stashed into the
# scratch slot before capture, so the capture sees their buffers.


def buckets_for(max_running: int) -> tuple[int, ...]:
    """Batch-size buckets up to ``max_running``: powers of two, and ``max_running``."""
    sizes = [1]
    while sizes[-1] * 2 < max_running:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] < max_running:
        sizes.append(max_running)
    return tuple(sizes)


@attrs.define(eq=False)
class StaticInputs:
    """One bucket's input buffers, written in place each step (Note [Padded rows])."""

    size: int
    #: (size,) slots, the real rows' then 0; lengths, theirs then 1; which are real.
    slots: Tensor
    seq_lens: Tensor
    real: Tensor
    #: (size,) input tokens (EAGLE and n-gram: the bonus token).
    tokens: Tensor
    #: EAGLE: (size, topk) draft probabilities and tokens, (size, hidden) draft state.
    topk_p: Tensor
    topk_index: Tensor
    hidden: Tensor
    #: n-gram: the previous step's accepted drafts, packed (size * steps,), and
    #: (size,) their count, (size,) each row's start, (size + 1,) every row's start and
    #: the end of the last (Note [Packed accepted drafts] in runner.py); the static
    #: batch's ``spec_info`` holds these very tensors.
    accept_tokens: Tensor
    accept_lens: Tensor
    accept_starts: Tensor
    accept_rows: Tensor
    #: The batch a resolve inside the graph reads (its slots and lengths are the
    #: buffers above) and writes.
    batch: ForwardBatch

    @classmethod
    def allocate(
        cls,
        size: int,
        model: ModelConfig,
        spec: SpecConfig | None,
        device: torch.device,
    ) -> StaticInputs:
        """Zeroed buffers for ``size`` rows, every row pointing at the scratch slot."""
        topk = spec.topk if spec is not None else 1
        steps = spec.steps if spec is not None else 1

        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        slots, seq_lens = zeros(size), zeros(size) + 1
        batch = ForwardBatch(
            ForwardMode.DECODE, [], slots, zeros(0), seq_lens, torch.ones(size).long()
        )
        info, rows = batch.spec_info, zeros(size + 1)
        info.accept_tokens, info.accept_lens = zeros(size * steps), zeros(size)
        info.accept_rows, info.accept_starts = rows, rows[:size]
        return cls(
            size=size,
            slots=slots,
            seq_lens=seq_lens,
            real=zeros(size, dtype=torch.bool),
            tokens=zeros(size),
            topk_p=zeros(size, topk, dtype=torch.float32),
            topk_index=zeros(size, topk),
            hidden=zeros(size, model.hidden, dtype=model.dtype),
            accept_tokens=info.accept_tokens,
            accept_lens=info.accept_lens,
            accept_starts=info.accept_starts,
            accept_rows=info.accept_rows,
            batch=batch,
        )

    def fill(self, batch: ForwardBatch) -> None:
        """Copy ``batch``'s slots and lengths in, pad the rest (on the forward stream:
        the previous step's replay may still read these buffers)."""
        n = len(batch)
        self.batch.reqs = batch.reqs  # the rows' requests, for relay's messages
        self.slots[:n].copy_(batch.req_pool_indices)
        self.slots[n:].zero_()
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.seq_lens[n:].fill_(1)
        self.real[:n].fill_(True)
        self.real[n:].fill_(False)

    def adopt(self, batch: ForwardBatch, spec: SpecConfig | None, rows: int) -> None:
        """Copy what a resolve wrote on ``batch`` into the inputs: ``rows`` of them
        (the real rows, after an eager resolve), the padded ones zeroed; or all
        ``size`` (a resolve of the static batch), the padded ones zeroed too."""
        if spec is None:
            pairs = [(self.tokens, batch.input_ids)]
        elif spec.method == "eagle":
            info = batch.spec_info
            assert info.hidden_states is not None, "decode before any prefill stashed"
            pairs = [
                (self.tokens, info.bonus_tokens),
                (self.topk_p, info.topk_p),
                (self.topk_index, info.topk_index),
                (self.hidden, info.hidden_states),
            ]
        else:
            info = batch.spec_info
            pairs = [(self.tokens, info.bonus_tokens)]
            if rows < self.size:  # the static batch's drafts are these buffers
                self._adopt_drafts(info, rows, spec.steps)
        for static, value in pairs:
            if rows == self.size:
                real = self.real.view(-1, *([1] * (static.dim() - 1)))
                static.copy_(torch.where(real, value, torch.zeros_like(value)))
            else:
                static[:rows].copy_(value)
                static[rows:].zero_()

    def lay_out_drafts(self, kv: KVCache, steps: int) -> None:
        """N-gram speculation: ``SpecInfo.lay_out_drafts`` of the static batch, in
        place, its padded rows counting 0 (Note [Padded rows])."""
        counts = kv.accepted(self.seq_lens, self.slots)
        self.accept_lens.copy_(torch.where(self.real, counts, 0))
        torch.cumsum(self.accept_lens, 0, out=self.accept_rows[1:])
        self.accept_tokens.copy_(placeholders(self.size * steps, self.accept_rows[-1:]))

    def _adopt_drafts(self, info: SpecInfo, rows: int, steps: int) -> None:
        """The packed drafts an eager resolve laid for ``rows`` real rows, the padded
        rows after them counting 0."""
        laid = rows * steps
        self.accept_tokens[:laid].copy_(info.accept_tokens)
        self.accept_tokens[laid:].zero_()
        self.accept_lens[:rows].copy_(info.accept_lens)
        self.accept_lens[rows:].zero_()
        self.accept_rows[: rows + 1].copy_(info.accept_rows)
        self.accept_rows[rows + 1 :].copy_(info.accept_rows[rows:])


def _write_verified(
    w: Written, slots: Tensor, seq_lens: Tensor, result: VerifyResult, steps: int
) -> None:
    """A verify's rows of ``w``: the bonus token, the new length, and n-gram's
    accepted drafts (what the commit phase would hand over, known already)."""
    assert w.new_seq_lens is not None
    w.tokens.index_copy_(0, slots, result.bonus)
    w.new_seq_lens.index_copy_(0, slots, seq_lens + result.accept_lens + 1)
    if w.accept_tokens is not None:
        w.accept_tokens.index_copy_(0, slots, result.tokens[:, :steps])


@attrs.define(eq=False)
class _Bucket:
    """One bucket's inputs, its phases' outputs, and their graphs (CUDA)."""

    inputs: StaticInputs
    verified: VerifyResult | None = None
    next_tokens: Tensor | None = None
    extras: Extras = ()
    graphs: list[Any] = attrs.field(factory=list)
    #: Steps run in this bucket.
    runs: int = 0


class GraphRunner:
    """Decode, EAGLE verify and draft, and n-gram verify forwards over static buffers
    per bucket (``buckets_for``): captured in CUDA graphs by ``capture`` on CUDA,
    run eagerly over the same buffers on the CPU. ``resolve_inside``: the relay's
    ``resolve_future`` runs in the first phase (Note [The resolve inside the graph]);
    the phases write the relay's rows into ``relay.written`` where it is not ``None``
    (Note [Graph-written relay buffers] in relays.py)."""

    def __init__(
        self,
        model: TargetModel,
        kv: KVCache,
        forwards: Forwards,
        relay: Relay,
        spec: SpecConfig | None,
        buckets: tuple[int, ...],
        *,
        resolve_inside: bool,
    ) -> None:
        self.spec = spec
        self.relay = relay
        self.kv = kv
        self.resolve_inside = resolve_inside
        #: The relay's buffers each phase writes its rows into, or ``None``.
        self.written = relay.written
        self.device = model.device
        self.captures = self.device.type == "cuda"
        # TorchScript's profiling executor may rewrite a function after its first
        # calls; a captured graph needs none of it, so CUDA runs the eager module.
        self.forwards = (
            forwards
            if not self.captures
            else Forwards(model, kv, forwards.draft, compiled=False)
        )
        #: The attention width of every bucket: a graph's shapes are fixed.
        self.width = model.config.max_context
        self.buckets = {
            size: _Bucket(StaticInputs.allocate(size, model.config, spec, self.device))
            for size in buckets
        }
        self._pool: Any = None
        #: Decode steps that ran eagerly (a mixed batch, or more rows than a bucket).
        self.eager_steps = 0

    def bucket_for(self, batch: ForwardBatch) -> int | None:
        """The bucket ``batch`` runs in, or ``None`` where it runs eagerly."""
        if batch.chunk is not None or batch.mix_running_indices.numel():
            return None
        return next((s for s in sorted(self.buckets) if s >= len(batch)), None)

    @property
    def runs(self) -> dict[int, int]:
        """Steps run per bucket size."""
        return {size: b.runs for size, b in self.buckets.items()}

    # -- the phases ----------------------------------------------------------------

    def _locations(self, s: StaticInputs) -> Tensor:
        """Each row's KV write location, read from the request-to-token table at its
        length (Note [The request-to-token table] in model.py); a padded row's is the
        scratch slot's first."""
        return self.forwards.req_to_token[s.slots, s.seq_lens - 1]

    def _phase_one(self, b: _Bucket) -> None:
        """The resolve (inside) and the decode or verify, into the bucket's outputs."""
        s, spec, fw = b.inputs, self.spec, self.forwards
        if self.resolve_inside:
            if spec is not None and spec.method == "ngram":
                s.lay_out_drafts(self.kv, spec.steps)
            self.relay.resolve_future(s.batch)
            s.adopt(s.batch, spec, s.size)
        w = self.written
        if spec is None:
            at = self._locations(s)
            _, b.next_tokens = fw.decode(s.tokens, s.seq_lens, self.width, s.slots, at)
            if w is not None:
                w.tokens.index_copy_(0, s.slots, b.next_tokens)
            return
        if spec.method == "eagle":
            b.verified = fw.draft_and_verify(
                s.tokens,
                s.hidden,
                s.topk_index,
                spec.steps,
                s.seq_lens,
                self.width,
                s.slots,
            )
        else:
            drafts = PackedDrafts(
                s.accept_tokens, s.accept_starts, s.accept_lens, spec.steps
            )
            b.verified = fw.ngram_verify(
                s.tokens,
                drafts,
                s.seq_lens,
                self.width,
                s.slots,
                spec.variable_drafts,
            )
        if w is not None:
            _write_verified(w, s.slots, s.seq_lens, b.verified, spec.steps)

    def _phase_two(self, b: _Bucket) -> None:
        """The cache commit and (EAGLE) the next draft."""
        s, spec, result = b.inputs, self.spec, b.verified
        assert spec is not None and result is not None
        if spec.method == "eagle":
            b.extras = self.forwards.commit_and_extend(
                result, self._locations(s), spec.topk
            )
            w = self.written
            if w is not None:
                assert w.topk_p is not None and w.topk_index is not None
                w.topk_p.index_copy_(0, s.slots, b.extras[0])
                w.topk_index.index_copy_(0, s.slots, b.extras[1])
        else:
            self.forwards.commit(result, self._locations(s))
            # With ``written``, phase one wrote the drafts; their counts go with the
            # stash either way.
            b.extras = (result.tokens[:, : spec.steps], result.accept_lens.int())

    def _phases(self) -> list[Callable[[_Bucket], None]]:
        if self.spec is None:
            return [self._phase_one]
        return [self._phase_one, self._phase_two]

    # -- capture (CUDA) ------------------------------------------------------------

    def capture(self, scratch_stash: Callable[[], None]) -> None:
        """CUDA: capture every bucket's phases once, largest first, all rows on the
        scratch slot; ``scratch_stash`` stashes the scratch slot first where the
        resolve is captured, so lazily allocated relay buffers exist. On the CPU nothing is captured."""
        if not self.captures:
            return
        if self.resolve_inside:
            scratch_stash()
        cuda: Any = torch.cuda
        self._pool = cuda.graph_pool_handle()
        for size in sorted(self.buckets, reverse=True):
            b = self.buckets[size]
            for phase in self._phases():
                side = cuda.Stream(self.device)
                side.wait_stream(cuda.current_stream(self.device))
                with cuda.stream(side):
                    phase(b)  # a warm-up run: lazy inits happen outside the capture
                cuda.current_stream(self.device).wait_stream(side)
                graph = cuda.CUDAGraph()
                with cuda.graph(graph, pool=self._pool):
                    phase(b)
                # A capture runs nothing: replay once, so the next phase's warm-up
                # reads real values (all rows on the scratch slot).
                graph.replay()
                b.graphs.append(graph)
        cuda.synchronize(self.device)

    @property
    def graphs(self) -> int:
        """CUDA graphs captured."""
        return sum(len(b.graphs) for b in self.buckets.values())

    # -- a step ------------------------------------------------------------------

    def run_phase(self, size: int, phase: int) -> None:
        """Run phase ``phase`` (0 or 1) of bucket ``size``: replay its graph, or run it."""
        b = self.buckets[size]
        if phase == 0:
            b.runs += 1
        if b.graphs:
            b.graphs[phase].replay()
        else:
            self._phases()[phase](b)

    def inputs(self, size: int) -> StaticInputs:
        """Bucket ``size``'s static inputs."""
        return self.buckets[size].inputs

    def next_tokens(self, size: int, rows: int) -> Tensor:
        """Plain decoding: the first ``rows`` sampled tokens of the last phase one."""
        tokens = self.buckets[size].next_tokens
        assert tokens is not None
        return tokens[:rows]

    def verified(self, size: int, rows: int) -> VerifyResult:
        """Speculative decoding: the first ``rows`` of the last verify."""
        r = self.buckets[size].verified
        assert r is not None
        return VerifyResult(
            r.tokens[:rows],
            r.accept_lens[:rows],
            r.bonus[:rows],
            r.hidden[:rows],
            r.branch_k[:, :rows],
            r.branch_v[:, :rows],
        )

    def extras(self, size: int, rows: int) -> Extras:
        """Speculative decoding: the first ``rows`` of what the last phase two hands
        the next step."""
        return tuple(e[:rows] for e in self.buckets[size].extras)
