"""Debug mode's price in aten ops: the checks of one method are a fixed number of ops,
whatever its field count (Note [Debug state table] in relay/debug/state.py).

A method in debug mode dispatches what it dispatches with debug off
(tests/runtime/test_maps_ops.py) plus its checks. Data ops are counted with
``relay.opcount`` after a warm-up step (lazy buffers allocated, the checks' per-method
constants cached). The checks, with the happens-before checker on / off:

- ``check_slots`` (every method): 7 / 7. The slots sorted between two edges must rise
  strictly: ``sort``, ``cat`` with the edges, ``gt``, then ``eq`` and ``bitwise_or_`` that
  let padding repeat row 0, and the reduction: ``all`` and its read-out
  (``_local_scalar_dense``: on the CPU a failure names the slot; elsewhere it is a
  device-side ``_assert_async``, one op too).
- the write report of a stash or publish (one ``wrote`` for all its fields): 8 / 2. On:
  the gather of the fields' state block, the writers' entries of the vector clock, the
  compare, ``all`` and its read-out (two unordered writes), the stamp (``add`` of the
  clock), the row lookup that keeps row 0 clean and one ``index_put_``. Off: the lookup and
  the ``index_put_`` of a constant stamp.
- the read report of a resolve (one ``read`` for all its gathers): 7 / 6. On: the gather of
  the state block, the writers' vector entries, one compare (fresh, not consumed, not
  released, ordered after its write, at once), ``all`` and its read-out, the row lookup and
  one ``index_put_`` marking the rows consumed. Off: one compare against "blocked"
  replaces the vector lookup and its compare.

What stays per field is inherent: one ``index_fill_`` per buffer read (the poison), and each
guarded field's guard (3 ops: the compare, ``all``, ``_assert_async``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from debug_support import batch, payload_of, placeholder_map_class
from relay_runtime_support import Batch, load_generated, slots

from relay import debug
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
from relay.opcount import count_ops
from relay.schema import Field, Lane, Schema

POOL = 257
TOPK = 2
HIDDEN = 8
N = 4

#: check_slots, whatever the method.
SLOTS = 7
#: The host mirror of a schedule field on the CPU: one ``clone`` (Note [CPU host mirror]).
HOST_COPY = 1
#: The one write report of a stash or publish: checker on, checker off.
WROTE = {True: 8, False: 2}
#: The one read report of a resolve, before the poison of each buffer read.
READ = {True: 7, False: 6}
#: One guard (compare, all, _assert_async): per guarded field, inherent.
GUARD = 3

#: (data ops, the happens-before checker on) per method.
Expected = dict[str, dict[bool, int]]


def write(off: int, *, guards: int) -> dict[bool, int]:
    """A stash or publish: its ``off`` writes + check_slots + one report + its guards."""
    return {hb: off + SLOTS + WROTE[hb] + guards * GUARD for hb in (True, False)}


def resolve(off: int, *, buffers: int) -> dict[bool, int]:
    """A resolve: its ``off`` gathers (and host copy) + check_slots + one report + the
    poison of each buffer read."""
    return {hb: off + SLOTS + READ[hb] + buffers for hb in (True, False)}


@pytest.fixture(params=[True, False], ids=["checker-on", "checker-off"])
def happens_before(request: pytest.FixtureRequest) -> Iterator[bool]:
    """The happens-before clocks installed for the test (``happens_before()``, as an
    engine installs them) or not, and uninstalled afterwards."""
    on: bool = request.param
    if not on:
        assert not debug.happens_before_enabled()
        yield on
        return
    with debug.happens_before():
        yield on


def _eagle_extras(n: int) -> dict[str, torch.Tensor]:
    return {
        "bonus_tokens": torch.arange(n, dtype=torch.int64),
        "topk_p": torch.rand(n, TOPK),
        "topk_index": torch.zeros(n, TOPK, dtype=torch.int64),
    }


def _cases() -> list[tuple[str, Any, Any, dict[str, torch.Tensor], Expected]]:
    """(name, debug map, payload, publish values, expected data ops per method) of every
    bundled map, at batch N (the host sum in Python: the schedule resolves' gather and
    host mirror copy are their only ops with debug off)."""
    lens = {"new_seq_lens": torch.full((N,), 5, dtype=torch.int64)}
    hidden = torch.rand(N, HIDDEN).to(torch.bfloat16)
    return [
        (
            "decode",
            DecodeFutureMap("cpu", POOL, debug=True),
            DecodePayload(next_token_ids=torch.arange(N)),
            {},
            {
                "stash": write(1, guards=1),  # output_tokens >= 0
                "resolve_future": resolve(1, buffers=1),
            },
        ),
        (
            "decode_seq_lens",
            DecodeSeqLensFutureMap("cpu", POOL, debug=True),
            DecodeSeqLensPayload(next_token_ids=torch.arange(N)),
            lens,
            {
                "stash": write(1, guards=1),  # output_tokens >= 0
                "publish": write(1, guards=1),  # new_seq_lens > 0
                "resolve_future": resolve(1, buffers=1),
                "resolve_seq_lens_cpu": resolve(1 + HOST_COPY, buffers=1),
            },
        ),
        (
            "eagle",
            EagleFutureMap("cpu", POOL, topk=TOPK, debug=True),
            EaglePayload(**_eagle_extras(N), hidden_states=hidden),
            lens,
            {
                "stash": write(4, guards=2),  # output_tokens, topk_index >= 0
                "publish": write(1, guards=1),  # new_seq_lens > 0
                "resolve_future": resolve(4, buffers=4),
                "resolve_seq_lens_cpu": resolve(1 + HOST_COPY, buffers=1),
            },
        ),
        (
            "eagle without hidden states",
            EagleFutureMap("cpu", POOL, topk=TOPK, debug=True),
            EaglePayload(**_eagle_extras(N)),
            lens,
            {
                # The omitted field is stamped in the same report, at no op of its own.
                "stash": write(3, guards=2),
                "publish": write(1, guards=1),
                "resolve_future": resolve(3, buffers=3),  # hidden states not read
                "resolve_seq_lens_cpu": resolve(1 + HOST_COPY, buffers=1),
            },
        ),
        (
            "eagle_multilayer",
            EagleMultiLayerFutureMap("cpu", POOL, topk=TOPK, debug=True),
            EagleMultiLayerPayload(**_eagle_extras(N)),
            lens,
            {
                "stash": write(3, guards=2),
                "publish": write(1, guards=1),
                "resolve_future": resolve(3, buffers=3),
                "resolve_seq_lens_cpu": resolve(1 + HOST_COPY, buffers=1),
            },
        ),
        (
            "eagle_draft_probs",
            EagleDraftProbsFutureMap("cpu", POOL, topk=TOPK, debug=True),
            EagleDraftProbsPayload(
                **_eagle_extras(N), hidden_states=hidden, draft_probs=torch.rand(N, 16)
            ),
            lens,
            {
                "stash": write(5, guards=2),
                "publish": write(1, guards=1),
                "resolve_future": resolve(5, buffers=5),
                "resolve_seq_lens_cpu": resolve(1 + HOST_COPY, buffers=1),
            },
        ),
        (
            "eagle_dsa",
            EagleDsaFutureMap("cpu", POOL, topk=TOPK, debug=True),
            EagleDsaPayload(
                **_eagle_extras(N),
                hidden_states=hidden,
                dsa_topk_indices=torch.zeros(N, 4, dtype=torch.int32),
            ),
            lens,
            {
                "stash": write(5, guards=3),  # dsa_topk_indices >= 0 too, when carried
                "publish": write(1, guards=1),
                "resolve_future": resolve(5, buffers=5),
                "resolve_seq_lens_cpu": resolve(1 + HOST_COPY, buffers=1),
            },
        ),
        (
            "eagle_confidence",
            EagleConfidenceFutureMap(
                "cpu", POOL, topk=TOPK, draft_tokens=3, debug=True
            ),
            EagleConfidencePayload(**_eagle_extras(N), hidden_states=hidden),
            {**lens, "draft_confidence": torch.rand(N, 3)},
            {
                "stash": write(4, guards=2),
                "publish": write(2, guards=1),  # two fields, one report
                "resolve_future": resolve(4, buffers=4),
                "resolve_seq_lens_cpu": resolve(1 + HOST_COPY, buffers=1),
                "resolve_draft_confidence_cpu": resolve(1 + HOST_COPY, buffers=1),
            },
        ),
        (
            "eagle_packed",
            EaglePackedFutureMap("cpu", POOL, topk=TOPK, debug=True),
            EaglePackedPayload(**_eagle_extras(N), hidden_states=hidden),
            lens,
            {
                "stash": write(4, guards=2),
                "publish": write(1, guards=1),
                # 3 gathers (one per dtype group); each field's column view is poisoned.
                "resolve_future": resolve(3, buffers=4),
                "resolve_seq_lens_cpu": resolve(1 + HOST_COPY, buffers=1),
            },
        ),
    ]


def _step_ops(
    relay: Any, payload: Any, values: dict[str, torch.Tensor]
) -> dict[str, int]:
    """Data ops per method of one overlap step, after a warm-up step."""
    indices = slots(*range(1, N + 1))
    counts: dict[str, int] = {}
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
                counts[name] = len(ops.data)
    return counts


def test_each_method_checks_in_a_fixed_number_of_ops(happens_before: bool) -> None:
    """Debug mode, every bundled map: what the method costs with debug off, check_slots, one
    report of all its fields, one poison per buffer read, one guard per guarded field;
    a seeded map's resolve_future also stamps its reader (the checker on)."""
    for name, relay, payload, values, expected in _cases():
        want = {method: ops[happens_before] for method, ops in expected.items()}
        if happens_before and sys.modules[type(relay).__module__]._TABLE.schema.seeded:
            want["resolve_future"] += 1
        assert _step_ops(relay, payload, values) == want, name


