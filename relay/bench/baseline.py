"""Hand-written FutureMaps in sglang's style (DOMAIN.md, docs/sglang.md), as lean as an
engine keeps them; stash and publish take the payload's field names as keywords."""

from __future__ import annotations

from typing import Any

import torch

from relay.cpu_stream import CpuEvent, current_cpu_stream

__all__ = ["DecodeBaseline", "DecodeSeqLensBaseline", "EagleBaseline", "NgramBaseline"]
__all__ += ["EagleConfidenceBaseline", "PublishReady", "SglangEagleBaseline"]


class PublishReady:
    """The fence and the host copy: a device wait and a pinned copy on CUDA, a host wait
    on HIP, plain calls on the CPU (Note [Fence chaining] in relay/device.py)."""

    def __init__(self, device: torch.device) -> None:
        self.cpu = device.type == "cpu"
        self.cuda = device.type == "cuda" and torch.version.hip is None
        # HIP: a device-side wait hurt latency there, so the host blocks instead.
        self.host_wait = self.cpu or (device.type == "cuda" and not self.cuda)
        self.module: Any = None if self.cpu else torch.get_device_module(device.type)
        self.event: Any = None
        self.stream: Any = None
        self.copy_stream: Any = None
        self.copy_done: Any = None
        self.pinned = torch.empty(0)

    def record(self) -> None:
        stream: Any = current_cpu_stream() if self.cpu else self.module.current_stream()
        if self.event is None:
            self.event = CpuEvent() if self.cpu else self.module.Event()
        elif stream != self.stream and self.cpu:
            self.event.wait()
        elif stream != self.stream:
            stream.wait_event(self.event)
        self.event.record(*(() if self.cpu else (stream,)))
        self.stream = stream

    def wait(self) -> None:
        if self.event is not None and self.host_wait:
            self.event.synchronize()
        elif self.event is not None:
            self.module.current_stream().wait_event(self.event)

    def resolve(self, buf: torch.Tensor, batch: Any, indices: torch.Tensor) -> None:
        """Rows ``indices`` of ``buf`` after the newest publish, to the host, summed."""
        self.wait()
        batch.seq_lens = rows = buf[indices]
        if self.cuda:
            if self.copy_stream is None:
                self.copy_stream = self.module.Stream(device=buf.device)
                self.copy_done = self.module.Event()
                self.pinned = torch.empty(buf.shape, dtype=buf.dtype, pin_memory=True)
            if self.event is not None:
                self.copy_stream.wait_event(self.event)
            with torch.cuda.stream(self.copy_stream):
                self.pinned.copy_(buf, non_blocking=True)
            self.copy_done.record(self.copy_stream)
            self.copy_done.synchronize()
            batch.seq_lens_cpu = self.pinned[batch.req_pool_indices_cpu]
        else:  # on the CPU .cpu() is rows itself: both lengths would move as one
            batch.seq_lens_cpu = rows.clone() if self.cpu else rows.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())


def _pool(device: torch.device, pool_size: int, *row: int, dtype: Any) -> torch.Tensor:
    return torch.zeros((pool_size, *row), dtype=dtype, device=device)


class _Map:
    """A pool of request slots; a resolve reads the batch's ``req_pool_indices``."""

    def __init__(self, device: torch.device | str, pool_size: int) -> None:
        self.device = torch.device(device)
        self.pool_size = pool_size

    def slots(self, batch: Any) -> torch.Tensor | None:
        """The slots a resolve reads, ``None`` for none."""
        indices = batch.req_pool_indices
        return indices if indices.numel() != 0 else None


class _Sglang(_Map):
    """sglang 0.5.23's slots: the draft input's ``future_indices``, none without one."""

    def slots(self, batch: Any) -> torch.Tensor | None:
        spec_info = batch.spec_info
        indices = None if spec_info is None else spec_info.future_indices
        return indices if indices is not None and indices.numel() != 0 else None


class DecodeBaseline(_Map):
    """Plain decoding, sglang today: tokens relayed; the host computes ``seq_lens + 1``."""

    def __init__(self, device: torch.device | str, pool_size: int) -> None:
        super().__init__(device, pool_size)
        self.output_tokens_buf = _pool(self.device, pool_size, dtype=torch.int64)

    def stash(self, indices: torch.Tensor, *, next_token_ids: torch.Tensor) -> None:
        if indices.numel() != 0:
            self.output_tokens_buf[indices] = next_token_ids.to(torch.int64)

    def resolve_future(self, batch: Any) -> None:
        indices = self.slots(batch)
        if indices is not None:
            batch.input_ids = self.output_tokens_buf[indices]


