"""What the fused-gather tests (tests/runtime on the CPU, tests/gpu on CUDA) compare:
gathered rows against ``index_select``, as raw bytes, so NaN payloads and -0.0 count."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes, flat."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_same_bits(
    got: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor], index: torch.Tensor
) -> None:
    """Each of ``got`` is ``buffers[k].index_select(0, index)``: shape, dtype, device and
    every bit."""
    assert len(got) == len(buffers)
    for k, (out, buf) in enumerate(zip(got, buffers)):
        want = buf.index_select(0, index)
        assert (out.shape, out.dtype, out.device) == (
            want.shape,
            want.dtype,
            want.device,
        ), f"buffer {k}"
        assert torch.equal(raw_bytes(out), raw_bytes(want)), (
            f"buffer {k} ({buf.dtype}, row {tuple(buf.shape[1:])}) differs"
        )
