"""Hand-written FutureMaps in sglang's style: what ``relay bench`` compares with.

Written from DOMAIN.md's "sglang today, op by op", as lean as an engine keeps them: no
value checks, gathers by ``buf[req_pool_indices]``, a host copy only where the design
needs one. ``DecodeSeqLensBaseline`` is the older sentinel design that relays
``seq_lens`` too. Stash and publish take keyword tensors named as the generated
payload's fields, so one driver feeds both sides. The fence and the host copy follow
the device: a device-side wait and a pinned copy on a private stream on CUDA, a host
wait on HIP, plain calls on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from relay.cpu_stream import CpuEvent, current_cpu_stream

__all__ = [
    "DecodeBaseline",
    "DecodeSeqLensBaseline",
    "EagleBaseline",
    "PublishReady",
]


class PublishReady:
    """The ``publish_ready`` fence and the host copy behind it, per device. A record
    from another stream than the last first waits on the last record (Note [Fence
    chaining] in relay/device.py)."""

    def __init__(self, device: torch.device) -> None:
        self.cpu = device.type == "cpu"
        self.cuda = device.type == "cuda" and torch.version.hip is None
        # HIP: a device-side wait hurt latency there, so the host blocks instead.
        self.host_wait = self.cpu or (device.type == "cuda" and not self.cuda)
        self.module: Any = None if self.cpu else torch.get_device_module(device.type)
        self.event: Any = None
        self.stream: Any = None
        # CUDA host copy: a private stream into a pinned mirror of the whole buffer.
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
        """Order the scheduler after the newest publish (none: nothing to wait for)."""
        if self.event is not None and self.host_wait:
            self.event.synchronize()
        elif self.event is not None:
            self.module.current_stream().wait_event(self.event)

    def host_rows(
        self, buf: torch.Tensor, batch: Any, rows: torch.Tensor
    ) -> torch.Tensor:
        """The host copy of ``rows = buf[batch.req_pool_indices]``: on CUDA the whole
        buffer copied into a pinned mirror on a private stream behind the fence, the
        rows picked on the host; elsewhere ``rows.cpu()``."""
        if not self.cuda:
            return rows.cpu()
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
        return self.pinned[batch.req_pool_indices_cpu]


class DecodeBaseline:
    """Plain decoding, sglang today: the sampled token relayed to the next ``input_ids``;
    the scheduler computes ``seq_lens + 1`` on the host itself."""

    def __init__(self, device: torch.device | str, pool_size: int) -> None:
        self.device = torch.device(device)
        self.pool_size = pool_size
        self.output_tokens_buf = torch.zeros(
            (pool_size,), dtype=torch.int64, device=self.device
        )

    def stash(self, indices: torch.Tensor, *, next_token_ids: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        self.output_tokens_buf[indices] = next_token_ids.to(torch.int64)

    def resolve_future(self, batch: Any) -> None:
        indices = batch.req_pool_indices
        if indices.numel() == 0:
            return
        batch.input_ids = self.output_tokens_buf[indices]


class DecodeSeqLensBaseline:
    """Plain decoding, sglang's sentinel design of 2026-05: tokens through placeholders
    in ``input_ids``, and the new sequence lengths relayed to the scheduler."""

    def __init__(self, device: torch.device | str, pool_size: int) -> None:
        self.device = torch.device(device)
        self.pool_size = pool_size
        self.output_tokens_buf = torch.zeros(
            (pool_size,), dtype=torch.int64, device=self.device
        )
        self.new_seq_lens_buf = torch.zeros(
            (pool_size,), dtype=torch.int64, device=self.device
        )
        self._ready = PublishReady(self.device)

    def stash(self, indices: torch.Tensor, *, next_token_ids: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        self.output_tokens_buf[indices] = next_token_ids.to(torch.int64)

    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        self.new_seq_lens_buf[indices] = new_seq_lens.to(torch.int64)
        self._ready.record()

    def invalidate(self, batch: Any, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        batch.input_ids = -indices  # slots start at 1: a placeholder is always < 0

    def resolve_future(self, batch: Any) -> None:
        if batch.req_pool_indices.numel() == 0:
            return
        input_ids = batch.input_ids
        tokens = self.output_tokens_buf[(-input_ids).clamp(min=0)]
        input_ids.copy_(torch.where(input_ids < 0, tokens, input_ids))

    def resolve_seq_lens_cpu(self, batch: Any) -> None:
        indices = batch.req_pool_indices
        if indices.numel() == 0:
            return
        self._ready.wait()
        batch.seq_lens = self.new_seq_lens_buf[indices]
        batch.seq_lens_cpu = self._ready.host_rows(
            self.new_seq_lens_buf, batch, batch.seq_lens
        )
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())


class EagleBaseline:
    """EAGLE, sglang today: the bonus token, the draft's first top-k and (when the draft
    reads it) the hidden state gathered into the draft input; the accepted lengths
    published mid-forward for the scheduler."""

    def __init__(
        self, device: torch.device | str, pool_size: int, *, topk: int
    ) -> None:
        self.device = torch.device(device)
        self.pool_size = pool_size
        self.output_tokens_buf = torch.zeros(
            (pool_size,), dtype=torch.int64, device=self.device
        )
        self.topk_p_buf = torch.zeros(
            (pool_size, topk), dtype=torch.float32, device=self.device
        )
        self.topk_index_buf = torch.zeros(
            (pool_size, topk), dtype=torch.int64, device=self.device
        )
        # Width and dtype come from the draft model: allocated by the first stash that
        # carries it, checked per stash (an early payload without it must not disable it).
        self.hidden_states_buf: torch.Tensor | None = None
        self.new_seq_lens_buf = torch.zeros(
            (pool_size,), dtype=torch.int64, device=self.device
        )
        self._ready = PublishReady(self.device)

    def stash(
        self,
        indices: torch.Tensor,
        *,
        bonus_tokens: torch.Tensor,
        topk_p: torch.Tensor,
        topk_index: torch.Tensor,
        hidden_states: torch.Tensor | None = None,
    ) -> None:
        if indices.numel() == 0:
            return
        self.output_tokens_buf[indices] = bonus_tokens.to(torch.int64)
        self.topk_p_buf[indices] = topk_p.to(torch.float32)
        self.topk_index_buf[indices] = topk_index.to(torch.int64)
        if hidden_states is not None:
            if self.hidden_states_buf is None:
                self.hidden_states_buf = torch.zeros(
                    (self.pool_size, hidden_states.shape[1]),
                    dtype=hidden_states.dtype,
                    device=self.device,
                )
            self.hidden_states_buf[indices] = hidden_states.to(
                self.hidden_states_buf.dtype
            )

    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        self.new_seq_lens_buf[indices] = new_seq_lens.to(torch.int64)
        self._ready.record()

    def resolve_future(self, batch: Any) -> None:
        indices = batch.req_pool_indices
        if indices.numel() == 0:
            return
        spec_info = batch.spec_info
        spec_info.bonus_tokens = self.output_tokens_buf[indices]
        spec_info.topk_p = self.topk_p_buf[indices]
        spec_info.topk_index = self.topk_index_buf[indices]
        if self.hidden_states_buf is not None:
            spec_info.hidden_states = self.hidden_states_buf[indices]

    def resolve_seq_lens_cpu(self, batch: Any) -> None:
        indices = batch.req_pool_indices
        if indices.numel() == 0:
            return
        self._ready.wait()
        batch.seq_lens = self.new_seq_lens_buf[indices]
        batch.seq_lens_cpu = self._ready.host_rows(
            self.new_seq_lens_buf, batch, batch.seq_lens
        )
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
