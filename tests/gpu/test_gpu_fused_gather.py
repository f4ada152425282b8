"""relay.fused.gather_rows on CUDA: one Triton launch, bit for bit the torch gathers.

Written without a GPU (Note [Fused gather] in relay/fused.py): these tests are the
first that run the kernel. Values are compared as raw bytes, so NaN payloads and -0.0
count too.
"""

from __future__ import annotations

import pytest
import torch
from fused_support import assert_same_bits, raw_bytes
from gpu_maps import BundledMap, random_slots

from relay.fused import MAX_BUFFERS, gather_rows, triton_available
from relay.schema import Lane

pytestmark = pytest.mark.gpu

POOL = 17


def _forward_buffers(bundled: BundledMap, relay: object) -> list[torch.Tensor]:
    """What a forward-side resolve gathers: each packed buffer, and the buffer of every
    forward field that is not a view of one."""
    tensors = bundled.tensors(relay)
    packed = [t for name, t in tensors.items() if name.endswith("_packed")]
    storages = {t.untyped_storage().data_ptr() for t in packed}
    fields = []
    for f in bundled.forward:
        buf = getattr(relay, f"{f.name}_buf")
        if buf is not None and buf.untyped_storage().data_ptr() not in storages:
            fields.append(buf)
    return [*packed, *fields]


def test_the_kernel_is_the_path_taken(cuda: torch.device) -> None:
    """With Triton importable, a CUDA gather launches one kernel and no index_select."""
    pytest.importorskip("triton")
    assert triton_available()
    buffers = [
        torch.arange(40, device=cuda).reshape(20, 2),
        torch.rand(20, 3, device=cuda),
    ]
    index = torch.tensor([4, 0, 19], device=cuda)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        got = gather_rows(index, buffers)
        torch.cuda.synchronize(cuda)
    kernels = [
        e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    assert not any(
        "index_select" in name or "indexSelect" in name for name in kernels
    ), kernels
    assert sum("gather" in name for name in kernels) == 1, kernels
    assert_same_bits(got, buffers, index)


def test_every_bundled_maps_forward_lane_matches_the_torch_path(
    bundled: BundledMap, cuda: torch.device
) -> None:
    """For each bundled map after a stash (lazy buffers allocated): the fused gather of its
    forward-lane buffers equals index_select, with int64 and int32 slots, row 0 included."""
    relay = bundled.new(cuda, POOL)
    n = 5
    indices = torch.tensor(random_slots(n, POOL, seed=3), device=cuda)
    bundled.stash(
        relay, indices, bundled.values(bundled.forward, n, base=11, device=cuda)
    )
    buffers = _forward_buffers(bundled, relay)
    if not any(f.lane is Lane.FORWARD for f in bundled.schema.fields):
        assert buffers == []
        return
    for index in (indices, torch.cat([indices[:2], indices.new_zeros(1)]).int()):
        assert_same_bits(gather_rows(index, buffers), buffers, index)


def test_mixed_dtypes_wide_rows_and_more_buffers_than_one_launch(
    cuda: torch.device,
) -> None:
    """Bool, int8, bf16, float32 with NaN and -0.0, float64, rows wider than a block, and
    more than MAX_BUFFERS buffers (two launches): all bit-identical."""
    generator = torch.Generator(device=cuda).manual_seed(0)
    pool = 33
    buffers = [
        torch.rand(pool, 3, device=cuda, generator=generator) > 0.5,
        torch.randint(
            -128, 127, (pool,), dtype=torch.int8, device=cuda, generator=generator
        ),
        torch.randn(pool, 4096, device=cuda, generator=generator).to(torch.bfloat16),
        torch.randn(pool, 5, device=cuda, generator=generator),
        torch.randn(pool, 2, 3, dtype=torch.float64, device=cuda, generator=generator),
        torch.randint(0, 1 << 40, (pool, 8), device=cuda, generator=generator),
    ]
    buffers[3][1, 0] = float("nan")
    buffers[3][2, 1] = -0.0
    buffers = buffers + [b.clone() for b in buffers]
    assert len(buffers) > MAX_BUFFERS
    index = torch.tensor([2, 1, 32, 0, 2, 7], device=cuda)
    assert_same_bits(gather_rows(index, buffers), buffers, index)


def test_what_the_kernel_does_not_take_runs_the_torch_path(cuda: torch.device) -> None:
    """A non-contiguous buffer (a packed column view) is gathered by index_select."""
    packed = torch.arange(60, device=cuda).reshape(20, 3)
    column = packed[:, 1:]
    index = torch.tensor([5, 6], device=cuda)
    assert_same_bits(gather_rows(index, [column]), [column], index)


def test_packed_maps_built_with_fused_gather_resolve_what_the_torch_path_does(
    bundled: BundledMap, cuda: torch.device
) -> None:
    """A packed map's resolve_future with fused_gather set hands the batch the same bits
    as with the torch gathers, with and without the optional fields carried."""
    maps = [bundled.new(cuda, POOL), bundled.new(cuda, POOL)]
    if not hasattr(maps[1], "fused_gather"):
        pytest.skip(f"{bundled.stem} is not a packed map")
    maps[1].fused_gather = True
    for step in range(3):
        n = step + 2
        indices = torch.tensor(random_slots(n, POOL, seed=step), device=cuda)
        values = bundled.values(bundled.forward, n, base=100 * step, device=cuda)
        if step == 1:  # an optional field left out: the fused path hands over None too
            values = {
                f.name: v
                for f, v in zip(bundled.forward, values.values())
                if not f.optional
            }
        batches = []
        for relay in maps:
            stash_values = {f.name: values.get(f.name) for f in bundled.forward}
            bundled.stash(relay, indices, stash_values)
            batch = bundled.batch(indices)
            relay.resolve_future(batch)
            batches.append(batch)
        for f in bundled.forward:
            if f.target is None:
                continue
            plain, fused = (_get(b, f.target) for b in batches)
            if plain is None or fused is None:
                assert plain is None and fused is None, f.name
                continue
            assert torch.equal(raw_bytes(plain), raw_bytes(fused)), f.name


def _get(obj: object, path: str) -> torch.Tensor | None:
    for part in path.split("."):
        obj = getattr(obj, part)
    assert obj is None or isinstance(obj, torch.Tensor)
    return obj
