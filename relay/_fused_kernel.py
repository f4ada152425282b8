# mypy: ignore-errors
# ruff: noqa: SIM102
# Triton's kernel language is not Python that mypy can type; the typed surface is
# relay.fused, which imports this module on its first kernel launch only. The nested ifs
# keep a compile-time test (COUNT, a constexpr) apart from a run-time one (which).
"""The Triton kernel of ``relay.fused.gather_rows`` (Note [Fused gather] in relay/fused.py).

CI runs it under Triton's interpreter on the CPU and compiles it for CUDA
(``tests/runtime/test_fused_interpret.py``); ``tests/gpu/test_gpu_fused_gather.py`` runs it
on a GPU (``scripts/gpu_check.sh``; passed on an H200, docs/gpu.md). Only integer
units are loaded and stored, so the interpreter (which computes in numpy) and the GPU copy
the same bits.
"""

import triton
import triton.language as tl


@triton.jit
def copy_row(src, dst, width, slot, row, start, BLOCK: tl.constexpr):
    """Copy units ``[start, start + BLOCK)`` of row ``slot`` of ``src`` to row ``row`` of
    ``dst``; rows are ``width`` units long."""
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < width
    values = tl.load(src + slot * width + offsets, mask=mask)
    tl.store(dst + row * width + offsets, values, mask=mask)


@triton.jit
def gather(
    indices,
    s0,
    d0,
    w0,
    s1,
    d1,
    w1,
    s2,
    d2,
    w2,
    s3,
    d3,
    w3,
    s4,
    d4,
    w4,
    s5,
    d5,
    w5,
    s6,
    d6,
    w6,
    s7,
    d7,
    w7,
    COUNT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Axis 0 picks the buffer (``COUNT`` of the eight are real), axis 1 the row of
    ``indices``, axis 2 a block of the row's units."""
    which = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    start = tl.program_id(2).to(tl.int64) * BLOCK
    slot = tl.load(indices + row).to(tl.int64)
    if which == 0:
        copy_row(s0, d0, w0, slot, row, start, BLOCK)
    if COUNT > 1:
        if which == 1:
            copy_row(s1, d1, w1, slot, row, start, BLOCK)
    if COUNT > 2:
        if which == 2:
            copy_row(s2, d2, w2, slot, row, start, BLOCK)
    if COUNT > 3:
        if which == 3:
            copy_row(s3, d3, w3, slot, row, start, BLOCK)
    if COUNT > 4:
        if which == 4:
            copy_row(s4, d4, w4, slot, row, start, BLOCK)
    if COUNT > 5:
        if which == 5:
            copy_row(s5, d5, w5, slot, row, start, BLOCK)
    if COUNT > 6:
        if which == 6:
            copy_row(s6, d6, w6, slot, row, start, BLOCK)
    if COUNT > 7:
        if which == 7:
            copy_row(s7, d7, w7, slot, row, start, BLOCK)
