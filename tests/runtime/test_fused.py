"""relay.fused on the CPU: the torch path, and no triton import (the kernel is CUDA-only)."""

from __future__ import annotations

import subprocess
import sys

import torch

from relay.fused import gather_rows


def test_cpu_gather_rows_is_index_select_per_buffer() -> None:
    """Each output equals buf.index_select(0, indices), dtype and row shape kept."""
    buffers = [
        torch.arange(30).reshape(10, 3),
        torch.rand(10, 2, 2).to(torch.bfloat16),
        torch.rand(10) > 0.5,
    ]
    indices = torch.tensor([9, 0, 4, 4], dtype=torch.int32)
    got = gather_rows(indices, buffers)
    for out, buf in zip(got, buffers):
        want = buf.index_select(0, indices)
        assert out.dtype == want.dtype and torch.equal(out, want)


def test_the_cpu_path_never_imports_triton() -> None:
    """Importing relay and gathering on the CPU leaves triton unimported."""
    code = (
        "import sys, torch, relay.fused as f; "
        "f.gather_rows(torch.tensor([1]), [torch.zeros(3, 2)]); "
        "import relay.maps.eagle_packed; "
        "print('triton' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
