"""The forward of one step, as it runs on the forward executor.

Every forward starts by resolving the relay (decode batches), publishes the new
lengths as soon as they exist, and ends by stashing what the next forward needs
and copying its results to the host for the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import torch

from relay.engine.batch import ForwardBatch, ForwardMode, StepOutput
from relay.engine.model import DraftHead, Forwards, KVCache, TargetModel
from relay.engine.trace import (
    FORWARD,
    PUBLISH,
    RELEASE,
    RESOLVE_FUTURE,
    STASH,
    Ranges,
    no_ranges,
)

if (
    TYPE_CHECKING
):  # no map is imported with the engine (Note [One set of map classes per run])
    from relay.engine.relays import DraftOutput, Relay

__all__ = ["ModelRunner", "SpecConfig"]


@attrs.frozen(kw_only=True)
class SpecConfig:
    """EAGLE-style speculative decoding: ``topk`` draft branches of ``steps`` tokens."""

    steps: int = 3
    topk: int = 2


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy the scheduler reads once the step is done."""
    if t.device.type == "cpu":
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


class ModelRunner:
    """Runs prefill, decode and verify-and-draft forwards against one relay.

    ``step_sync(n)`` is called by every forward, idle ones included, with the
    number of tokens this rank runs: the data-parallel collective of a shared step.
    ``kernels_started()`` follows it, when the forward's kernels are about to run
    (Note [Host turns on the CPU worker] in relay/engine/executors.py).
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
    ) -> None:
        self.model = model
        self.kv = kv
        self.relay = relay
        self.spec = spec
        self.forwards = Forwards(
            model, kv, DraftHead(model) if spec is not None else None
        )
        self.step_sync = step_sync
        self.kernels_started = kernels_started
        self.ranges = ranges

    def warm_up(self) -> None:
        """Run each of the model's forwards twice on the scratch slot 0, before timing.

        TorchScript profiles a function's first calls and then optimizes it (about
        50 ms each here); without a warm-up the first timed run would pay for it.
        Writes only the scratch slot's cache rows; touches no relay.
        """
        device = self.model.device
        slot = torch.zeros(1, dtype=torch.int64, device=device)
        token = torch.ones(1, dtype=torch.int64, device=device)
        prompt_len = torch.full((1,), 2, dtype=torch.int64, device=device)
        seq_lens = prompt_len + 1
        fw = self.forwards
        for _ in range(2):
            hidden, _ = fw.prefill(token[:, None].expand(1, 2), prompt_len, slot)
            fw.decode(token, seq_lens, 3, slot)
            if self.spec is not None:
                topk = self.spec.topk
                _, first, draft_hidden = fw.extend(hidden, token, topk)
                result = fw.draft_and_verify(
                    token, draft_hidden, first, self.spec.steps, seq_lens, 3, slot
                )
                fw.commit_and_extend(result, seq_lens, slot, topk)

    def forward(self, batch: ForwardBatch, out: StepOutput) -> None:
        """Run ``batch`` and fill ``out`` with host copies of its results."""
        with self.ranges(FORWARD, batch.step):
            if batch.released is not None:
                # On the forward stream: after every forward that could still read them.
                with self.ranges(RELEASE, batch.step):
                    self.relay.release(batch.released)
            if batch.mode is ForwardMode.IDLE:
                self._idle(batch)
            elif batch.mode is ForwardMode.PREFILL:
                self._prefill(batch, out)
            elif self.spec is None:
                self._decode(batch, out)
            else:
                self._verify_and_draft(batch, out, self.spec)

    def _resolve_future(self, batch: ForwardBatch) -> None:
        with self.ranges(RESOLVE_FUTURE, batch.step):
            self.relay.resolve_future(batch)

    def _publish(
        self, batch: ForwardBatch, slots: torch.Tensor, new_seq_lens: torch.Tensor
    ) -> None:
        with self.ranges(PUBLISH, batch.step):
            self.relay.publish(slots, new_seq_lens)

    def _stash(
        self,
        batch: ForwardBatch,
        slots: torch.Tensor,
        tokens: torch.Tensor,
        draft: DraftOutput | None,
    ) -> None:
        with self.ranges(STASH, batch.step):
            self.relay.stash(slots, tokens, draft)

    def _start_kernels(self, tokens: int) -> None:
        """The end of a forward's host-side prologue: the collective, then the kernels."""
        if self.step_sync is not None:
            self.step_sync(tokens)
        if self.kernels_started is not None:
            self.kernels_started()

    def _draft_extend(
        self, hidden: torch.Tensor, tokens: torch.Tensor
    ) -> DraftOutput | None:
        if self.spec is None:
            return None
        return self.forwards.extend(hidden, tokens, self.spec.topk)

    def _idle(self, batch: ForwardBatch) -> None:
        # Empty operations, as a rank with requests would issue them: each is a no-op
        # on zero indices and allocates nothing.
        empty = batch.req_pool_indices
        self._resolve_future(batch)
        self._publish(batch, empty, empty)
        self._start_kernels(0)
        draft = None
        if self.spec is not None:
            h = self.model.config.hidden
            draft = (
                torch.empty(
                    0, self.spec.topk, dtype=torch.float32, device=empty.device
                ),
                torch.empty(0, self.spec.topk, dtype=torch.int64, device=empty.device),
                torch.empty(0, h, dtype=self.model.config.dtype, device=empty.device),
            )
        self._stash(batch, empty, empty, draft)

    def _prefill(self, batch: ForwardBatch, out: StepOutput) -> None:
        slots = batch.req_pool_indices
        new_seq_lens = batch.seq_lens + 1
        # Known before the model runs: publish first so the scheduler waits least.
        self._publish(batch, slots, new_seq_lens)
        self._start_kernels(int(batch.seq_lens_sum))
        hidden, tokens = self.forwards.prefill(batch.input_ids, batch.seq_lens, slots)
        self._stash(batch, slots, tokens, self._draft_extend(hidden, tokens))
        out.tokens = _to_host(tokens[:, None])
        out.counts = _to_host(torch.ones_like(tokens))
        out.new_seq_lens = _to_host(new_seq_lens)

    def _decode(self, batch: ForwardBatch, out: StepOutput) -> None:
        slots = batch.req_pool_indices
        self._resolve_future(batch)
        new_seq_lens = batch.seq_lens + 1
        self._publish(batch, slots, new_seq_lens)  # as in _prefill: known up front
        self._start_kernels(len(batch))
        _, tokens = self.forwards.decode(
            batch.input_ids, batch.seq_lens, batch.max_seq_len, slots
        )
        self._stash(batch, slots, tokens, None)
        out.tokens = _to_host(tokens[:, None])
        out.counts = _to_host(torch.ones_like(tokens))
        out.new_seq_lens = _to_host(new_seq_lens)

    def _verify_and_draft(
        self, batch: ForwardBatch, out: StepOutput, spec: SpecConfig
    ) -> None:
        slots = batch.req_pool_indices
        self._resolve_future(batch)
        info = batch.spec_info
        assert info.hidden_states is not None, (
            "speculative decode before any prefill stashed"
        )
        self._start_kernels(len(batch) * spec.topk * (spec.steps + 1))
        result = self.forwards.draft_and_verify(
            info.bonus_tokens,
            info.hidden_states,
            info.topk_index,
            spec.steps,
            batch.seq_lens,
            batch.max_seq_len,
            slots,
        )
        new_seq_lens = batch.seq_lens + result.accept_lens + 1
        # on_publish: mid-forward, before the cache commit and the draft extension,
        # which overlap the scheduler's wait-free part of the next batch.
        with self.ranges(PUBLISH, batch.step):
            self.on_publish(slots, new_seq_lens)
        draft = self.forwards.commit_and_extend(
            result, batch.seq_lens, slots, spec.topk
        )
        self._stash(batch, slots, result.bonus, draft)
        out.tokens = _to_host(result.tokens)
        out.counts = _to_host(result.accept_lens + 1)
        out.new_seq_lens = _to_host(new_seq_lens)

    def on_publish(self, slots: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """The verify step's publish callback: hand the accepted lengths to the scheduler."""
        self.relay.publish(slots, new_seq_lens)
