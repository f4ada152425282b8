"""Free when off, exactly: the aten ops each generated method dispatches with debug off.

sglang's hand-written FutureMap (DOMAIN.md, "sglang today, op by op") costs 12 ops per
EAGLE step with hidden states at batch >= 2 and 3 per plain-decoding step. The counts
below are what the work needs and nothing more: one indexed write per field stashed or
published, one gather per field resolved, the host sum and its read-out. Any extra op
(a guard, a cast, a clone, a placeholder) fails these tests.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from relay_runtime_support import Batch, slots
from torch.utils._python_dispatch import TorchDispatchMode

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
from relay.runtime import HOST_SUM_IN_PYTHON_MAX

POOL = 257
TOPK = 2
HIDDEN = 8


class _Count(TorchDispatchMode):
    """Records every aten op dispatched inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def ops_of(fn: Callable[[], None]) -> list[str]:
    """The aten ops ``fn`` dispatches."""
    with _Count() as count:
        fn()
    return count.ops


def _eagle_extras(n: int) -> dict[str, torch.Tensor]:
    return {
        "bonus_tokens": torch.arange(n, dtype=torch.int64),
        "topk_p": torch.rand(n, TOPK),
        "topk_index": torch.zeros(n, TOPK, dtype=torch.int64),
    }


def _cases(n: int) -> list[tuple[str, Any, Any, dict[str, torch.Tensor], dict[str, int]]]:
    """(name, map, payload, publish values, expected ops per method) of every bundled map."""
    # The gather, then the host sum: in Python up to HOST_SUM_IN_PYTHON_MAX rows, else
    # ``sum`` and its read-out.
    host_sum = 1 if n <= HOST_SUM_IN_PYTHON_MAX else 3
    lens = {"new_seq_lens": torch.full((n,), 5, dtype=torch.int64)}
    hidden = torch.rand(n, HIDDEN).to(torch.bfloat16)
    return [
        ("decode", DecodeFutureMap("cpu", POOL),
         DecodePayload(next_token_ids=torch.arange(n)), {},
         {"stash": 1, "resolve_future": 1}),
        ("decode_seq_lens", DecodeSeqLensFutureMap("cpu", POOL),
         DecodeSeqLensPayload(next_token_ids=torch.arange(n)), lens,
         {"stash": 1, "publish": 1, "resolve_future": 1, "resolve_seq_lens_cpu": host_sum}),
        ("eagle", EagleFutureMap("cpu", POOL, topk=TOPK),
         EaglePayload(**_eagle_extras(n), hidden_states=hidden), lens,
         {"stash": 4, "publish": 1, "resolve_future": 4, "resolve_seq_lens_cpu": host_sum}),
        ("eagle without hidden states", EagleFutureMap("cpu", POOL, topk=TOPK),
         EaglePayload(**_eagle_extras(n)), lens,
         {"stash": 3, "publish": 1, "resolve_future": 3, "resolve_seq_lens_cpu": host_sum}),
        ("eagle_multilayer", EagleMultiLayerFutureMap("cpu", POOL, topk=TOPK),
         EagleMultiLayerPayload(**_eagle_extras(n)), lens,
         {"stash": 3, "publish": 1, "resolve_future": 3, "resolve_seq_lens_cpu": host_sum}),
        ("eagle_draft_probs", EagleDraftProbsFutureMap("cpu", POOL, topk=TOPK),
         EagleDraftProbsPayload(**_eagle_extras(n), hidden_states=hidden,
                                draft_probs=torch.rand(n, 16)), lens,
         {"stash": 5, "publish": 1, "resolve_future": 5, "resolve_seq_lens_cpu": host_sum}),
        ("eagle_dsa", EagleDsaFutureMap("cpu", POOL, topk=TOPK),
         EagleDsaPayload(**_eagle_extras(n), hidden_states=hidden,
                         dsa_topk_indices=torch.zeros(n, 4, dtype=torch.int32)), lens,
         {"stash": 5, "publish": 1, "resolve_future": 5, "resolve_seq_lens_cpu": host_sum}),
        ("eagle_confidence", EagleConfidenceFutureMap("cpu", POOL, topk=TOPK, draft_tokens=3),
         EagleConfidencePayload(**_eagle_extras(n), hidden_states=hidden),
         {**lens, "draft_confidence": torch.rand(n, 3)},
         {"stash": 4, "publish": 2, "resolve_future": 4, "resolve_seq_lens_cpu": host_sum,
          "resolve_draft_confidence_cpu": 1}),
    ]


def _step_ops(relay: Any, payload: Any, values: dict[str, torch.Tensor], n: int) -> dict[str, int]:
    """Ops per method of one overlap step, after a warm-up step (lazy buffers allocated)."""
    indices = slots(*range(1, n + 1))
    counts: dict[str, int] = {}
    for timed in (False, True):
        batch = Batch(req_pool_indices=indices)
        steps: dict[str, Callable[[], None]] = {"stash": partial(relay.stash, indices, payload)}
        if values:
            steps["publish"] = partial(relay.publish, indices, **values)
        steps["resolve_future"] = partial(relay.resolve_future, batch)
        for name in dir(relay):
            if name.startswith("resolve_") and name != "resolve_future":
                steps[name] = partial(getattr(relay, name), batch)
        for name, call in steps.items():
            ops = ops_of(call)
            if timed:
                counts[name] = len(ops)
    return counts


@pytest.mark.parametrize("n", [1, 2, 32, 256])
def test_each_method_dispatches_exactly_the_ops_its_work_needs(n: int) -> None:
    """Debug off, every bundled map: one write per field stashed or published, one gather per
    field resolved, the host sum and its read-out; nothing else, at batch 1 and up."""
    for name, relay, payload, values, expected in _cases(n):
        assert _step_ops(relay, payload, values, n) == expected, name


@pytest.mark.parametrize(("n", "eagle"), [(4, 10), (256, 12)])
def test_eagle_step_costs_no_more_than_sglangs_twelve_ops(n: int, eagle: int) -> None:
    """The EAGLE step with hidden states is 10 ops up to 64 rows and 12 above (sglang: 12);
    plain decoding is 2 (sglang: 3)."""
    cases = {name: (relay, payload, values) for name, relay, payload, values, _ in _cases(n)}
    assert sum(_step_ops(*cases["eagle"], n).values()) == eagle
    assert sum(_step_ops(*cases["decode"], n).values()) == 2


def test_an_omitting_stash_costs_one_fill_per_allocated_optional_field() -> None:
    """Omitting hidden states once its buffer exists clears the rows (one op); the resolve
    hands over None with no op (Note [Optional fields])."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    indices = slots(1, 2)
    relay.stash(indices, EaglePayload(**_eagle_extras(2), hidden_states=torch.rand(2, HIDDEN)))
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
