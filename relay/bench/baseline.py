"""Hand-written FutureMaps for decode and EAGLE: the baseline ``relay bench`` times.

These are written the way an engine author writes a relay by hand (sglang-style):
one class per mode, buffers as attributes, the fence and host copy open-coded.
They have the same semantics as the generated ``DecodeFutureMap`` and
``EagleFutureMap`` with ``debug=False`` — same buffers, dtypes, casts, guards,
placeholder protocol, lazy per-stash allocation, chained fence and pinned host
copy — so the benchmark compares code shape, not features. They have no debug
mode: hand-written production relays do not carry one.

Nothing here is generated or imported from ``relay.maps``; the only relay import is
``CpuEvent``, the CPU's event type (the counterpart of ``torch.cuda.Event``), so the
baseline orders correctly under the reference engine's CPU thread stream too.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from relay.cpu_stream import CpuEvent, current_cpu_stream

__all__ = [
    "BaselineBatch",
    "BaselineSpecInfo",
    "DecodeFutureMapBaseline",
    "EagleFutureMapBaseline",
]


class BaselineSpecInfo(Protocol):
    """What the EAGLE baseline reads and writes on ``batch.spec_info``."""

    topk_p: torch.Tensor
    topk_index: torch.Tensor
    hidden_states: torch.Tensor | None


class BaselineBatch(Protocol):
    """What the baselines read and write on a batch (``spec_info`` only for EAGLE)."""

    req_pool_indices: torch.Tensor
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int


class _EagleBatch(BaselineBatch, Protocol):
    @property
    def spec_info(self) -> BaselineSpecInfo: ...


class _PublishReady:
    """The ``publish_ready`` fence and the seq-lens host copy, open-coded per device.

    Shared by both baselines the way an engine keeps one such helper next to its
    FutureMap. The event is created on the first publish so CPU and HIP need no
    ``torch.cuda.Event``.
    """

    def __init__(self, device: torch.device, pool_size: int) -> None:
        self.device = device
        self.pool_size = pool_size
        self.is_cpu = device.type == "cpu"
        self.is_cuda = device.type == "cuda"
        # ROCm: a device-side wait hurt latency there, so the host blocks instead.
        self.host_wait = self.is_cpu or (self.is_cuda and torch.version.hip is not None)
        self.module: Any = None if self.is_cpu else torch.get_device_module(device.type)
        self.event: Any = None
        self.last_stream: Any = None
        # CUDA host copy: private copy stream into a pinned mirror (allocated on use).
        self.copy_stream: Any = None
        self.copy_done: Any = None
        self.pinned: torch.Tensor | None = None

    def _current_stream(self) -> Any:
        if self.is_cpu:
            return current_cpu_stream()
        return self.module.current_stream()

    def record(self) -> None:
        stream = self._current_stream()
        if self.event is None:
            self.event = CpuEvent() if self.is_cpu else self.module.Event()
        elif stream != self.last_stream:
            # Chain: a record from another stream would drop the in-flight one.
            if self.is_cpu:
                self.event.wait()
            else:
                stream.wait_event(self.event)
        if self.is_cpu:
            self.event.record()
        else:
            self.event.record(stream)
        self.last_stream = stream

    def wait(self) -> None:
        if self.event is None:
            if not self.is_cpu:
                return  # nothing was ever enqueued to wait for
            # On a CPU worker stream the first publish may still be queued: a fresh
            # event's wait covers it (Note [Host order of CPU records]).
            self.event = CpuEvent()
        if self.host_wait:
            self.event.synchronize()
        else:
            self.module.current_stream().wait_event(self.event)

    def to_host(self, src: torch.Tensor) -> torch.Tensor:
        if self.is_cpu:
            return src.clone()  # the host copy must not alias the device-side target
        if not self.is_cuda:
            return src.to("cpu")
        if self.copy_stream is None:
            self.copy_stream = self.module.Stream(device=self.device)
            self.copy_done = self.module.Event()
        if self.pinned is None:
            self.pinned = torch.empty((self.pool_size,), dtype=src.dtype, pin_memory=True)
        rows = self.pinned[: src.shape[0]]
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            rows.copy_(src, non_blocking=True)
            src.record_stream(self.copy_stream)
            self.copy_done.record(self.copy_stream)
        self.copy_done.synchronize()
        return rows.clone()  # the pinned rows are reused by the next copy


class DecodeFutureMapBaseline:
    """Plain decoding: sampled tokens (forward lane) and new seq lens (schedule lane)."""

    def __init__(self, device: torch.device | str, pool_size: int) -> None:
        self.device = torch.device(device)
        self.pool_size = pool_size
        self.output_tokens_buf = torch.zeros((pool_size,), dtype=torch.int64, device=self.device)
        self.new_seq_lens_buf = torch.zeros((pool_size,), dtype=torch.int64, device=self.device)
        self._ready = _PublishReady(self.device, pool_size)

    def stash(self, indices: torch.Tensor, next_token_ids: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        tokens = next_token_ids.to(torch.int64)
        torch._assert_async((tokens >= 0).all(), "output_tokens must be >= 0")
        self.output_tokens_buf[indices] = tokens

    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        seq_lens = new_seq_lens.to(torch.int64)
        torch._assert_async((seq_lens > 0).all(), "new_seq_lens must be > 0")
        self.new_seq_lens_buf[indices] = seq_lens
        self._ready.record()

    def invalidate(self, batch: BaselineBatch, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        batch.input_ids = -indices

    def release(self, indices: torch.Tensor) -> None:
        """A request ended; its slot may be reused. Nothing to do without debug checks."""

    def resolve_future(self, batch: BaselineBatch) -> None:
        if batch.req_pool_indices.numel() == 0:
            return
        input_ids = batch.input_ids
        pending = input_ids < 0
        tokens = self.output_tokens_buf[(-input_ids).clamp(min=0)]
        input_ids.copy_(torch.where(pending, tokens, input_ids))

    def resolve_seq_lens_cpu(self, batch: BaselineBatch) -> None:
        indices = batch.req_pool_indices
        if indices.numel() == 0:
            return
        self._ready.wait()
        batch.seq_lens = self.new_seq_lens_buf[indices]
        batch.seq_lens_cpu = self._ready.to_host(batch.seq_lens)
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())


class EagleFutureMapBaseline:
    """EAGLE: bonus token, first top-k, optional hidden states; accepted seq lens."""

    def __init__(self, device: torch.device | str, pool_size: int, *, topk: int) -> None:
        self.device = torch.device(device)
        self.pool_size = pool_size
        self.output_tokens_buf = torch.zeros((pool_size,), dtype=torch.int64, device=self.device)
        self.topk_p_buf = torch.zeros((pool_size, topk), dtype=torch.float32, device=self.device)
        self.topk_index_buf = torch.zeros((pool_size, topk), dtype=torch.int64, device=self.device)
        # Allocated on the first stash that carries it (its width and dtype come from
        # the draft model); checked per stash, so an early payload without it does
        # not disable it for good.
        self.hidden_states_buf: torch.Tensor | None = None
        self.new_seq_lens_buf = torch.zeros((pool_size,), dtype=torch.int64, device=self.device)
        self._ready = _PublishReady(self.device, pool_size)

    def stash(
        self,
        indices: torch.Tensor,
        bonus_tokens: torch.Tensor,
        topk_p: torch.Tensor,
        topk_index: torch.Tensor,
        hidden_states: torch.Tensor | None = None,
    ) -> None:
        if indices.numel() == 0:
            return
        tokens = bonus_tokens.to(torch.int64)
        torch._assert_async((tokens >= 0).all(), "output_tokens must be >= 0")
        self.output_tokens_buf[indices] = tokens
        self.topk_p_buf[indices] = topk_p.to(torch.float32)
        index = topk_index.to(torch.int64)
        torch._assert_async((index >= 0).all(), "topk_index must be >= 0")
        self.topk_index_buf[indices] = index
        if hidden_states is not None:
            if self.hidden_states_buf is None:
                self.hidden_states_buf = torch.zeros(
                    (self.pool_size, hidden_states.shape[1]),
                    dtype=hidden_states.dtype,
                    device=hidden_states.device,
                )
            self.hidden_states_buf[indices] = hidden_states.to(self.hidden_states_buf.dtype)

    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        seq_lens = new_seq_lens.to(torch.int64)
        torch._assert_async((seq_lens > 0).all(), "new_seq_lens must be > 0")
        self.new_seq_lens_buf[indices] = seq_lens
        self._ready.record()

    def invalidate(self, batch: BaselineBatch, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        batch.input_ids = -indices

    def release(self, indices: torch.Tensor) -> None:
        """A request ended; its slot may be reused. Nothing to do without debug checks."""

    def resolve_future(self, batch: _EagleBatch) -> None:
        indices = batch.req_pool_indices
        if indices.numel() == 0:
            return
        input_ids = batch.input_ids
        pending = input_ids < 0
        tokens = self.output_tokens_buf[(-input_ids).clamp(min=0)]
        input_ids.copy_(torch.where(pending, tokens, input_ids))
        spec_info = batch.spec_info
        spec_info.topk_p = self.topk_p_buf[indices]
        spec_info.topk_index = self.topk_index_buf[indices]
        if self.hidden_states_buf is not None:
            spec_info.hidden_states = self.hidden_states_buf[indices]

    def resolve_seq_lens_cpu(self, batch: BaselineBatch) -> None:
        indices = batch.req_pool_indices
        if indices.numel() == 0:
            return
        self._ready.wait()
        batch.seq_lens = self.new_seq_lens_buf[indices]
        batch.seq_lens_cpu = self._ready.to_host(batch.seq_lens)
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
