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
    SpecInfo,
    StepOutput,
)
from relay.engine.workload import RequestSpec

__all__ = ["PageBudget", "Scheduler", "SchedulerConfig", "Vocabulary"]


# Note [One schedule for both modes]
# In overlap mode the scheduler launches step N+1 before it reads step N's tokens,
# so a request that ends on EOS in step N is still in step N+1 (its extra token is
# dropped); engines do this. The synchronous loop processes each step's results at
# the same point of its loop, after launching the next step, so both modes build
# exactly the same batches, step by step. Arrivals are counted in steps for the
# same reason. Lengths reach the scheduler earlier, through the schedule lane: a
# request at its output limit is dropped from the very batch being built, in both
# modes alike.


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """Capacity and batching limits."""

    #: Request-pool slots; the pool has one more row, the scratch row 0.
    max_running: int = 64
    #: Prompt tokens per prefill batch.
    max_prefill_tokens: int = 2048
    #: KV budget: admission reserves a request's worst case, in pages.
    kv_pages: int = 1024
    page_size: int = 16


class Vocabulary:
    """Token id -> text piece, for incremental detokenization of outputs."""

    def __init__(self, size: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        letters = "etaoinshrdlucmfwypvbgkjqxz"
        self.pieces = [
            ("" if rng.random() < 0.7 else " ")
            + "".join(rng.choice(letters) for _ in range(rng.randint(1, 4)))
            for _ in range(size)
        ]


class PageBudget:
    """KV memory in pages of ``page_size`` tokens, handed out from a free list.

    Admission reserves a request's worst case, so a running request never waits for
    memory; pages are then taken from the reservation as the sequence grows.
    """

    def __init__(self, pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.free_pages = list(range(pages - 1, -1, -1))
        self.unreserved = pages

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

    def grow(self, req: Request, tokens: int) -> None:
        """Allocate pages so ``req`` holds ``tokens`` tokens (within its reservation)."""
        need = min(self.pages_for(tokens), req.reserved_pages)
        while len(req.pages) < need:
            req.pages.append(self.free_pages.pop())

    def release(self, req: Request) -> None:
        """Return ``req``'s pages and reservation."""
        self.free_pages.extend(reversed(req.pages))
        req.pages.clear()
        self.unreserved += req.reserved_pages
        req.reserved_pages = 0


@attrs.define(eq=False)
class _RunningBatch:
    """The requests in decode, with device slots kept across steps (filtered and merged)."""

    reqs: list[Request]
    slots: torch.Tensor  # device
    prompt_lens: torch.Tensor  # host
    max_new: torch.Tensor  # host

    def filter_active(self) -> None:
        """Drop finished and capped requests."""
        if all(r.active for r in self.reqs):
            return
        keep = [i for i, r in enumerate(self.reqs) if r.active]
        rows = torch.tensor(keep, dtype=torch.int64)
        self.reqs = [self.reqs[i] for i in keep]
        self.slots = self.slots[rows.to(self.slots.device)]
        self.prompt_lens = self.prompt_lens[rows]
        self.max_new = self.max_new[rows]

    def merge(self, other: ForwardBatch) -> None:
        """Append a prefill batch's requests: they decode from the next step on."""
        self.reqs = self.reqs + other.reqs
        self.slots = torch.cat([self.slots, other.req_pool_indices])
        self.prompt_lens = torch.cat([self.prompt_lens, other.prompt_lens_cpu])
        self.max_new = torch.cat([self.max_new, other.max_new_cpu])


def _hits_stop(text: list[str], stops: tuple[str, ...]) -> bool:
    """Whether the output text ends in one of ``stops`` (the newest piece completes it)."""
    longest = max(len(s) for s in stops)
    tail = ""
    for piece in reversed(text):
        tail = piece + tail
        if len(tail) >= longest + len(text[-1]):
            break
    newest = len(text[-1])
    return any(s in tail and tail.rfind(s) + len(s) > len(tail) - newest for s in stops)


class Scheduler:
    """Admits arrivals, builds one batch per step and processes each step's results.

    ``lookahead`` is how many positions past its length one step may write (1 for
    plain decoding, ``steps + 1`` for speculative decoding).
    """

    def __init__(
        self,
        specs: Sequence[RequestSpec],
        config: SchedulerConfig,
        *,
        device: torch.device,
        vocab: Vocabulary,
        eos_token_id: int,
        max_context: int,
        lookahead: int,
        spec_topk: int = 1,
    ) -> None:
        self.config = config
        self.device = device
        self.vocab = vocab
        self.eos_token_id = eos_token_id
        self.lookahead = lookahead
        self.spec_topk = spec_topk
        self.pending = deque(sorted(specs, key=lambda s: (s.arrival_step, s.rid)))
        self.waiting: deque[Request] = deque()
        self.requests: dict[int, Request] = {}
        self.finished = 0
        self.clock = 0
        self._free_slots = list(
            range(config.max_running, 0, -1)
        )  # pop() reuses freed slots first
        self._released: list[int] = []  # freed, not yet released to the relay
        self.budget = PageBudget(config.kv_pages, config.page_size)
        self._running = _RunningBatch(
            [],
            torch.empty(0, dtype=torch.int64, device=device),
            torch.empty(0, dtype=torch.int64),
            torch.empty(0, dtype=torch.int64),
        )
        self._last_was_prefill = False
        self._max_context = max_context
        # Speculative decoding statistics: rows of decode steps and tokens they emitted.
        self.decode_rows = 0
        self.decode_tokens = 0
        self.streamed_bytes = 0
        for spec in specs:
            if len(spec.prompt) + lookahead + 1 > max_context:
                raise ValueError(
                    f"request {spec.rid}: a prompt of {len(spec.prompt)} tokens does "
                    f"not fit max_context {max_context}; raise max_context"
                )
            worst = len(spec.prompt) + self._output_limit(spec) + 2 * lookahead
            if self.budget.pages_for(worst) > config.kv_pages:
                raise ValueError(
                    f"request {spec.rid} needs {worst} tokens of KV, more than the "
                    f"budget of {config.kv_pages} pages; raise kv_pages"
                )

    # -- state -------------------------------------------------------------------
    def has_work(self) -> bool:
        """Requests still to arrive, wait or run."""
        return bool(self.pending or self.waiting or self.finished < len(self.requests))

    def tick(self) -> None:
        """Advance the step clock (arrivals are counted in steps)."""
        self.clock += 1

    # -- building a batch (before the fence) ---------------------------------------
    def next_batch(self) -> ForwardBatch | None:
        """This step's batch: a prefill of admitted requests, or a decode of the running.

        Prefill goes first when requests wait, but never twice in a row while
        requests run, so decoding is not starved. ``None`` when nothing can run.
        """
        while self.pending and self.pending[0].arrival_step <= self.clock:
            spec = self.pending.popleft()
            req = Request(spec)
            self.requests[spec.rid] = req
            self.waiting.append(req)
        running = self._running
        running.filter_active()
        if self.waiting and not (running.reqs and self._last_was_prefill):
            batch = self._prefill_batch()
            if batch is not None:
                self._last_was_prefill = True
                running.merge(batch)
                return batch
        self._last_was_prefill = False
        if not running.reqs:
            return None
        return self._decode_batch(running)

    def _output_limit(self, spec: RequestSpec) -> int:
        """The output limit, clipped so prompt, output and look-ahead fit a slot."""
        room = self._max_context - len(spec.prompt) - self.lookahead
        return max(1, min(spec.max_new_tokens, room))

    def _prefill_batch(self) -> ForwardBatch | None:
        picked: list[Request] = []
        tokens = 0
        while self.waiting and self._free_slots:
            req = self.waiting[0]
            prompt = len(req.spec.prompt)
            if picked and tokens + prompt > self.config.max_prefill_tokens:
                break
            worst = prompt + self._output_limit(req.spec) + 2 * self.lookahead
            if not self.budget.try_reserve(req, worst):
                break
            self.waiting.popleft()
            req.slot = self._free_slots.pop()
            req.state = RequestState.RUNNING
            self.budget.grow(req, prompt + self.lookahead)
            picked.append(req)
            tokens += prompt
        if not picked:
            return None
        lens = [len(r.spec.prompt) for r in picked]
        width = max(lens)
        padded = [list(r.spec.prompt) + [0] * (width - n) for r, n in zip(picked, lens)]
        lens_cpu = torch.tensor(lens, dtype=torch.int64)
        dev = self.device
        return ForwardBatch(
            ForwardMode.PREFILL,
            picked,
            req_pool_indices=torch.tensor(
                [r.slot for r in picked], dtype=torch.int64
            ).to(dev),
            input_ids=torch.tensor(padded, dtype=torch.int64).to(dev),
            seq_lens=lens_cpu.to(dev),
            seq_lens_cpu=lens_cpu,
            seq_lens_sum=sum(lens),
            spec_info=self._empty_spec(),
            prompt_lens_cpu=lens_cpu,
            max_new_cpu=torch.tensor(
                [self._output_limit(r.spec) for r in picked], dtype=torch.int64
            ),
            max_seq_len=width,
        )

    def _decode_batch(self, running: _RunningBatch) -> ForwardBatch:
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        return ForwardBatch(
            ForwardMode.DECODE,
            list(running.reqs),
            req_pool_indices=running.slots,  # never written in place: safe to share
            input_ids=empty,  # set by the relay
            seq_lens=empty,
            seq_lens_cpu=torch.empty(0, dtype=torch.int64),
            seq_lens_sum=0,
            spec_info=self._empty_spec(),
            prompt_lens_cpu=running.prompt_lens,
            max_new_cpu=running.max_new,
        )

    def _empty_spec(self) -> SpecInfo:
        dev = self.device
        return SpecInfo(
            torch.empty(0, self.spec_topk, dtype=torch.float32, device=dev),
            torch.empty(0, self.spec_topk, dtype=torch.int64, device=dev),
        )

    # -- after the fence -----------------------------------------------------------
    def cap_lengths(self, batch: ForwardBatch) -> bool:
        """Drop the requests at their output limit from a decode batch whose lengths are
        resolved; returns whether any request is left. Host tensors only."""
        generated = batch.seq_lens_cpu - batch.prompt_lens_cpu
        keep = generated < batch.max_new_cpu
        if not bool(keep.all()):
            for req, kept in zip(batch.reqs, keep.tolist()):
                if not kept:
                    req.state = RequestState.CAPPED
            batch.select(keep)
        if not batch.reqs:
            return False
        batch.max_seq_len = int(batch.seq_lens_cpu.max())
        return True

    # -- results of a finished step ----------------------------------------------------
    def process(self, batch: ForwardBatch, out: StepOutput) -> None:
        """Append a finished step's tokens, detokenize, and finish requests.

        Runs one step late in both modes (Note [One schedule for both modes]).
        """
        if batch.mode is ForwardMode.IDLE:
            return
        assert (
            out.tokens is not None
            and out.counts is not None
            and out.new_seq_lens is not None
        )
        if batch.mode is ForwardMode.DECODE:
            self.decode_rows += len(batch)
            self.decode_tokens += int(out.counts.sum())
        pieces = self.vocab.pieces
        eos = self.eos_token_id
        grow_by = 2 * self.lookahead
        for req, row, count, seq_len in zip(
            batch.reqs,
            out.tokens.tolist(),
            out.counts.tolist(),
            out.new_seq_lens.tolist(),
        ):
            if req.state is RequestState.FINISHED:
                continue  # ended on EOS one step ago: this row was the extra step
            req.seq_len = seq_len
            limit = self._output_limit(req.spec)
            first = len(req.output)
            reason = None
            for token in row[:count]:
                req.output.append(token)
                req.text.append(pieces[token])
                if token == eos:
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
            else:
                assert req.state is not RequestState.CAPPED, (
                    "capped request did not reach its limit"
                )
                self.budget.grow(req, seq_len + grow_by)

    def _stream_chunk(self, req: Request, first: int, reason: str | None) -> None:
        """Detokenize a request's new tokens and serialize the chunk a server streams.

        Incremental detokenization re-decodes a short window before the new tokens
        (as servers do, since a piece's text can depend on its neighbours) and sends
        the text past what was already sent.
        """
        window = max(0, first - 4)
        before = "".join(req.text[window:first])
        delta = "".join(req.text[window:])[len(before) :]
        chunk = {
            "id": f"cmpl-{req.spec.rid}",
            "object": "text_completion.chunk",
            "model": "relay-reference",
            "choices": [
                {
                    "index": 0,
                    "text": delta,
                    "token_ids": req.output[first:],
                    "finish_reason": reason,
                }
            ],
            "usage": {
                "prompt_tokens": len(req.spec.prompt),
                "completion_tokens": len(req.output),
            },
        }
        self.streamed_bytes += len(f"data: {json.dumps(chunk)}\n\n".encode())

    def _finish(self, req: Request, reason: str) -> None:
        # The slot may still be in an in-flight step; stream order keeps its next
        # owner's writes behind that step, so it is free to reuse at once.
        req.state = RequestState.FINISHED
        req.finish_reason = reason
        self._free_slots.append(req.slot)
        self._released.append(req.slot)
        self.budget.release(req)
        self.finished += 1

    def take_released(self) -> torch.Tensor:
        """Slots freed since the last call, as a device tensor, for the next launch."""
        released = torch.tensor(self._released, dtype=torch.int64, device=self.device)
        self._released.clear()
        return released

    def outputs(self) -> dict[int, tuple[int, ...]]:
        """Every request's output tokens, by request id."""
        return {rid: tuple(r.output) for rid, r in sorted(self.requests.items())}
