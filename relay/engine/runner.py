"""The forward of one step, as it runs on the forward executor: it resolves the
relay (decode rows only, in a mixed batch), publishes the new lengths as soon as
they exist, stashes what the next forward needs and copies its results to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import torch
from torch import Tensor

from relay.engine import trace
from relay.engine.batch import ForwardBatch, ForwardMode, Seeds, StepOutput
from relay.engine.graphs import GraphRunner
from relay.engine.model import (
    DraftHead,
    Forwards,
    KVCache,
    PackedDrafts,
    TargetModel,
    VerifyResult,
)
from relay.engine.spec import SpecConfig
from relay.engine.trace import Ranges, no_ranges

if TYPE_CHECKING:  # no map is imported with the engine
    from relay.engine.relays import Extras, Relay

__all__ = ["ModelRunner"]

# Note [Late-bound tails]
# A mixed batch of n-gram speculation launches before the scheduler knows its decode
# rows' lengths: the step in flight has not said how many drafts it accepted. The
# scheduler takes host bounds instead (Scheduler.bound_tails: the attention width; a
# batch with a row that could reach its output limit resolves first, as others do),
# and the forward binds the lengths first thing, on its own stream, from the published
# ones (the map's ``resolve_tails``, which reads them without consuming them), and
# with them the rows' KV write locations from the request-to-token table (Note [The
# request-to-token table] in model.py), as sglang binds its mixed batches' decode
# tails. Both loops decide from the same host
# values, so they build the same batches; the synchronous one reads its finished
# step's lengths at the same point.


# Note [Packed accepted drafts]
# An n-gram verify hands the next step its accepted drafts, 0 to ``steps`` per
# request, and the next step appends them to each request's context. The map lays
# them into one packed tensor (sglang's packed ``verified_id``): each request's from
# its own start, only as many as it accepted, by a counted scatter whose counts,
# starts and rows (``SpecInfo.accept_lens``, ``accept_starts``, ``accept_rows``) the
# consumer lays out itself, on the device, first thing in the forward: a request's
# count is its length now (the bonus included) less the context its history holds
# (``KVCache.accepted``), and the starts are their running sum. Nothing is read back
# to the host, so a mixed batch whose lengths the forward binds late lays them out
# the same way. The map checks each count against its row's width and each span
# against its row before it writes, and in debug mode against the count the verify
# stashed (``accept_lens`` of the payload).


def _to_host(t: Tensor) -> Tensor:
    """A host copy the scheduler reads once the step is done."""
    if t.device.type == "cpu":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


@attrs.frozen
class _Handoff:
    """What rows of one forward hand the next: slots, tokens, extras, new lengths."""

    slots: Tensor
    tokens: Tensor
    extras: Extras
    new_seq_lens: Tensor


def _joined(parts: list[_Handoff]) -> _Handoff:
    if len(parts) == 1:
        return parts[0]
    return _Handoff(
        torch.cat([p.slots for p in parts]),
        torch.cat([p.tokens for p in parts]),
        tuple(torch.cat(column) for column in zip(*(p.extras for p in parts))),
        torch.cat([p.new_seq_lens for p in parts]),
    )


class ModelRunner:
    """Runs prefill, decode and verify forwards against one relay. Every forward, idle
    ones included, calls ``step_sync(n)`` with the tokens this rank runs (the
    data-parallel collective of a shared step), then ``kernels_started()`` when its
    kernels are about to run (Note [Host turns on the CPU worker] in executors.py).
    """

    def __init__(
        self,
        model: TargetModel,
        kv: KVCache,
        relay: Relay,
        *,
        spec: SpecConfig | None = None,
        step_sync: Callable[[int], None] | None = None,
        kernels_started: Callable[[], None] | None = None,
        ranges: Ranges = no_ranges,
        buckets: tuple[int, ...] = (),
        resolve_in_graph: bool = True,
    ) -> None:
        self.model = model
        self.kv = kv
        self.relay = relay
        self.spec = spec
        self.eagle = spec is not None and spec.method == "eagle"
        self.forwards = Forwards(model, kv, DraftHead(model) if self.eagle else None)
        #: With ``buckets``: decode steps that fit one run over its static buffers
        #: (relay/engine/graphs.py), captured in CUDA graphs by ``warm_up`` on CUDA.
        self.graphs: GraphRunner | None = None
        if buckets:
            self.graphs = GraphRunner(
                model,
                kv,
                self.forwards,
                relay,
                spec,
                buckets,
                resolve_inside=resolve_in_graph,
            )
        self.step_sync = step_sync
        self.kernels_started = kernels_started
        self.ranges = ranges
        #: When a list: each decode step's (step, request id, input token), read back
        #: on the host after the resolve (``EngineConfig.record_inputs``).
        self.record: list[tuple[int, int, int]] | None = None

    def warm_up(self) -> None:
        """Run each of the model's forwards twice on the scratch slot 0, before timing:
        TorchScript profiles a function's first calls and then optimizes it, which the
        first timed run would pay for. Writes only the scratch slot's cache rows."""
        slot = torch.zeros(1, dtype=torch.int64, device=self.model.device)
        token, prompt_len, seq_lens = slot + 1, slot + 2, slot + 3
        fw, spec = self.forwards, self.spec
        at = fw.req_to_token[slot, seq_lens - 1]
        for _ in range(2):
            hidden, _ = fw.prefill(token[:, None].expand(1, 2), prompt_len, slot)
            fw.prefill_chunk(token[:, None], prompt_len - 1, prompt_len - 1, slot, 2)
            fw.decode(token, seq_lens, 3, slot, at)
            if spec is not None and self.eagle:
                _, first, draft_hidden = fw.extend(hidden, token, spec.topk)
                result = fw.draft_and_verify(
                    token, draft_hidden, first, spec.steps, seq_lens, 3, slot
                )
                fw.commit_and_extend(result, at, spec.topk)
            elif spec is not None:
                none = PackedDrafts(slot.repeat(spec.steps), slot, slot, spec.steps)
                variable = spec.variable_drafts
                result = fw.ngram_verify(token, none, seq_lens, 3, slot, variable)
                fw.commit(result, at)
        if self.graphs is not None:
            self.graphs.capture(self._stash_scratch)

    def _stash_scratch(self) -> None:
        """Stash a prompt's results into the scratch slot 0, so that every lazily
        allocated relay buffer exists before a capture (Note [The resolve inside the
        graph] in relay/engine/graphs.py)."""
        slot = torch.zeros(1, dtype=torch.int64, device=self.model.device)
        token = slot + 1
        hidden, _ = self.forwards.prefill(token[:, None].expand(1, 2), slot + 2, slot)
        self.relay.stash(slot, token, self._first_extras(hidden, token))

    def forward(self, batch: ForwardBatch, out: StepOutput) -> None:
        """Run ``batch`` and fill ``out`` with host copies of its results."""
        with self.ranges(trace.FORWARD, batch.step):
            if batch.released is not None:
                # On the forward stream: after every forward that could still read them.
                with self.ranges(trace.RELEASE, batch.step):
                    self.relay.release(batch.released)
            if batch.mode is ForwardMode.IDLE:
                self._idle(batch)
            elif batch.mode is ForwardMode.PREFILL:
                self._prefill(batch, out)
            else:
                self._decode(batch, out)

    def seed(self, seeds: Seeds) -> None:
        """On the forward stream: receive prebuilt requests' KV (their prompts run here
        in place of the prefill server's transfer) and seed their relay rows (Note
        [Seeding a prebuilt request] in relay/engine/relays.py)."""
        self.relay.release(seeds.released)
        slots, tokens = seeds.slots, seeds.first_tokens
        hidden, _ = self.forwards.prefill(seeds.prompts, seeds.prompt_lens, slots)
        extras = self._first_extras(hidden, tokens)
        self.relay.seed(slots, tokens, extras, seeds.prompt_lens + 1)

    def _resolve_future(self, batch: ForwardBatch) -> None:
        with self.ranges(trace.RESOLVE_FUTURE, batch.step):
            if batch.mix_running_indices.numel():
                batch.req_to_token = self.forwards.req_to_token
                self.relay.resolve_tails(batch)  # Note [Late-bound tails]
            self._lay_out_drafts(batch)
            self.relay.resolve_future(batch)
        ids = batch.input_ids if self.spec is None else batch.spec_info.bonus_tokens
        self._record(batch, ids)

    def _lay_out_drafts(self, batch: ForwardBatch) -> None:
        """N-gram speculation: where the relay lays each row's accepted drafts (Note
        [Packed accepted drafts])."""
        spec = self.spec
        if spec is not None and not self.eagle and batch.reqs:
            counts = self.kv.accepted(batch.seq_lens, batch.req_pool_indices)
            batch.spec_info.lay_out_drafts(counts, spec.steps)

    def _record(self, batch: ForwardBatch, ids: Tensor) -> None:
        if self.record is not None and batch.reqs:
            rows = zip(batch.reqs, ids.tolist())
            self.record += [(batch.step, req.spec.rid, token) for req, token in rows]

    def _publish(self, batch: ForwardBatch, slots: Tensor, lens: Tensor | None) -> None:
        with self.ranges(trace.PUBLISH, batch.step):
            self.relay.publish(slots, lens)

    def _stash(self, batch: ForwardBatch, hand: _Handoff) -> None:
        with self.ranges(trace.STASH, batch.step):
            self.relay.stash(hand.slots, hand.tokens, hand.extras)

    def _start_kernels(self, tokens: int) -> None:
        """The end of a forward's host-side prologue: the collective, then the kernels."""
        if self.step_sync is not None:
            self.step_sync(tokens)
        if self.kernels_started is not None:
            self.kernels_started()

    def _first_extras(self, hidden: Tensor, tokens: Tensor) -> Extras:
        """What a finished prompt hands its first decode besides its token."""
        spec = self.spec
        if spec is None:
            return ()
        if self.eagle:
            return self.forwards.extend(hidden, tokens, spec.topk)
        # Nothing verified yet: accept length 0 (what an unwritten row reads).
        n = tokens.shape[0]
        return tokens.new_zeros(n, spec.steps), tokens.new_zeros(n, dtype=torch.int32)

    def _idle(self, batch: ForwardBatch) -> None:
        # Empty operations, as a rank with requests would issue them: each is a no-op
        # on zero indices and allocates nothing.
        empty = batch.req_pool_indices
        self._resolve_future(batch)
        self._publish(batch, empty, empty)
        self._start_kernels(0)
        if self.spec is not None and self.eagle:  # a draft's rows, without drafting
            c, topk = self.model.config, self.spec.topk
            p = empty.new_empty((0, topk), dtype=torch.float32)
            h = empty.new_empty((0, c.hidden), dtype=c.dtype)
            extras: Extras = (p, empty.new_empty((0, topk)), h)
        else:
            extras = self._first_extras(empty, empty)  # (), or n-gram's empty rows
        self._stash(batch, _Handoff(empty, empty, extras, empty))

    def _run_chunk(self, batch: ForwardBatch, out: StepOutput) -> _Handoff:
        """The model part of a prefill (or a mixed batch's chunk): fills ``out``;
        returns what the rows whose prompt is complete hand over."""
        slots, lens = batch.req_pool_indices, batch.chunk_lens
        assert lens is not None
        if batch.starts is None:
            hidden, tokens = self.forwards.prefill(batch.input_ids, lens, slots)
        else:
            hidden, tokens = self.forwards.prefill_chunk(
                batch.input_ids, batch.starts, lens, slots, batch.max_seq_len
            )
        new_seq_lens = batch.seq_lens + 1
        final = torch.tensor(batch.final, device=slots.device)
        out.tokens = _to_host(tokens[:, None])
        out.counts = _to_host(final.long())
        out.new_seq_lens = _to_host(new_seq_lens)
        if not all(batch.final):
            rows = final.nonzero().squeeze(1)
            slots, hidden, tokens = slots[rows], hidden[rows], tokens[rows]
            new_seq_lens = new_seq_lens[rows]
        extras = self._first_extras(hidden, tokens)
        return _Handoff(slots, tokens, extras, new_seq_lens)

    def _prefill(self, batch: ForwardBatch, out: StepOutput) -> None:
        assert batch.chunk_lens is not None
        whole = all(batch.final)
        if whole:
            # Known before the model runs: publish first so the scheduler waits least.
            self._publish(batch, batch.req_pool_indices, batch.seq_lens + 1)
        self._start_kernels(int(batch.chunk_lens.sum()))
        hand = self._run_chunk(batch, out)
        if not whole:
            self._publish(batch, hand.slots, hand.new_seq_lens)
        self._stash(batch, hand)

    def _decode(self, batch: ForwardBatch, out: StepOutput) -> None:
        """A decode (or verify) forward, with a mixed batch's chunk."""
        if self.graphs is not None:
            size = self.graphs.bucket_for(batch)
            if size is not None:
                self._decode_static(batch, out, size)
                return
            self.graphs.eager_steps += 1
        self._resolve_future(batch)
        spec, chunk = self.spec, batch.chunk
        width = 1 if spec is None else spec.steps + 1  # each branch: drafts and bonus
        branches = spec.topk if spec is not None and self.eagle else 1
        tokens = len(batch) * width * branches
        parts: list[_Handoff] = []
        if chunk is None:
            self._start_kernels(tokens)
        else:
            assert chunk.chunk_lens is not None
            self._start_kernels(tokens + int(chunk.chunk_lens.sum()))
            out.chunk = StepOutput()
            parts.append(self._run_chunk(chunk, out.chunk))
        slots, lens = batch.req_pool_indices, batch.seq_lens
        # A mixed batch's locations resolve_tails bound; a plain decode passes none
        # (Note [The request-to-token table] in model.py).
        if spec is not None and not batch.mix_running_indices.numel():
            batch.out_cache_loc = self.forwards.req_to_token[slots, lens - 1]
        if spec is None:
            fw, locations = self.forwards, batch.out_cache_loc
            _, next_tokens = fw.decode(
                batch.input_ids, lens, batch.max_seq_len, slots, locations
            )
            rows = _Handoff(slots, next_tokens, (), lens + 1)
            host_tokens, counts = next_tokens[:, None], torch.ones_like(next_tokens)
        else:
            result = self._verify(batch, spec)
            rows = _Handoff(slots, result.bonus, (), lens + result.accept_lens + 1)
        # Speculative decoding publishes mid-forward, before the cache commit and the
        # draft extension, which overlap the wait-free part of the next batch.
        published = _joined([rows, *parts])
        self._publish(batch, published.slots, published.new_seq_lens)
        if spec is not None:
            rows = attrs.evolve(rows, extras=self._commit(batch, result, spec))
            host_tokens, counts = result.tokens, result.accept_lens + 1
        self._stash(batch, _joined([rows, *parts]))
        out.tokens = _to_host(host_tokens)
        out.counts = _to_host(counts)
        out.new_seq_lens = _to_host(rows.new_seq_lens)

    def _decode_static(self, batch: ForwardBatch, out: StepOutput, size: int) -> None:
        """``_decode`` over bucket ``size``'s static buffers (relay/engine/graphs.py):
        the same publish, stash and host copies, of the real rows."""
        graphs, spec, n = self.graphs, self.spec, len(batch)
        assert graphs is not None
        static = graphs.inputs(size)
        static.fill(batch)
        if not graphs.resolve_inside:
            self._resolve_future(batch)
            static.adopt(batch, spec, n)
        elif graphs.captures and self.relay.seeds_pending:
            # Note [The resolve inside the graph]
            if spec is not None and not self.eagle:
                static.lay_out_drafts(self.kv, spec.steps)
            self.relay.resolve_future(static.batch)
        width = 1 if spec is None else spec.steps + 1
        branches = spec.topk if spec is not None and self.eagle else 1
        self._start_kernels(n * width * branches)
        with self.ranges(trace.RESOLVE_FUTURE, batch.step):
            graphs.run_phase(size, 0)  # with the resolve inside: its range too
        if graphs.resolve_inside:
            self._record(batch, static.tokens[:n])
        slots, lens = batch.req_pool_indices, batch.seq_lens
        written = graphs.written is not None
        if written:  # Note [Graph-written relay buffers] in relays.py
            self.relay.graph_wrote(slots)
        if spec is None:
            tokens = graphs.next_tokens(size, n)
            new_seq_lens = lens + 1
            self._publish(batch, slots, new_seq_lens)
            hand = _Handoff(slots, tokens, (), new_seq_lens)
            out.tokens = _to_host(tokens[:, None])
            out.counts = _to_host(torch.ones_like(tokens))
        else:
            result = graphs.verified(size, n)
            new_seq_lens = lens + result.accept_lens + 1
            # Note [Two phases around the publish] in graphs.py
            self._publish(batch, slots, None if written else new_seq_lens)
            graphs.run_phase(size, 1)
            extras = graphs.extras(size, n)
            hand = _Handoff(slots, result.bonus, extras, new_seq_lens)
            out.tokens = _to_host(result.tokens)
            out.counts = _to_host(result.accept_lens + 1)
        if written:
            with self.ranges(trace.STASH, batch.step):
                self.relay.stash_written(slots, hand.extras)
        else:
            self._stash(batch, hand)
        out.new_seq_lens = _to_host(new_seq_lens)

    def _verify(self, batch: ForwardBatch, spec: SpecConfig) -> VerifyResult:
        info, slots = batch.spec_info, batch.req_pool_indices
        bonus, lens, width = info.bonus_tokens, batch.seq_lens, batch.max_seq_len
        if not self.eagle:
            drafts, variable = info.drafts(spec.steps), spec.variable_drafts
            return self.forwards.ngram_verify(
                bonus, drafts, lens, width, slots, variable
            )
        hidden, first = info.hidden_states, info.topk_index
        assert hidden is not None, "decode before any prefill stashed"
        return self.forwards.draft_and_verify(
            bonus, hidden, first, spec.steps, lens, width, slots
        )

    def _commit(
        self, batch: ForwardBatch, result: VerifyResult, spec: SpecConfig
    ) -> Extras:
        locations = batch.out_cache_loc
        if self.eagle:
            return self.forwards.commit_and_extend(result, locations, spec.topk)
        self.forwards.commit(result, locations)
        return result.tokens[:, : spec.steps], result.accept_lens.to(torch.int32)
