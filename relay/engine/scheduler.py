"""Continuous batching: admission, prefill and decode batches, finishing, slot reuse.

The scheduler is the same object in both loop modes; only the hand-over of values
between steps differs (``relay.engine.relays``).
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Sequence

import attrs
import torch

from relay.engine.batch import (
    ForwardBatch,
    ForwardMode,
    Request,
    RequestState,
    StepOutput,
)
from relay.engine.model import ModelConfig
from relay.engine.workload import RequestSpec

__all__ = ["PageBudget", "Scheduler", "SchedulerConfig", "TokenAccountingError"]


# Note [One schedule for both modes]
# In overlap mode the scheduler launches step N+1 before it reads step N's tokens,
# so a request that ends on EOS in step N is still in step N+1 (its extra token is
# dropped); engines do this. The synchronous loop processes each step's results at
# the same point of its loop, after launching the next step, so both modes build
# exactly the same batches, step by step. Arrivals and aborts are counted in steps
# for the same reason, and retraction decides from the lengths of processed steps,
# which both modes know at the same point. Lengths reach the scheduler earlier,
# through the schedule lane: a request at its output limit is dropped from the very
# batch being built, in both modes alike.


# Note [Rows of a retracted request]
# A request retracted while building step N+1 may still be a row of step N, in
# flight (and, in overlap mode, of the step the relay still stashes for in its old
# slot). Its context for the re-prefill is fixed when it is retracted (prompt and the
# tokens processed so far), so step N's tokens for it must be dropped, or they would
# be output once from step N and again from the re-prefill. Each batch remembers its
# rows' epochs; a retraction bumps the request's epoch, and ``process`` skips rows of
# an older epoch. ``process`` also checks that every step's length follows from the
# tokens output so far, which names a token processed twice (or lost).


class TokenAccountingError(RuntimeError):
    """A step's length does not follow from the tokens output so far."""


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """Capacity and batching limits."""

    #: Request-pool slots; the pool has one more row, the scratch row 0.
    max_running: int = 64
    #: Prompt tokens per prefill batch, and the size of a chunk.
    max_prefill_tokens: int = 2048
    kv_pages: int = 1024
    page_size: int = 16
    #: Admission takes pages for what a request holds now, not its worst case; when
    #: pages run out the newest running requests are retracted (slots and pages
    #: freed, re-queued, later prefilled again with the tokens they had). ``False``:
    #: admission reserves each request's worst case and nothing is ever retracted.
    retract: bool = True
    #: Prompts longer than what is left of the prefill budget are prefilled in chunks.
    chunked_prefill: bool = True
    #: A prefill chunk rides in the same forward as the running decode rows.
    mixed: bool = False
    #: With ``retract``: free pages admission leaves per running request, for their
    #: growth. Less admits more and retracts more.
    headroom: float = 0.25