class _SeqLens(_Map):
    """``new_seq_lens`` published behind the fence, gathered by the scheduler, copied
    to the host and summed."""

    def __init__(self, device: torch.device | str, pool_size: int) -> None:
        super().__init__(device, pool_size)
        self.new_seq_lens_buf = _pool(self.device, pool_size, dtype=torch.int64)
        self._ready = PublishReady(self.device)

    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        if indices.numel() != 0:
            self.new_seq_lens_buf[indices] = new_seq_lens.to(torch.int64)
            self._ready.record()

    def resolve_seq_lens_cpu(self, batch: Any) -> None:
        indices = self.slots(batch)
        if indices is not None:
            self._ready.resolve(self.new_seq_lens_buf, batch, indices)


class DecodeSeqLensBaseline(DecodeBaseline, _SeqLens):
    """Plain decoding, sglang's sentinel design: placeholder tokens, lengths relayed."""

    def invalidate(self, batch: Any, indices: torch.Tensor) -> None:
        if indices.numel() != 0:
            batch.input_ids = -indices  # slots start at 1: a placeholder is always < 0

    def resolve_future(self, batch: Any) -> None:
        if self.slots(batch) is not None:
            input_ids = batch.input_ids
            tokens = self.output_tokens_buf[(-input_ids).clamp(min=0)]
            input_ids.copy_(torch.where(input_ids < 0, tokens, input_ids))


class EagleBaseline(_SeqLens):
    """EAGLE, sglang today: bonus token, top-k and hidden state; lengths published."""

    def __init__(self, device: torch.device | str, pool_size: int, *, topk: int) -> None:  # fmt: skip
        super().__init__(device, pool_size)
        self.output_tokens_buf = _pool(self.device, pool_size, dtype=torch.int64)
        self.topk_p_buf = _pool(self.device, pool_size, topk, dtype=torch.float32)
        self.topk_index_buf = _pool(self.device, pool_size, topk, dtype=torch.int64)
        self.hidden_states_buf: torch.Tensor | None = None

    def stash(self, indices: torch.Tensor, *, bonus_tokens: torch.Tensor, topk_p: torch.Tensor,
              topk_index: torch.Tensor, hidden_states: torch.Tensor | None = None) -> None:  # fmt: skip
        if indices.numel() == 0:
            return
        self.output_tokens_buf[indices] = bonus_tokens.to(torch.int64)
        self.topk_p_buf[indices] = topk_p.to(torch.float32)
        self.topk_index_buf[indices] = topk_index.to(torch.int64)
        self.hidden_states_buf = _write_extra(self.hidden_states_buf, self.pool_size, indices, hidden_states)  # fmt: skip

    def resolve_future(self, batch: Any) -> None:
        indices = self.slots(batch)
        if indices is None:
            return
        spec_info = batch.spec_info
        spec_info.bonus_tokens = self.output_tokens_buf[indices]
        spec_info.topk_p = self.topk_p_buf[indices]
        spec_info.topk_index = self.topk_index_buf[indices]
        if self.hidden_states_buf is not None:
            spec_info.hidden_states = self.hidden_states_buf[indices]


class EagleConfidenceBaseline(EagleBaseline):
    """EAGLE with a confidence per draft token published beside the lengths, gathered
    by the scheduler and copied to the host."""

    def __init__(self, device: torch.device | str, pool_size: int, *, topk: int, draft_tokens: int) -> None:  # fmt: skip
        super().__init__(device, pool_size, topk=topk)
        self.draft_confidence_buf = _pool(self.device, pool_size, draft_tokens, dtype=torch.float32)  # fmt: skip

    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor, draft_confidence: torch.Tensor | None = None) -> None:  # fmt: skip
        if indices.numel() != 0 and draft_confidence is not None:
            self.draft_confidence_buf[indices] = draft_confidence.to(torch.float32)
        super().publish(indices, new_seq_lens)

    def resolve_draft_confidence_cpu(self, batch: Any) -> None:
        indices = self.slots(batch)
        if indices is not None:
            self._ready.wait()
            batch.spec_info.draft_confidence = rows = self.draft_confidence_buf[indices]
            batch.draft_confidence_cpu = rows.clone() if self._ready.cpu else rows.cpu()


def _write_extra(
    buf: torch.Tensor | None, pool_size: int, indices: torch.Tensor, value: Any
) -> torch.Tensor | None:
    """An optional extra, allocated by the first payload carrying it (sglang 0.5.23's)."""
    if value is None:
        return buf
    if buf is None:
        shape = (pool_size, *value.shape[1:])
        buf = torch.empty(shape, dtype=value.dtype, device=value.device)
    buf[indices] = value.to(buf.dtype)
    return buf


