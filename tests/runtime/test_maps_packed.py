"""The packed layout (Note [Packed layout]): one buffer per dtype, same values as separate ones.

The bundled ``eagle_packed`` map must hand every batch exactly what ``eagle`` hands it,
with and without debug mode, while its int64 fields live in one buffer that one gather
resolves. A generated probe schema covers what EAGLE does not: multi-dim rows, fixed
widths, and several packed dtypes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from relay_runtime_support import Batch, eagle_payload, load_generated, slots

from relay.errors import RelayDebugError
from relay.maps.eagle import EagleFutureMap
from relay.maps.eagle_packed import EaglePackedFutureMap, EaglePackedPayload
from relay.schema import Field, Lane, Layout, Schema

POOL = 9
TOPK = 3
HIDDEN = 5


def _packed(payload: Any) -> EaglePackedPayload:
    return EaglePackedPayload(
        bonus_tokens=payload.bonus_tokens,
        topk_p=payload.topk_p,
        topk_index=payload.topk_index,
        hidden_states=payload.hidden_states,
    )


def _resolved(relay: Any, *values: int) -> dict[str, torch.Tensor | None]:
    batch = Batch(req_pool_indices=slots(*values))
    relay.resolve_future(batch)
    info = batch.spec_info
    return {
        "bonus_tokens": info.bonus_tokens,
        "topk_p": info.topk_p,
        "topk_index": info.topk_index,
        "hidden_states": info.hidden_states,
    }


def _same(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> None:
    assert a.keys() == b.keys()
    for name, left in a.items():
        right = b[name]
        if left is None or right is None:
            assert left is None and right is None, name
            continue
        assert left.shape == right.shape and left.dtype == right.dtype, name
        assert torch.equal(left, right), name


@pytest.mark.parametrize("debug", [False, True])
def test_packed_eagle_resolves_what_eagle_resolves(debug: bool) -> None:
    """Steps over overlapping slots, with and without hidden states: identical batches."""
    generator = torch.Generator().manual_seed(7)
    separate = EagleFutureMap("cpu", POOL, topk=TOPK, debug=debug)
    packed = EaglePackedFutureMap("cpu", POOL, topk=TOPK, debug=debug)
    for step in range(12):
        chosen = torch.randperm(POOL - 1, generator=generator)[: 1 + step % 4] + 1
        values = [int(v) for v in chosen]
        hidden = (
            torch.rand(len(values), HIDDEN, generator=generator) if step % 3 else None
        )
        payload = eagle_payload(len(values), TOPK, base=10 * step, hidden=hidden)
        separate.stash(slots(*values), payload)
        packed.stash(slots(*values), _packed(payload))
        _same(_resolved(separate, *values), _resolved(packed, *values))


def test_int64_fields_are_fixed_views_of_one_buffer() -> None:
    """output_tokens_buf and topk_index_buf are columns of the packed buffer; a stash writes
    through them, and topk_p (the only float32 field) keeps its own buffer."""
    relay = EaglePackedFutureMap("cpu", POOL, topk=TOPK)
    packed = relay._int64_packed
    assert packed.shape == (POOL, 1 + TOPK)
    assert relay.output_tokens_buf.data_ptr() == packed.data_ptr()
    assert relay.topk_index_buf.data_ptr() == packed[:, 1:].data_ptr()
    assert (
        relay.topk_p_buf.untyped_storage().data_ptr()
        != packed.untyped_storage().data_ptr()
    )
    relay.stash(slots(2), eagle_payload(1, TOPK, base=40))
    assert packed[2].tolist() == [40, 40, 41, 42]


def test_resolved_views_do_not_follow_later_stashes() -> None:
    """The batch holds views of a gathered block, never of the buffer: a later stash of the
    same slots leaves what an earlier resolve handed over."""
    relay = EaglePackedFutureMap("cpu", POOL, topk=TOPK)
    relay.stash(slots(1, 2), eagle_payload(2, TOPK, base=5))
    first = _resolved(relay, 1, 2)
    relay.stash(slots(1, 2), eagle_payload(2, TOPK, base=50))
    assert first["bonus_tokens"] is not None and first["topk_index"] is not None
    assert first["bonus_tokens"].tolist() == [5, 6]
    assert first["topk_index"].tolist() == [[5, 6, 7], [8, 9, 10]]


def test_debug_mode_catches_a_double_read_of_a_packed_field() -> None:
    """Debug freshness works on the column views: a second resolve of one stash is caught."""
    relay = EaglePackedFutureMap("cpu", POOL, topk=TOPK, debug=True)
    relay.stash(slots(3), eagle_payload(1, TOPK))
    _resolved(relay, 3)
    with pytest.raises((RuntimeError, RelayDebugError), match="not written since"):
        _resolved(relay, 3)


PROBE = Schema(
    name="ProbePackedFutureMap",
    doc="Packed groups of two dtypes, multi-dim and fixed-width rows.",
    layout=Layout.PACKED,
    fields=[
        Field(
            "a", lane=Lane.FORWARD, dtype=torch.float32, shape=("k", 2), target="spec.a"
        ),
        Field("b", lane=Lane.FORWARD, dtype=torch.int32, target="spec.b"),
        Field("c", lane=Lane.FORWARD, dtype=torch.float32, shape=(3,), target="spec.c"),
        Field(
            "d", lane=Lane.FORWARD, dtype=torch.int32, shape=(2, "k"), target="spec.d"
        ),
        Field("e", lane=Lane.FORWARD, dtype=torch.float32, target="spec.e"),
        Field("alone", lane=Lane.FORWARD, dtype=torch.int64, target="spec.alone"),
    ],
)


class _Spec:
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    e: torch.Tensor
    alone: torch.Tensor


class _ProbeBatch:
    def __init__(self, indices: torch.Tensor) -> None:
        self.req_pool_indices = indices
        self.spec = _Spec()


def test_probe_groups_round_trip_every_row_shape(tmp_path: Path) -> None:
    """Two dtype groups (float32: a, c, e; int32: b, d) hand back each field's rows in its
    declared shape; a dtype with one field keeps its own buffer."""
    module = load_generated(PROBE, tmp_path, "probe_packed")
    relay = module.ProbePackedFutureMap("cpu", POOL, k=2)
    assert relay._float32_packed.shape == (POOL, 2 * 2 + 3 + 1)
    assert relay._int32_packed.shape == (POOL, 1 + 2 * 2)
    assert not hasattr(relay, "_int64_packed")
    n = 3
    values = {
        "a": torch.arange(n * 4, dtype=torch.float32).reshape(n, 2, 2),
        "b": torch.arange(n, dtype=torch.int32) + 100,
        "c": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + 0.5,
        "d": torch.arange(n * 4, dtype=torch.int32).reshape(n, 2, 2) + 7,
        "e": torch.arange(n, dtype=torch.float32) - 3,
        "alone": torch.arange(n, dtype=torch.int64) * 11,
    }
    indices = slots(4, 1, 7)
    relay.stash(indices, module.ProbePackedPayload(**values))
    batch = _ProbeBatch(indices)
    relay.resolve_future(batch)
    for name, value in values.items():
        got = getattr(batch.spec, name)
        assert got.shape == value.shape and got.dtype == value.dtype, name
        assert torch.equal(got, value), name
