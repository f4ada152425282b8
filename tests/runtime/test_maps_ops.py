"""Free when off, exactly: the aten ops each generated method dispatches with debug off.

sglang's hand-written FutureMap (DOMAIN.md, "sglang today, op by op") costs 12 ops per
EAGLE step with hidden states at batch >= 2 and 3 per plain-decoding step, counting
kernels. Ops are counted with ``relay.opcount``, which splits data ops (ops that move
data: writes, gathers, sums) from view ops (new headers over the same storage, no
kernel; Note [View ops]); both are asserted per method. The data ops are what the work
needs and nothing more: one indexed write per field stashed or published, one gather per
field resolved (per dtype group in the packed layout), the host sum and its read-out.
Any extra op (a guard, a cast, a clone, a placeholder, a stray view) fails these tests.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from relay_runtime_support import Batch, slots

from relay import runtime
from relay.errors import SlotError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.decode_seq_lens import DecodeSeqLensFutureMap, DecodeSeqLensPayload
from relay.maps.eagle import EagleFutureMap, EaglePayload
from relay.maps.eagle_confidence import EagleConfidenceFutureMap, EagleConfidencePayload
from relay.maps.eagle_draft_probs import (
    EagleDraftProbsFutureMap,
    EagleDraftProbsPayload,
)
from relay.maps.eagle_dsa import EagleDsaFutureMap, EagleDsaPayload
from relay.maps.eagle_multilayer import EagleMultiLayerFutureMap, EagleMultiLayerPayload
from relay.maps.eagle_packed import EaglePackedFutureMap, EaglePackedPayload
from relay.opcount import OpCounts, count_ops, is_view_op
from relay.runtime import HOST_SUM_IN_PYTHON_MAX

POOL = 257
TOPK = 2
HIDDEN = 8


def ops_of(fn: Callable[[], None]) -> list[str]:
    """The data ops ``fn`` dispatches, after checking it dispatches no view op."""
    counts = count_ops(fn)
    assert counts.views == (), counts
    return list(counts.data)


def _eagle_extras(n: int) -> dict[str, torch.Tensor]:
    return {
        "bonus_tokens": torch.arange(n, dtype=torch.int64),
        "topk_p": torch.rand(n, TOPK),
        "topk_index": torch.zeros(n, TOPK, dtype=torch.int64),
    }


Expected = dict[str, tuple[int, int]]


#: The host mirror of a schedule field on the CPU: one ``clone`` (Note [CPU host mirror]).
HOST_COPY = 1


def _cases(n: int) -> list[tuple[str, Any, Any, dict[str, torch.Tensor], Expected]]:
    """(name, map, payload, publish values, expected (data ops, view ops) per method) of
    every bundled map. The packed layout dispatches view ops: per dtype group, one
    split of the gathered block, and one squeeze per scalar field in it; a host sum
    above HOST_SUM_IN_PYTHON_MAX rows one (``Tensor.numpy``'s ``detach``)."""
    # The gather and the host mirror's copy (Note [CPU host mirror]); the host sum is
    # host arithmetic, no data op: in Python up to HOST_SUM_IN_PYTHON_MAX rows, numpy
    # above, whose view of the tensor is one view op.
    host_sum = (1 + HOST_COPY, 0 if n <= HOST_SUM_IN_PYTHON_MAX else 1)
    lens = {"new_seq_lens": torch.full((n,), 5, dtype=torch.int64)}
    hidden = torch.rand(n, HIDDEN).to(torch.bfloat16)
    return [
        (
            "decode",
            DecodeFutureMap("cpu", POOL),
            DecodePayload(next_token_ids=torch.arange(n)),
            {},
            {"stash": (1, 0), "resolve_future": (1, 0)},
        ),
        (
            "decode_seq_lens",
            DecodeSeqLensFutureMap("cpu", POOL),
            DecodeSeqLensPayload(next_token_ids=torch.arange(n)),
            lens,
            {
                "stash": (1, 0),
                "publish": (1, 0),
                "resolve_future": (1, 0),
                "resolve_seq_lens_cpu": host_sum,
            },
        ),
        (
            "eagle",
            EagleFutureMap("cpu", POOL, topk=TOPK),
            EaglePayload(**_eagle_extras(n), hidden_states=hidden),
            lens,
            {
                "stash": (4, 0),
                "publish": (1, 0),
                "resolve_future": (4, 0),
                "resolve_seq_lens_cpu": host_sum,
            },
        ),
        (
            "eagle without hidden states",
            EagleFutureMap("cpu", POOL, topk=TOPK),
            EaglePayload(**_eagle_extras(n)),
            lens,
            {
                "stash": (3, 0),
                "publish": (1, 0),
                "resolve_future": (3, 0),
                "resolve_seq_lens_cpu": host_sum,
            },
        ),
        (
            "eagle_multilayer",
            EagleMultiLayerFutureMap("cpu", POOL, topk=TOPK),
            EagleMultiLayerPayload(**_eagle_extras(n)),
            lens,
            {
                "stash": (3, 0),
                "publish": (1, 0),
                "resolve_future": (3, 0),
                "resolve_seq_lens_cpu": host_sum,
            },
        ),
        (
            "eagle_draft_probs",
            EagleDraftProbsFutureMap("cpu", POOL, topk=TOPK),
            EagleDraftProbsPayload(
                **_eagle_extras(n), hidden_states=hidden, draft_probs=torch.rand(n, 16)
            ),
            lens,
            {
                "stash": (5, 0),
                "publish": (1, 0),
                "resolve_future": (5, 0),
                "resolve_seq_lens_cpu": host_sum,
            },
        ),
        (
            "eagle_dsa",
            EagleDsaFutureMap("cpu", POOL, topk=TOPK),
            EagleDsaPayload(
                **_eagle_extras(n),
                hidden_states=hidden,
                dsa_topk_indices=torch.zeros(n, 4, dtype=torch.int32),
            ),
            lens,
            {
                "stash": (5, 0),
                "publish": (1, 0),
                "resolve_future": (5, 0),
                "resolve_seq_lens_cpu": host_sum,
            },
        ),
        (
            "eagle_confidence",
            EagleConfidenceFutureMap("cpu", POOL, topk=TOPK, draft_tokens=3),
            EagleConfidencePayload(**_eagle_extras(n), hidden_states=hidden),
            {**lens, "draft_confidence": torch.rand(n, 3)},
            {
                "stash": (4, 0),
                "publish": (2, 0),
                "resolve_future": (4, 0),
                "resolve_seq_lens_cpu": host_sum,
                "resolve_draft_confidence_cpu": (1 + HOST_COPY, 0),
            },
        ),
        (
            "eagle_packed",
            EaglePackedFutureMap("cpu", POOL, topk=TOPK),
            EaglePackedPayload(**_eagle_extras(n), hidden_states=hidden),
            lens,
            {
                "stash": (4, 0),
                "publish": (1, 0),
                "resolve_future": (3, 2),
                "resolve_seq_lens_cpu": host_sum,
            },
        ),
        (
            "eagle_packed without hidden states",
            EaglePackedFutureMap("cpu", POOL, topk=TOPK),
            EaglePackedPayload(**_eagle_extras(n)),
            lens,
            {
                "stash": (3, 0),
                "publish": (1, 0),
                "resolve_future": (2, 2),
                "resolve_seq_lens_cpu": host_sum,
            },
        ),
    ]


def _step_ops(
    relay: Any, payload: Any, values: dict[str, torch.Tensor], n: int
) -> Expected:
    """(data ops, view ops) per method of one overlap step, after a warm-up step (lazy
    buffers allocated)."""
    indices = slots(*range(1, n + 1))
    counts: Expected = {}
    for timed in (False, True):
        batch = Batch(req_pool_indices=indices)
        steps: dict[str, Callable[[], None]] = {
            "stash": partial(relay.stash, indices, payload)
        }
        if values:
            steps["publish"] = partial(relay.publish, indices, **values)
        steps["resolve_future"] = partial(relay.resolve_future, batch)
        for name in dir(relay):
            if name.startswith("resolve_") and name != "resolve_future":
                steps[name] = partial(getattr(relay, name), batch)
        for name, call in steps.items():
            ops = count_ops(call)
            if timed:
                counts[name] = (len(ops.data), len(ops.views))
    return counts


def _data_ops(counts: Expected) -> int:
    return sum(data for data, _ in counts.values())


@pytest.mark.parametrize("n", [1, 2, 32, 256])
def test_each_method_dispatches_exactly_the_ops_its_work_needs(n: int) -> None:
    """Debug off, every bundled map: one write per field stashed or published, one gather per
    field (or packed dtype group) resolved, the host sum and its read-out; view ops only
    where the packed layout splits a gathered block; nothing else, at batch 1 and up."""
    # On the CPU, above HOST_SLOTS_IN_PYTHON_MAX slots, each write checks them with one
    # aminmax (Note [Slots on the host]); on CUDA no write checks them.
    check = int(n > runtime.HOST_SLOTS_IN_PYTHON_MAX)
    for name, relay, payload, values, expected in _cases(n):
        for write in ("stash", "publish"):
            if write in expected:
                data, views = expected[write]
                expected[write] = (data + check, views)
        assert _step_ops(relay, payload, values, n) == expected, name


SGLANG_EAGLE_STEP = (
    12  # DOMAIN.md: 5 indexed writes, 5 gathers, the sum and its read-out
)


@pytest.mark.parametrize("n", [4, 16, 256])
def test_eagle_step_costs_fewer_than_sglangs_twelve_ops(n: int) -> None:
    """The EAGLE step with hidden states is 11 data ops (sglang: 12, whose host sum is
    ``sum`` and its read-out, and whose ``.cpu()`` on the CPU hands over ``seq_lens``
    itself as the host copy, where relay clones: Note [CPU host mirror]); packed, one
    gather fewer: 10. Plain decoding is 2 (sglang: 3). Above 32 slots on the CPU, stash
    and publish each check their slots with one more op, which sglang's step does not
    do (a bad slot there writes some rows): 13 and 12, decoding 3."""
    cases = {
        name: (relay, payload, values) for name, relay, payload, values, _ in _cases(n)
    }
    checks = 2 if n > runtime.HOST_SLOTS_IN_PYTHON_MAX else 0
    assert _data_ops(_step_ops(*cases["eagle"], n)) == 11 + checks
    assert _data_ops(_step_ops(*cases["eagle_packed"], n)) == 10 + checks
    assert _data_ops(_step_ops(*cases["decode"], n)) == 2 + checks // 2
    if not checks:
        assert _data_ops(_step_ops(*cases["eagle"], n)) < SGLANG_EAGLE_STEP


def test_packed_resolve_gathers_each_dtype_once() -> None:
    """Packed EAGLE's resolve_future: one gather for the int64 group (bonus token and top-k
    ids), one each for topk_p and hidden states, then the split and the squeeze."""
    relay = EaglePackedFutureMap("cpu", POOL, topk=TOPK)
    indices = slots(1, 2, 3)
    payload = EaglePackedPayload(
        **_eagle_extras(3), hidden_states=torch.rand(3, HIDDEN)
    )
    relay.stash(indices, payload)
    counts = count_ops(partial(relay.resolve_future, Batch(req_pool_indices=indices)))
    assert counts.data == ("index_select",) * 3
    assert counts.views == ("split_with_sizes", "squeeze")


def test_stash_into_packed_columns_runs_no_view_op() -> None:
    """The column views are made once at construction: a stash is one write per field."""
    relay = EaglePackedFutureMap("cpu", POOL, topk=TOPK)
    payload = EaglePackedPayload(**_eagle_extras(2))
    counts = count_ops(partial(relay.stash, slots(1, 2), payload))
    assert counts == count_ops(partial(relay.stash, slots(1, 2), payload))
    assert (counts.data, counts.views) == (("index_copy_",) * 3, ())


@pytest.mark.parametrize(
    ("op", "view"),
    [
        (torch.ops.aten.select.int, True),
        (torch.ops.aten.slice.Tensor, True),
        (torch.ops.aten.split_with_sizes.default, True),
        (torch.ops.aten.squeeze.dim, True),
        (torch.ops.aten.view.default, True),
        (torch.ops.aten.index_select.default, False),
        (torch.ops.aten.index_copy_.default, False),
        (torch.ops.aten.index_fill_.int_Scalar, False),
        (torch.ops.aten.copy_.default, False),
        (torch.ops.aten.sum.default, False),
        (torch.ops.aten._local_scalar_dense.default, False),
    ],
)
def test_view_ops_are_told_from_data_ops_by_torchs_alias_annotations(
    op: Any, view: bool
) -> None:
    """Views alias their input without writing it; writes and fresh results are data ops,
    and the rule agrees with torch's own ``OpOverload.is_view``."""
    assert is_view_op(op) is view
    assert op.is_view is view


def test_an_omitting_stash_costs_one_fill_per_allocated_optional_field() -> None:
    """Omitting hidden states once its buffer exists clears the rows (one op); the resolve
    hands over None with no op (Note [Optional fields])."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    indices = slots(1, 2)
    relay.stash(
        indices, EaglePayload(**_eagle_extras(2), hidden_states=torch.rand(2, HIDDEN))
    )
    without = EaglePayload(**_eagle_extras(2))
    ops = ops_of(partial(relay.stash, indices, without))
    assert ops == ["index_copy_"] * 3 + ["index_fill_"]
    batch = Batch(req_pool_indices=indices)
    assert ops_of(partial(relay.resolve_future, batch)) == ["index_select"] * 3
    assert batch.spec_info.hidden_states is None


def test_zero_indices_dispatch_nothing() -> None:
    """An idle rank's calls dispatch no op at all."""
    empty = slots()
    for name, relay, _, values, _ in _cases(0):
        batch = Batch(req_pool_indices=empty)
        assert ops_of(partial(relay.resolve_future, batch)) == [], name
        if values:
            assert ops_of(partial(relay.publish, empty, **values)) == [], name


def _tensors(relay: Any) -> dict[str, torch.Tensor]:
    """A copy of every tensor a map holds: its buffers, packed blocks and host copies."""
    return {k: v.clone() for k, v in vars(relay).items() if isinstance(v, torch.Tensor)}


def _refusal(call: Callable[[], None]) -> tuple[str, OpCounts]:
    """The ``SlotError`` message ``call`` raises and the ops it dispatched first."""
    errors: list[str] = []

    def attempt() -> None:
        with pytest.raises(SlotError) as raised:
            call()
        errors.append(str(raised.value))

    counts = count_ops(attempt)
    return errors[0], counts


@pytest.mark.parametrize(
    ("bad", "dtype"),
    [(-1, torch.int64), (POOL, torch.int64), (2**40, torch.int64), (-1, torch.int32)],
)
@pytest.mark.parametrize("n", [2, 32])
def test_a_slot_outside_the_pool_is_refused_before_any_write(
    n: int, bad: int, dtype: torch.dtype
) -> None:
    """Debug off, on the CPU, every bundled map: a stash or publish whose last slot is
    outside the pool raises ``SlotError`` naming it, writes no row of any field (the
    CPU kernels would have written the rows before it), checking with no op up to 32
    slots and an aminmax above (the gate's, then the checked path's)."""
    for name, relay, payload, values, _ in _cases(n):
        good = slots(*range(1, n + 1))
        relay.stash(good, payload)  # allocates lazy buffers
        if values:
            relay.publish(good, **values)
        before = _tensors(relay)
        wrong = slots(*range(1, n), bad).to(dtype)
        calls = [partial(relay.stash, wrong, payload)]
        if values:
            calls.append(partial(relay.publish, wrong, **values))
        for call in calls:
            error, counts = _refusal(call)
            assert f"slot {bad} at position {n - 1} is outside the pool" in error, name
            # The gate's check (int64 slots), then the checked path's, naming the slot.
            assert counts.views == () and set(counts.data) <= {"aminmax"}, name
            assert len(counts.data) <= (
                2 if n > runtime.HOST_SLOTS_IN_PYTHON_MAX else 0
            )
            after = _tensors(relay)
            for k, v in before.items():
                torch.testing.assert_close(after[k], v, rtol=0, atol=0, msg=name + k)


@pytest.mark.parametrize("extra", [0, 2], ids=["set", "above the set's limit"])
def test_the_host_check_takes_the_last_slot_and_refuses_the_pool_size(
    extra: int,
) -> None:
    """The listed slots are tested against the pool's slots: a set up to
    ``SLOT_SET_MAX`` slots, ``min`` and ``max`` above; both take the last slot and
    refuse the pool size and -1 with no row written."""
    pool = runtime.SLOT_SET_MAX + extra
    assert isinstance(runtime.slot_set(pool), frozenset) is (extra == 0)
    relay = DecodeFutureMap("cpu", pool)
    relay.stash(slots(1, pool - 1), DecodePayload(next_token_ids=slots(7, 8)))
    assert relay.output_tokens_buf[[1, pool - 1]].tolist() == [7, 8]
    for bad in (pool, -1):
        with pytest.raises(SlotError, match=f"slot {bad} at position 1"):
            relay.stash(slots(2, bad), DecodePayload(next_token_ids=slots(5, 6)))
    assert relay.output_tokens_buf.count_nonzero().item() == 2


@pytest.mark.parametrize("n", [2, 40], ids=["listed", "aminmax"])
def test_every_cpu_write_checks_its_slots_on_the_host(n: int) -> None:
    """Nothing is taken on trust (Note [Slots on the host]): a stash or publish on the
    CPU checks its slots even when they are the very tensor the latest resolve_future
    gathered with and the previous write took, edited since where no version counter
    sees it."""
    relay = EagleFutureMap("cpu", 64, topk=TOPK)
    indices = slots(*range(1, n + 1))
    payload = EaglePayload(**_eagle_extras(n))
    relay.stash(indices, payload)
    relay.resolve_future(Batch(req_pool_indices=indices))
    relay.publish(indices, torch.arange(n) + 5)
    relay.stash(indices, payload)
    relay.resolve_future(Batch(req_pool_indices=indices))
    indices.numpy()[-1] = 64  # no version counter sees this edit
    before = _tensors(relay)
    for write in (
        partial(relay.stash, indices, payload),
        partial(relay.publish, indices, torch.arange(n) + 6),
    ):
        with pytest.raises(SlotError, match=f"slot 64 at position {n - 1}"):
            write()
    for k, v in before.items():
        torch.testing.assert_close(_tensors(relay)[k], v, rtol=0, atol=0, msg=k)


def test_a_zero_dim_slot_is_one_slot() -> None:
    """A 0-dim slot tensor writes one row, its value ``(1,)`` as its resolve hands it
    back, and a bad one is refused by relay before anything is written."""
    relay = DecodeFutureMap("cpu", POOL)
    relay.stash(torch.tensor(3), DecodePayload(next_token_ids=torch.tensor([7])))
    assert relay.output_tokens_buf[3].item() == 7
    before = _tensors(relay)
    with pytest.raises(SlotError, match=f"slot {POOL} at position 0"):
        relay.stash(torch.tensor(POOL), DecodePayload(next_token_ids=torch.tensor([8])))
    for k, v in before.items():
        torch.testing.assert_close(_tensors(relay)[k], v, rtol=0, atol=0, msg=k)
