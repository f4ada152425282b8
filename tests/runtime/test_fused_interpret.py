"""relay.fused's Triton kernel on the CPU, on every run: launched by Triton's interpreter
(Note [Interpreted kernels in tests]) and compared with ``index_select`` byte for byte,
and compiled for CUDA (PTX, then a cubin by the ptxas Triton ships) with no GPU.

The kernel copies raw integer units (Note [Fused gather]), so the interpreter, which runs
its loads and stores in numpy, moves the same bits a GPU does; what only a GPU shows
(launch, alignment, speed) is left to ``tests/gpu/test_gpu_fused_gather.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fused_support import assert_same_bits, raw_bytes
from relay_runtime_support import Batch, eagle_payload, slots
from triton_interpret import REPO, Interpreted, load_module

from relay import fused
from relay.maps.eagle import EagleFutureMap
from relay.maps.eagle_packed import EaglePackedFutureMap, EaglePackedPayload

KERNEL_FILE = REPO / "relay" / "_fused_kernel.py"
BLOCK = fused._BLOCK
POOL = 19
#: Slots with repeats, both ends of the pool and the scratch row 0.
SLOTS = (5, 0, POOL - 1, 5, 7, 5)

#: Every dtype a relay buffer may hold.
DTYPES = [
    torch.bool,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
#: Row shapes: one unit per row up to several blocks (a buffer alone copies in units of
#: its own element size, so elements are units here).
ROWS = [(), (1,), (7,), (2, 3), (BLOCK,), (BLOCK + 1,), (3 * BLOCK - 5,)]


@pytest.fixture(scope="module")
def module() -> Any:
    """A private, interpreted copy of relay/_fused_kernel.py."""
    return load_module(KERNEL_FILE, "_fused_kernel_interpreted", interpret=True)


@pytest.fixture
def kernel(module: Any) -> Interpreted:
    """The interpreted ``gather``, counting its launches."""
    return Interpreted(module.gather)


@pytest.fixture
def on_the_cpu(kernel: Interpreted, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``gather_rows`` takes its kernel path for CPU tensors, launching the interpreted
    kernel (the path CUDA takes, device test aside)."""
    monkeypatch.setattr(fused, "_runs_kernel", lambda indices: True)
    monkeypatch.setattr(fused, "_kernel", lambda: kernel)
    yield


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random bits of ``dtype`` (floats: any bit pattern, so NaN payloads, infinities,
    -0.0 and subnormals too); bools 0 or 1."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    count = math.prod(shape) * dtype.itemsize
    raw = torch.randint(0, 256, (count,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_dtype_and_row_width_is_copied_bit_for_bit(
    kernel: Interpreted, dtype: torch.dtype, index_dtype: torch.dtype
) -> None:
    """One buffer of each dtype, rows of 1 unit to several blocks, repeated slots and slot
    0: the kernel's rows are index_select's, bit for bit, one launch each."""
    index = torch.tensor(SLOTS, dtype=index_dtype)
    for seed, row in enumerate(ROWS):
        buffer = _random((POOL, *row), dtype, seed)
        assert fused._takes(index, [buffer])
        assert_same_bits(fused._gather(kernel, index, [buffer]), [buffer], index)
    assert len(kernel.launches) == len(ROWS)


@pytest.mark.parametrize("count", [*range(1, fused.MAX_BUFFERS + 1), 9, 17])
def test_one_launch_gathers_up_to_eight_buffers_of_mixed_dtypes(
    kernel: Interpreted, count: int
) -> None:
    """1 to 8 buffers of mixed dtypes and widths are one launch (copied in the smallest
    element size among them); more take one launch per 8."""
    index = torch.tensor(SLOTS, dtype=torch.int64)
    rows = [(3,), (), (BLOCK + 3,), (2, 5), (1,)]
    buffers = [
        _random((POOL, *rows[k % len(rows)]), DTYPES[(3 * k + count) % len(DTYPES)], k)
        for k in range(count)
    ]
    assert_same_bits(fused._gather(kernel, index, buffers), buffers, index)
    assert len(kernel.launches) == -(-count // fused.MAX_BUFFERS)
    assert kernel.launches[0][0] == min(count, fused.MAX_BUFFERS)  # axis 0: the buffer


def test_every_dtype_in_one_call(kernel: Interpreted) -> None:
    """All ten dtypes together, rows several blocks wide, int32 slots: bit for bit."""
    index = torch.tensor(SLOTS, dtype=torch.int32)
    buffers = [
        _random((POOL, 2 * BLOCK + k), dtype, k) for k, dtype in enumerate(DTYPES)
    ]
    assert_same_bits(fused._gather(kernel, index, buffers), buffers, index)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_an_empty_batch_launches_nothing(
    kernel: Interpreted, index_dtype: torch.dtype
) -> None:
    """Zero slots (an idle rank): empty rows of each buffer's row shape and dtype, and no
    launch."""
    index = torch.empty(0, dtype=index_dtype)
    buffers = [_random((POOL, 4), torch.bfloat16, 0), _random((POOL,), torch.bool, 1)]
    assert_same_bits(fused._gather(kernel, index, buffers), buffers, index)
    assert kernel.launches == []


def test_rows_of_width_zero_launch_nothing(kernel: Interpreted) -> None:
    """Buffers whose rows hold no element: empty rows per slot, and no launch."""
    index = torch.tensor(SLOTS)
    buffers = [torch.empty(POOL, 0, dtype=torch.float16), torch.empty(POOL, 3, 0)]
    assert_same_bits(fused._gather(kernel, index, buffers), buffers, index)
    assert kernel.launches == []


@pytest.mark.usefixtures("on_the_cpu")
def test_gather_rows_takes_the_kernel_where_it_can(kernel: Interpreted) -> None:
    """gather_rows launches the kernel for what it takes, and sends the rest (a column
    view, complex rows, a transposed buffer) to index_select; 2-D or int16 slots, a 0-dim
    buffer or none are refused too."""
    index = torch.tensor(SLOTS)
    buffers = [_random((POOL, 3), torch.float32, 0), _random((POOL,), torch.int64, 1)]
    assert_same_bits(fused.gather_rows(index, buffers), buffers, index)
    assert len(kernel.launches) == 1

    packed = _random((POOL, 4), torch.int64, 2)
    column = packed[:, 1:]
    complex_rows = torch.randn(POOL, 2, dtype=torch.complex64)
    refused: list[tuple[torch.Tensor, list[torch.Tensor]]] = [
        (index, [column]),
        (index, [buffers[0], complex_rows]),
        (index, [_random((3, POOL), torch.int32, 3).t()]),
    ]
    for slots_, bufs in refused:
        assert not fused._takes(slots_, bufs)
        assert_same_bits(fused.gather_rows(slots_, bufs), bufs, slots_)
    assert not fused._takes(index.reshape(2, 3), buffers)
    assert not fused._takes(index.to(torch.int16), buffers)
    assert not fused._takes(index, [torch.tensor(1.0)])
    assert not fused._takes(index, [])
    assert len(kernel.launches) == 1, "a refused call reached the kernel"


@pytest.mark.usefixtures("on_the_cpu")
@pytest.mark.parametrize("debug", [False, True])
def test_packed_eagle_with_the_kernel_resolves_what_eagle_resolves(
    kernel: Interpreted, debug: bool
) -> None:
    """eagle_packed with fused_gather set, its gather run by the kernel, hands each batch
    the bits eagle's separate gathers hand it, with and without hidden states."""
    generator = torch.Generator().manual_seed(3)
    separate = EagleFutureMap("cpu", POOL, topk=3, debug=debug)
    packed = EaglePackedFutureMap("cpu", POOL, topk=3, debug=debug)
    packed.fused_gather = True
    for step in range(4):
        chosen = torch.randperm(POOL - 1, generator=generator)[: 2 + step] + 1
        values = [int(v) for v in chosen]
        hidden = (
            torch.randn(len(values), 6, generator=generator).bfloat16()
            if step % 2
            else None
        )
        payload = eagle_payload(len(values), 3, base=10 * step, hidden=hidden)
        separate.stash(slots(*values), payload)
        packed.stash(
            slots(*values),
            EaglePackedPayload(
                bonus_tokens=payload.bonus_tokens,
                topk_p=payload.topk_p,
                topk_index=payload.topk_index,
                hidden_states=payload.hidden_states,
            ),
        )
        batches = [Batch(req_pool_indices=slots(*values)) for _ in range(2)]
        separate.resolve_future(batches[0])
        packed.resolve_future(batches[1])
        for name in ("bonus_tokens", "topk_p", "topk_index", "hidden_states"):
            want, got = (getattr(b.spec_info, name) for b in batches)
            if want is None or got is None:
                assert want is None and got is None, name
                continue
            assert got.dtype == want.dtype and torch.equal(
                raw_bytes(got), raw_bytes(want)
            ), f"step {step}: {name}"
    assert len(kernel.launches) == 4  # one launch per resolve, whatever it carried


@pytest.mark.parametrize(
    ("index_type", "unit_type", "count"),
    [("*i32", "*i8", fused.MAX_BUFFERS), ("*i64", "*i64", 1)],
)
def test_the_kernel_compiles_for_cuda(
    index_type: str,
    unit_type: str,
    count: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compiled kernel (not the interpreter's Python) lowers to PTX and assembles to a
    cubin for sm_90, with no GPU: what the interpreter does not check (typing of the
    kernel language, constexpr pruning) holds."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compiled afresh each run
    module = load_module(KERNEL_FILE, "_fused_kernel_compiled", interpret=False)
    signature = {"indices": index_type}
    for k in range(fused.MAX_BUFFERS):
        signature |= {f"s{k}": unit_type, f"d{k}": unit_type, f"w{k}": "i32"}
    signature |= {"COUNT": "constexpr", "BLOCK": "constexpr"}
    constants = {"COUNT": count, "BLOCK": BLOCK}
    source = ASTSource(module.gather, signature, constants)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False}
    )
    assert ".entry gather(" in compiled.asm["ptx"]
    assert len(compiled.asm["cubin"]) > 0