class PageBudget:
    """KV memory in pages of ``page_size`` tokens, counted (a request's cache rows are
    its slot's, so no page needs a name). With ``reserve``, admission reserves a
    request's worst case, so a running request never waits for memory; without it,
    pages are taken as sequences grow and may run out."""

    def __init__(self, pages: int, page_size: int, *, reserve: bool) -> None:
        self.page_size = page_size
        self.reserve = reserve
        self.free = self.unreserved = pages

    def pages_for(self, tokens: int) -> int:
        """Pages that hold ``tokens`` tokens."""
        return -(-tokens // self.page_size)

    def try_reserve(self, req: Request, tokens: int) -> bool:
        """Reserve room for ``tokens`` tokens of ``req``; ``False`` if it does not fit."""
        need = self.pages_for(tokens)
        if need > self.unreserved:
            return False
        self.unreserved -= need
        req.reserved_pages = need
        return True

    def grow(self, req: Request, tokens: int, headroom: int = 0) -> bool:
        """Allocate pages so ``req`` holds ``tokens`` tokens: within its reservation
        when reserving, else only if ``headroom`` pages stay free (``False``,
        allocating nothing, when they would not)."""
        need = self.pages_for(tokens)
        if self.reserve:
            need = min(need, req.reserved_pages)
        elif max(0, need - req.pages) + headroom > self.free:
            return False
        if need > req.pages:
            self.free -= need - req.pages
            req.pages = need
        return True

    def release(self, req: Request) -> None:
        """Return ``req``'s pages and reservation."""
        self.free += req.pages
        self.unreserved += req.reserved_pages
        req.pages = req.reserved_pages = 0


def _hits_stop(text: list[str], stops: tuple[str, ...]) -> bool:
    """Whether the output text ends in one of ``stops`` (the newest piece completes it)."""
    longest, newest, tail = max(len(s) for s in stops), len(text[-1]), ""
    for piece in reversed(text):
        tail = piece + tail
        if len(tail) >= longest + newest:
            break
    return any(s in tail and tail.rfind(s) + len(s) > len(tail) - newest for s in stops)


class Scheduler:
    """Admits arrivals, builds one batch per step and processes each step's results;
    ``lookahead`` is how many positions past its length one step may write (1 for
    plain decoding, ``steps + 1`` for speculative decoding)."""

    def __init__(
        self,
        specs: Sequence[RequestSpec],
        config: SchedulerConfig,
        model: ModelConfig,
        *,
        device: torch.device,
        lookahead: int,
        late_tails: bool = False,
    ) -> None:
        self.config = config
        self.late_tails = late_tails  # Note [Late-bound tails] in runner.py
        self.device = device
        # Each token's text piece, for incremental detokenization of outputs.
        rng, letters = random.Random(model.seed), "etaoinshrdlucmfwypvbgkjqxz"
        self.pieces = [
            ("" if rng.random() < 0.7 else " ")
            + "".join(rng.choice(letters) for _ in range(rng.randint(1, 4)))
            for _ in range(model.vocab_size)
        ]
        self.eos_token_id = model.eos_token_id
        self.max_context = max_context = model.max_context
        self.lookahead = lookahead
        self.pending = deque(sorted(specs, key=lambda s: (s.arrival_step, s.rid)))
        self.waiting: deque[Request] = deque()
        self.requests: dict[int, Request] = {}
        self.finished = 0
        #: Steps so far: arrivals and aborts are counted in steps.
        self.clock = 0
        reserve = not config.retract
        self.budget = PageBudget(config.kv_pages, config.page_size, reserve=reserve)
        self._free_slots = list(range(config.max_running, 0, -1))  # pop() reuses
        self._released: list[int] = []  # freed, not yet released to the relay
        #: The requests in decode and their device slots, filtered and merged by step.
        self._running: list[Request] = []
        self._running_slots = torch.empty(0, dtype=torch.int64).to(device)
        self._last_was_prefill = False
        self._prebuilt: deque[Request] = deque()  # arrived prebuilt, not admitted
        self._seeds: list[Request] = []  # admitted prebuilt, relay rows not seeded
        self._aborts: dict[int, list[Request]] = {}
        #: Rows of decode steps and the tokens they emitted (speculative decoding's
        #: acceptance), bytes streamed to clients, requests retracted (each time),
        #: aborted and prebuilt, and prefill rows that were a chunk of a context.
        self.decode_rows = self.decode_tokens = self.streamed_bytes = 0
        self.retractions = self.aborts = self.prebuilt = self.chunks = 0
        for spec in specs:
            rid, prompt, worst = spec.rid, len(spec.prompt), self._worst(spec)
            if prompt + lookahead + 1 > max_context:
                raise ValueError(
                    f"request {rid}: a prompt of {prompt} tokens does not fit "
                    f"max_context {max_context}; raise max_context"
                )
            if self.budget.pages_for(worst) > config.kv_pages:
                raise ValueError(
                    f"request {rid} needs {worst} tokens of KV, more than the budget "
                    f"of {config.kv_pages} pages; raise kv_pages"
                )

    def _worst(self, spec: RequestSpec) -> int:
        return len(spec.prompt) + self._output_limit(spec) + 2 * self.lookahead

    def _output_limit(self, spec: RequestSpec) -> int:
        """The output limit, clipped so prompt, output and look-ahead fit a slot."""
        room = self.max_context - len(spec.prompt) - self.lookahead
        return max(1, min(spec.max_new_tokens, room))

    def has_work(self) -> bool:
        """Requests still to arrive, wait or run."""
        waiting = self.pending or self.waiting or self._prebuilt
        return bool(waiting or self.finished < len(self.requests))

    # -- building a batch (before the fence) ---------------------------------------
    def next_batch(self) -> ForwardBatch | None:
        """This step's batch: a prefill of admitted requests, or a decode of the running
        (with a prefill chunk riding along, with mixed batches); ``None`` when nothing
        can run. Prefill goes first when requests wait, but never twice in a row while
        requests run, so decoding is not starved."""
        self._arrive()
        self._abort_due()
        self._filter_running()
        self._make_room()
        self._admit_prebuilt()
        running = len(self._running)
        if self.config.mixed and running:
            batch = self._decode_batch()
            if self.waiting:
                budget = self.config.max_prefill_tokens - running
                batch.chunk = self._prefill_batch(max(budget, 1))
            return batch
        if self.waiting and not (running and self._last_was_prefill):
            prefill = self._prefill_batch(self.config.max_prefill_tokens)
            if prefill is not None:
                self._last_was_prefill = True
                return prefill
        self._last_was_prefill = False
        return self._decode_batch() if running else None

    def _filter_running(self) -> None:
        """Drop finished, capped and retracted requests from the running batch."""
        running = [r.state is RequestState.RUNNING for r in self._running]
        if not all(running):
            keep = [i for i, still in enumerate(running) if still]
            self._running = [self._running[i] for i in keep]
            rows = torch.tensor(keep, dtype=torch.int64).to(self.device)
            self._running_slots = self._running_slots[rows]

    def _start_running(self, reqs: list[Request]) -> None:
        """Requests whose prefill is done decode from the next step on."""
        if reqs:
            slots = torch.tensor([r.slot for r in reqs], dtype=torch.int64)
            self._running = self._running + reqs
            self._running_slots = torch.cat(
                [self._running_slots, slots.to(self.device)]
            )

    def _arrive(self) -> None:
        while self.pending and self.pending[0].arrival_step <= self.clock:
            spec = self.pending.popleft()
            req = Request(spec, context=spec.prompt)
            self.requests[spec.rid] = req
            prebuilt = spec.first_token is not None
            (self._prebuilt if prebuilt else self.waiting).append(req)
            if spec.abort_step is not None:
                self._aborts.setdefault(spec.abort_step, []).append(req)

    def _abort_due(self) -> None:
        """Cancel the requests whose client disconnects now, wherever they are."""
        for req in self._aborts.pop(self.clock, []):
            if req.state is RequestState.FINISHED:
                continue
            for queue in (self.waiting, self._prebuilt):
                if req in queue:
                    queue.remove(req)
            self.aborts += 1
            self._finish(req, "abort")

    def _make_room(self) -> None:
        """Give every running request the pages of its next step; where they run out,
        retract the newest running requests."""
        reqs, end, i = self._running, len(self._running), 0
        while i < end:
            req = reqs[i]
            # Its newest known length, plus what the step in flight and this one add.
            bound = (req.seq_len or len(req.context) + 1) + 2 * self.lookahead
            if self.budget.grow(req, bound):
                i += 1
            else:
                end -= 1
                self._retract(reqs[end])
        self._filter_running()

    def _retract(self, req: Request) -> None:
        """Free ``req``'s slot and pages and queue it first, to be prefilled again with
        its prompt and the tokens it had (Note [Rows of a retracted request])."""
        req.epoch += 1
        req.state = RequestState.WAITING
        req.context = req.spec.prompt + tuple(req.output)
        req.prefilled = req.seq_len = 0
        self._free(req)
        # First in line, but behind a prompt half prefilled: at most one request holds
        # pages while it waits, so that one can always finish its prefill.
        front = self.waiting and self.waiting[0].state is RequestState.PREFILLING
        self.waiting.insert(1 if front else 0, req)
        self.retractions += 1

    def _admit_prebuilt(self) -> None:
        """Admit arrived prebuilt requests straight into the running batch; their
        relay rows are seeded before the next forward (``take_seeds``)."""
        while self._prebuilt and self._free_slots:
            req = self._prebuilt[0]
            length = len(req.spec.prompt)
            if not self._take_pages(req, length + 1 + 2 * self.lookahead):
                break
            self._prebuilt.popleft()
            req.slot = self._free_slots.pop()
            req.prefilled, req.seq_len = length, length + 1
            req.state = RequestState.RUNNING
            self.prebuilt += 1
            assert req.spec.first_token is not None
            if self._append(req, [req.spec.first_token]) is None:
                self._start_running([req])
                self._seeds.append(req)

    def _take_pages(self, req: Request, tokens: int) -> bool:
        """Pages for a request being admitted (or chunk-prefilled) to hold ``tokens``."""
        admitting = self.budget.reserve and req.state is RequestState.WAITING
        if admitting and not self.budget.try_reserve(req, self._worst(req.spec)):
            return False
        # Pages kept for the running requests' growth: admission must not retract.
        headroom = int(self.config.headroom * len(self._running))
        return self.budget.grow(req, tokens, headroom)

    def take_seeds(self) -> list[Request]:
        """Prebuilt requests admitted since the last call, whose relay rows need seeding."""
        seeds, self._seeds = self._seeds, []
        return seeds

    def _prefill_batch(self, budget: int) -> ForwardBatch | None:
        """A prefill of the waiting requests' next chunks, within ``budget`` tokens;
        requests whose last chunk is picked start running."""
        reqs: list[Request] = []
        starts: list[int] = []
        lens: list[int] = []
        while self.waiting:
            req = self.waiting[0]
            start = req.prefilled
            remaining, room = len(req.context) - start, budget - sum(lens)
            if self.config.chunked_prefill:
                take = min(remaining, room)
            else:
                take = remaining if not reqs or remaining <= room else 0
            last = take == remaining
            end = start + take + (1 + 2 * self.lookahead if last else 0)
            admitting = req.state is RequestState.WAITING
            if take <= 0 or (admitting and not self._free_slots):
                break
            if not self._take_pages(req, end):
                break
            if admitting:
                req.slot = self._free_slots.pop()
                req.state = RequestState.PREFILLING
            req.prefilled += take
            reqs.append(req)
            starts.append(start)
            lens.append(take)
            if not last:
                break  # a chunk ends the batch; the request stays first in line
            self.waiting.popleft()
            req.state = RequestState.RUNNING
        if not reqs:
            return None
        ends = [start + n for start, n in zip(starts, lens)]
        final = [end == len(r.context) for r, end in zip(reqs, ends)]
        self.chunks += sum(1 for s, f in zip(starts, final) if s > 0 or not f)
        width = max(lens)
        padded = [
            list(r.context[s : s + n]) + [0] * (width - n)
            for r, s, n in zip(reqs, starts, lens)
        ]
        ends_cpu = torch.tensor(ends, dtype=torch.int64)
        dev = self.device
        batch = ForwardBatch(
            ForwardMode.PREFILL,
            reqs,
            req_pool_indices=torch.tensor([r.slot for r in reqs]).to(dev),
            input_ids=torch.tensor(padded, dtype=torch.int64).to(dev),
            seq_lens=ends_cpu.to(dev),
            seq_lens_cpu=ends_cpu,
            seq_lens_sum=sum(ends),
            max_seq_len=max(ends),
            epochs=[r.epoch for r in reqs],
            starts=torch.tensor(starts).to(dev) if any(starts) else None,
            chunk_lens=torch.tensor(lens, dtype=torch.int64).to(dev),
            final=final,
        )
        self._start_running([r for r, f in zip(reqs, final) if f])
        return batch

    def _decode_batch(self) -> ForwardBatch:
        empty = torch.empty(0, dtype=torch.int64)  # until the relay sets them
        return ForwardBatch(
            ForwardMode.DECODE,
            list(self._running),
            req_pool_indices=self._running_slots,  # never written in place: shared
            input_ids=empty.to(self.device),
            seq_lens=empty.to(self.device),
            seq_lens_cpu=empty,
            epochs=[r.epoch for r in self._running],
        )

    def bound_tails(self, batch: ForwardBatch) -> bool:
        """Whether a mixed batch launches before its decode rows' lengths are known
        (Note [Late-bound tails] in runner.py): only when no row can reach its output
        limit in the step in flight; the attention width is then their bound. Host
        values only, the same in both loops."""
        if not (self.late_tails and batch.chunk is not None):
            return False
        bounds = [
            (r.seq_len or len(r.context) + 1) + self.lookahead for r in batch.reqs
        ]
        for req, bound in zip(batch.reqs, bounds):
            if bound - len(req.spec.prompt) >= self._output_limit(req.spec):
                return False
        batch.max_seq_len = max(bounds)
        batch.mix_running_indices = batch.req_pool_indices
        return True

    # -- after the fence -----------------------------------------------------------
    def cap_lengths(self, batch: ForwardBatch) -> bool:
        """Drop the requests at their output limit from a decode batch whose lengths are
        resolved; returns whether any request is left. Host tensors only."""
        kept, lens = [], batch.seq_lens_cpu.tolist()
        for i, req in enumerate(batch.reqs):
            if lens[i] - len(req.spec.prompt) < self._output_limit(req.spec):
                kept.append(i)
            else:
                req.state = RequestState.CAPPED
        if len(kept) < len(batch.reqs):
            batch.select(kept)
        if not batch.reqs:
            return False
        batch.max_seq_len = int(batch.seq_lens_cpu.max())
        return True

    # -- results of a finished step ----------------------------------------------------
    def process(self, batch: ForwardBatch, out: StepOutput) -> None:
        """Append a finished step's tokens, detokenize, and finish requests; one step
        late in both modes (Note [One schedule for both modes])."""
        if batch.mode is ForwardMode.IDLE:
            return
        if batch.mode is ForwardMode.DECODE:
            assert out.counts is not None
            self.decode_rows += len(batch)
            self.decode_tokens += int(out.counts.sum())
        self._process_rows(batch, out)
        if batch.chunk is not None:
            assert out.chunk is not None
            self._process_rows(batch.chunk, out.chunk)

    def _process_rows(self, batch: ForwardBatch, out: StepOutput) -> None:
        tokens, counts, lens = out.tokens, out.counts, out.new_seq_lens
        assert tokens is not None and counts is not None and lens is not None
        rows = zip(tokens.tolist(), counts.tolist(), lens.tolist())
        for req, epoch, (row, count, seq_len) in zip(batch.reqs, batch.epochs, rows):
            if req.state is RequestState.FINISHED or not self._current(req, epoch):
                continue  # ended one step ago, or retracted since (extra rows)
            if count == 0:
                continue  # a chunk that is not its context's last
            self._check_accounting(req, seq_len, count)
            req.seq_len = seq_len
            if self._append(req, row[:count]) is None:
                assert req.state is not RequestState.CAPPED, "capped below its limit"

    def _check_accounting(self, req: Request, seq_len: int, count: int) -> None:
        """A step's length must follow from the tokens output so far."""
        if seq_len - count != len(req.spec.prompt) + len(req.output):
            raise TokenAccountingError(
                f"request {req.spec.rid}: a step ended at length {seq_len} with "
                f"{count} new token(s) after {len(req.output)} output tokens of a "
                f"{len(req.spec.prompt)}-token prompt: a token was processed "
                "twice or lost (Note [Rows of a retracted request])"
            )

    def _current(self, req: Request, epoch: int) -> bool:
        """Whether a row built at ``epoch`` is still ``req``'s (Note [Rows of a retracted
        request])."""
        return req.epoch == epoch

    def _append(self, req: Request, tokens: list[int]) -> str | None:
        """Output ``tokens`` until one ends the request; the reason it ended, if it did."""
        limit = self._output_limit(req.spec)
        first = len(req.output)
        reason = None
        for token in tokens:
            req.output.append(token)
            req.text.append(self.pieces[token])
            if token == self.eos_token_id:
                reason = "eos"
            elif len(req.output) >= limit:
                reason = "length"
            elif req.spec.stop and _hits_stop(req.text, req.spec.stop):
                reason = "stop"
            if reason is not None:
                break
        self._stream_chunk(req, first, reason)
        if reason is not None:
            self._finish(req, reason)
        return reason

    def _stream_chunk(self, req: Request, first: int, reason: str | None) -> None:
        """Detokenize a request's new tokens and serialize the chunk a server streams:
        as servers do, re-decode a short window before the new tokens (a piece's text
        can depend on its neighbours) and send the text past what was already sent."""
        window = max(0, first - 4)
        before = "".join(req.text[window:first])
        delta = "".join(req.text[window:])[len(before) :]
        new, prompt, done = req.output[first:], len(req.spec.prompt), len(req.output)
        choice = {"index": 0, "text": delta, "token_ids": new, "finish_reason": reason}
        usage = {"prompt_tokens": prompt, "completion_tokens": done}
        chunk = {
            "id": f"cmpl-{req.spec.rid}",
            "object": "text_completion.chunk",
            "model": "relay-reference",
            "choices": [choice],
            "usage": usage,
        }
        self.streamed_bytes += len(f"data: {json.dumps(chunk)}\n\n".encode())

    def _finish(self, req: Request, reason: str) -> None:
        req.state = RequestState.FINISHED
        req.finish_reason = reason
        self._free(req)
        self.finished += 1

    def _free(self, req: Request) -> None:
        """Return ``req``'s slot and pages. The slot may still be in an in-flight step;
        stream order keeps its next owner's writes behind that step, so it is free to
        reuse at once."""
        if req.slot:
            self._free_slots.append(req.slot)
            self._released.append(req.slot)
            req.slot = 0
        self.budget.release(req)

    def take_released(self) -> torch.Tensor:
        """Slots freed since the last call, as a device tensor, for the next launch."""
        released, self._released = self._released, []
        return torch.tensor(released, dtype=torch.int64, device=self.device)