@pytest.mark.usefixtures("clocks_on")
def test_the_checks_of_an_eagle_step_are_these_ops() -> None:
    """The EAGLE step with hidden states, op by op (the checker on): a stash is 4 writes,
    2 guards and 15 ops of checks; resolve_future is 4 gathers, 4 poisons and 14."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK, debug=True)
    indices = slots(*range(1, N + 1))
    payload = EaglePayload(
        **_eagle_extras(N), hidden_states=torch.rand(N, HIDDEN).bfloat16()
    )
    slot_check = [
        "sort",
        "cat",
        "gt",
        "eq",
        "bitwise_or_",
        "all",
        "_local_scalar_dense",
    ]
    guard = ["ge", "all", "_assert_async"]
    for step in range(2):
        batch = Batch(req_pool_indices=indices)
        stash = count_ops(partial(relay.stash, indices, payload)).data
        relay.publish(indices, torch.full((N,), 5))
        resolve = count_ops(partial(relay.resolve_future, batch)).data
        relay.resolve_seq_lens_cpu(batch)
    assert list(stash) == [
        *slot_check,
        *guard * 2,
        *["index_copy_"] * 4,
        # wrote: the state block, the writers' clocks, the compare and its reduction,
        "index",
        "take",
        "ge",
        "all",
        "_local_scalar_dense",
        # the stamp with the clock, row 0's lookup, the stamp written.
        "add",
        "index",
        "index_put_",
    ]
    assert list(resolve) == [
        *slot_check,
        *["index_select"] * 4,
        # read: the state block, the writers' clocks, the compare and its reduction,
        "index",
        "take",
        "ge",
        "all",
        "_local_scalar_dense",
        # row 0's lookup, the consumed mark and the reader's stamp (eagle is seeded:
        # a seed must follow the rows' latest read), the poison of each buffer.
        "index",
        "add",
        "index_put_",
        *["index_fill_"] * 4,
    ]


def test_release_is_two_ops_whatever_the_fields() -> None:
    """release blocks the rows of every field at once: the row lookup and one index_put_."""
    for relay in (
        DecodeFutureMap("cpu", POOL, debug=True),
        EagleFutureMap("cpu", POOL, topk=TOPK, debug=True),
    ):
        relay.release(slots(1, 2))
        assert count_ops(partial(relay.release, slots(3, 4))).data == (
            "index",
            "index_put_",
        )


def _forward_map(count: int, tmp_path: Path) -> tuple[Any, Any]:
    """A generated map of ``count`` unguarded forward fields, each gathered into the batch,
    and a payload of N rows for it."""
    schema = Schema(
        name=f"Fields{count}FutureMap",
        fields=[
            Field(
                f"f{i}",
                lane=Lane.FORWARD,
                dtype=torch.float32,
                shape=(2,),
                target=f"f{i}",
            )
            for i in range(count)
        ],
    )
    module = load_generated(schema, tmp_path, f"fields{count}")
    payload = module.Fields1Payload if count == 1 else module.Fields4Payload
    values = {f"f{i}": torch.rand(N, 2) for i in range(count)}
    return getattr(module, schema.name), payload(**values)


def _checks(cls: Any, payload: Any) -> dict[str, int]:
    """Data ops per method with debug on minus with debug off: the price of the checks."""
    off = _step_ops(cls("cpu", POOL), payload, {})
    on = _step_ops(cls("cpu", POOL, debug=True), payload, {})
    return {method: on[method] - off[method] for method in on}


def test_more_fields_add_no_check_ops_but_the_poison_of_each(
    tmp_path: Path, happens_before: bool
) -> None:
    """1 and 4 forward fields: the checks of stash cost the same, those of resolve_future
    one poison per extra buffer read."""
    one = _checks(*_forward_map(1, tmp_path))
    four = _checks(*_forward_map(4, tmp_path))
    assert one == {
        "stash": SLOTS + WROTE[happens_before],
        "resolve_future": SLOTS + READ[happens_before] + 1,
    }
    assert four == {"stash": one["stash"], "resolve_future": one["resolve_future"] + 3}


def test_a_placeholder_read_adds_its_mask_and_invalidate_refuses_row_0(
    happens_before: bool,
) -> None:
    """A placeholder field reports its own rows: one more op to drop the positions that
    hold real tokens (``where``), and seven to find a slot named twice. invalidate's slot check has no padding to let through:
    5 ops, not 7."""
    cls = placeholder_map_class()
    relay = cls("cpu", POOL, debug=True)
    for _ in range(2):
        relay.stash(slots(2, 3), payload_of(cls, tokens=torch.tensor([5, 6])))
        b = batch(2, 3)
        invalidate = count_ops(partial(relay.invalidate, b, b.req_pool_indices)).data
        resolve_future = count_ops(partial(relay.resolve_future, b)).data
    assert len(invalidate) == 1 + SLOTS - 2  # the placeholders (neg) + the slot check
    # The substitution (lt, neg, clamp, gather, where, copy_) + check_slots + the mask
    # + one read report + the poison of the one buffer + the check that no slot is
    # named twice among the placeholders (7 ops, docs/debugging.md).
    assert len(resolve_future) == 6 + SLOTS + 1 + READ[happens_before] + 1 + 7
