"""One launch for the gathers of a forward-side resolve: ``gather_rows``.

``gather_rows(indices, buffers)`` returns ``[buf.index_select(0, indices) for buf in
buffers]``, bit for bit. On CUDA, with Triton importable, it does so with one kernel
launch for up to ``MAX_BUFFERS`` buffers of any dtypes (sglang fills its draft input with
one fused gather kernel, DOMAIN.md); elsewhere, and for anything the kernel does not
take, it runs the torch path. Triton is imported on the first CUDA call only, so the CPU
path never imports it.

Note [Fused gather]
The kernel copies rows as raw units of the smallest element size among the buffers (1,
2, 4 or 8 bytes): every dtype's size is a power of two, so each buffer's row is a whole
number of units and each buffer's address is aligned to a unit; copying units is
bit-identical to ``index_select`` for every dtype (NaN payloads and -0.0 included).
Buffers are passed as separate arguments (no device-side pointer table, so no host-to-
device copy per call and nothing that breaks CUDA graph capture); program axis 0 picks
the buffer, axis 1 the row, axis 2 a block of the row's units.

Like sglang's kernel, it does not check slots: an out-of-range slot reads another
row's memory instead of raising as ``index_select`` does. Debug mode checks every slot
before a resolve reads anything (``DebugChecks.check_slots``).

Where it runs: CI runs the kernel on every run under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors; ``tests/runtime/test_fused_interpret.py``), bit for
bit against ``index_select`` over every dtype a relay buffer holds, and compiles it for
CUDA (PTX and cubin, with the ptxas Triton ships) without a GPU. On an H200
(2026-11-27, docs/gpu.md) ``tests/gpu/test_gpu_fused_gather.py`` passed, and an EAGLE
step launched 8 kernels against the baseline's 11 but took 1.44-1.85x its time: Triton's
Python launcher costs more than the launches it saves, so maps leave it off by default.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["MAX_BUFFERS", "gather_rows", "gather_rows_optional", "triton_available"]

#: Buffers one launch gathers; more are gathered in further launches of up to as many.
MAX_BUFFERS = 8
#: Units of a row one program copies.
_BLOCK = 1024
#: CUDA's limit on grid axes 1 and 2.
_GRID_LIMIT = 65535

_UNIT_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def gather_rows(
    indices: torch.Tensor, buffers: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``[buf.index_select(0, indices) for buf in buffers]``, in one launch on CUDA when
    it can (Note [Fused gather])."""
    if not (_runs_kernel(indices) and _takes(indices, buffers) and triton_available()):
        return [buf.index_select(0, indices) for buf in buffers]
    return _gather(_kernel(), indices, buffers)


def gather_rows_optional(
    indices: torch.Tensor,
    buffers: Sequence[torch.Tensor],
    optional: Sequence[torch.Tensor | None],
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """``gather_rows`` over ``buffers`` and the ``optional`` buffers that are not ``None``,
    in the same launch; ``None`` stays ``None`` (an optional field the latest stash did
    not carry)."""
    present = [buf for buf in optional if buf is not None]
    rows = gather_rows(indices, [*buffers, *present])
    taken = iter(rows[len(buffers) :])
    return rows[: len(buffers)], [
        None if buf is None else next(taken) for buf in optional
    ]


@functools.cache
def triton_available() -> bool:
    """Whether Triton can be imported (checked once, on the first call the kernel could take)."""
    return importlib.util.find_spec("triton") is not None


def _runs_kernel(indices: torch.Tensor) -> bool:
    """Whether the kernel runs where ``indices`` live: CUDA only (Triton's interpreter runs
    it on the CPU too, but only the tests ask it to)."""
    return indices.is_cuda


def _takes(indices: torch.Tensor, buffers: Sequence[torch.Tensor]) -> bool:
    """Whether the kernel takes these arguments, whatever the device: 1-D int32 or int64
    slots, at most ``_GRID_LIMIT`` of them, and contiguous, non-complex buffers of at
    least one dim beside them."""
    if not buffers or indices.dim() != 1:
        return False
    if indices.numel() > _GRID_LIMIT or indices.dtype not in (torch.int32, torch.int64):
        return False
    for buf in buffers:
        if buf.device != indices.device or not buf.is_contiguous() or buf.dim() == 0:
            return False
        if buf.is_complex():  # torch views complex bytes differently; keep it simple
            return False
    return True


def _gather(
    kernel: Any, indices: torch.Tensor, buffers: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """The kernel path of ``gather_rows`` for arguments ``_takes``: fresh outputs, filled
    by one launch of ``kernel`` per ``MAX_BUFFERS`` buffers."""
    outputs = [
        torch.empty(
            (indices.numel(), *buf.shape[1:]), dtype=buf.dtype, device=buf.device
        )
        for buf in buffers
    ]
    for start in range(0, len(buffers), MAX_BUFFERS):
        _launch(
            kernel,
            indices,
            buffers[start : start + MAX_BUFFERS],
            outputs[start : start + MAX_BUFFERS],
        )
    return outputs


def _units(buffers: Sequence[torch.Tensor]) -> int:
    """The copy unit in bytes: the smallest element size, at most 8 (Note [Fused gather])."""
    return min(8, *(buf.dtype.itemsize for buf in buffers))


def _as_units(tensor: torch.Tensor, unit: int) -> torch.Tensor:
    """``tensor``'s bytes as a flat tensor of ``unit``-byte integers (no copy)."""
    flat = tensor.reshape(-1)
    if flat.dtype == _UNIT_DTYPES[unit]:
        return flat
    return flat.view(torch.uint8).view(_UNIT_DTYPES[unit])


def _launch(
    kernel: Any,
    indices: torch.Tensor,
    buffers: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
) -> None:
    unit = _units(buffers)
    n = indices.numel()
    widths = [math.prod(buf.shape[1:]) * buf.dtype.itemsize // unit for buf in buffers]
    if n == 0 or max(widths) == 0:
        return  # an empty batch, or rows of width 0: nothing to copy, nothing launched
    blocks = -(-max(widths) // _BLOCK)
    if blocks > _GRID_LIMIT:
        for buf, out in zip(buffers, outputs):
            torch.index_select(buf, 0, indices, out=out)
        return
    args: list[Any] = []
    first_src, first_dst = _as_units(buffers[0], unit), _as_units(outputs[0], unit)
    for slot in range(MAX_BUFFERS):
        if slot < len(buffers):
            args += [
                _as_units(buffers[slot], unit),
                _as_units(outputs[slot], unit),
                widths[slot],
            ]
        else:  # unused: never read, the kernel is specialized on COUNT
            args += [first_src, first_dst, 0]
    # No float arithmetic happens (raw units are moved), so FP fusion is moot; naming it
    # keeps Triton 3.9 from warning that its default will change.
    kernel[(len(buffers), n, blocks)](
        indices,
        *args,
        COUNT=len(buffers),
        BLOCK=_BLOCK,
        enable_fp_fusion=False,
    )


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, imported on first use so that importing relay never imports triton."""
    return importlib.import_module("relay._fused_kernel").gather