class SglangEagleBaseline(_Sglang, _SeqLens):
    """EAGLE as sglang 0.5.23 relays it, by ``future_indices``. Buffers a captured graph
    wrote (``graph_wrote``) are not scattered again by ``publish`` and ``stash``."""

    def __init__(self, device: torch.device | str, pool_size: int, *, output_tokens_buf: torch.Tensor | None = None, new_seq_lens_buf: torch.Tensor | None = None) -> None:  # fmt: skip
        super().__init__(device, pool_size)
        own = torch.empty(pool_size, dtype=torch.int64, device=self.device)
        self.output_tokens_buf = own if output_tokens_buf is None else output_tokens_buf
        if new_seq_lens_buf is not None:
            self.new_seq_lens_buf = new_seq_lens_buf
        self.topk_p_buf: torch.Tensor | None = None
        self.topk_index_buf: torch.Tensor | None = None
        self.hidden_states_buf: torch.Tensor | None = None
        self.draft_probs_buf: torch.Tensor | None = None
        self.dsa_topk_indices_buf: torch.Tensor | None = None
        self.confidence_buf: torch.Tensor | None = None
        self.published_bonus: torch.Tensor | None = None
        self.published_seq_lens: torch.Tensor | None = None

    def graph_wrote(self, *, bonus_tokens: torch.Tensor, new_seq_lens: torch.Tensor) -> None:  # fmt: skip
        self.published_bonus, self.published_seq_lens = bonus_tokens, new_seq_lens

    def stash(self, indices: torch.Tensor, *, bonus_tokens: torch.Tensor, topk_p: torch.Tensor | None = None,
              topk_index: torch.Tensor | None = None, hidden_states: torch.Tensor | None = None,
              draft_probs: torch.Tensor | None = None, dsa_topk_indices: torch.Tensor | None = None) -> None:  # fmt: skip
        if indices.numel() == 0:
            return
        if bonus_tokens is self.published_bonus:
            self.published_bonus = None  # the graph wrote them
        else:
            self.output_tokens_buf[indices] = bonus_tokens.to(torch.int64)
        pool = self.pool_size
        self.topk_p_buf = _write_extra(self.topk_p_buf, pool, indices, topk_p)
        self.topk_index_buf = _write_extra(self.topk_index_buf, pool, indices, topk_index)  # fmt: skip
        self.hidden_states_buf = _write_extra(self.hidden_states_buf, pool, indices, hidden_states)  # fmt: skip
        self.draft_probs_buf = _write_extra(self.draft_probs_buf, pool, indices, draft_probs)  # fmt: skip
        self.dsa_topk_indices_buf = _write_extra(self.dsa_topk_indices_buf, pool, indices, dsa_topk_indices)  # fmt: skip

    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor, confidence: torch.Tensor | None = None) -> None:  # fmt: skip
        if indices.numel() == 0:
            return
        if new_seq_lens is self.published_seq_lens:
            self.published_seq_lens = None  # the graph wrote them
        else:
            self.new_seq_lens_buf[indices] = new_seq_lens.to(torch.int64)
        self.confidence_buf = _write_extra(self.confidence_buf, self.pool_size, indices, confidence)  # fmt: skip
        self._ready.record()

    def resolve_future(self, batch: Any) -> None:
        indices = self.slots(batch)
        if indices is None:
            return
        spec_info = batch.spec_info
        spec_info.bonus_tokens = self.output_tokens_buf[indices]
        if self.topk_p_buf is not None and self.topk_index_buf is not None:
            spec_info.topk_p = self.topk_p_buf[indices]
            spec_info.topk_index = self.topk_index_buf[indices]
        if self.hidden_states_buf is not None:
            spec_info.hidden_states = self.hidden_states_buf[indices]
        if self.draft_probs_buf is not None:
            spec_info.draft_probs = self.draft_probs_buf[indices]
        dsa = self.dsa_topk_indices_buf
        spec_info.dsa_topk_indices = None if dsa is None else dsa[indices]


class NgramBaseline(_Sglang, _SeqLens):
    """n-gram as sglang 0.5.23 relays it: accepted drafts and counts, lazily allocated."""

    def __init__(self, device: torch.device | str, pool_size: int) -> None:
        super().__init__(device, pool_size)
        self.accept_tokens_buf: torch.Tensor | None = None
        self.accept_lens_buf: torch.Tensor | None = None

    def stash(
        self, indices: torch.Tensor, *, accept_tokens: torch.Tensor, accept_lens: torch.Tensor
    ) -> None:  # fmt: skip
        if indices.numel() == 0:
            return
        if self.accept_tokens_buf is None or self.accept_lens_buf is None:
            pool, row = self.pool_size, accept_tokens.shape[1:]
            self.accept_tokens_buf = _pool(self.device, pool, *row, dtype=accept_tokens.dtype)  # fmt: skip
            self.accept_lens_buf = _pool(self.device, pool, dtype=accept_lens.dtype)
        self.accept_tokens_buf[indices] = accept_tokens
        self.accept_lens_buf[indices] = accept_lens

    def resolve_future(self, batch: Any) -> None:
        indices = self.slots(batch)
        tokens, lens = self.accept_tokens_buf, self.accept_lens_buf
        if indices is not None and tokens is not None and lens is not None:
            batch.spec_info.accept_tokens = tokens[indices].flatten()
            batch.spec_info.accept_lens = lens[indices]
