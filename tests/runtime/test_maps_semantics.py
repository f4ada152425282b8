"""Runtime semantics of the generated maps on the CPU: buffers, stash, publish, the
resolves, placeholders, optional and lazy fields, slots, idle ranks, casts and guards."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from relay_runtime_support import Batch, batch_of, eagle_payload, load_generated, slots

from relay import RelayError
from relay.maps.decode import DecodeFutureMap, DecodePayload
from relay.maps.decode_seq_lens import DecodeSeqLensFutureMap, DecodeSeqLensPayload
from relay.maps.eagle import EagleFutureMap, EaglePayload
from relay.maps.eagle_confidence import EagleConfidenceFutureMap
from relay.maps.eagle_draft_probs import (
    EagleDraftProbsFutureMap,
    EagleDraftProbsPayload,
)
from relay.maps.eagle_dsa import EagleDsaFutureMap, EagleDsaPayload
from relay.maps.eagle_multilayer import EagleMultiLayerFutureMap
from relay.maps.eagle_packed import EaglePackedFutureMap
from relay.runtime import HOST_SUM_IN_PYTHON_MAX
from relay.schema import Alloc, Field, Guard, HostCopy, Lane, Resolve, Schema

POOL = 9
TOPK = 4

# (constructor, keywords, {field: (row shape, dtype)} of eager buffers, lazy fields)
MAPS: list[
    tuple[
        type[Any],
        dict[str, int],
        dict[str, tuple[tuple[int, ...], torch.dtype]],
        list[str],
    ]
] = [
    (DecodeFutureMap, {}, {"output_tokens": ((), torch.int64)}, []),
    (
        DecodeSeqLensFutureMap,
        {},
        {"output_tokens": ((), torch.int64), "new_seq_lens": ((), torch.int64)},
        [],
    ),
    (
        EagleFutureMap,
        {"topk": TOPK},
        {
            "output_tokens": ((), torch.int64),
            "topk_p": ((TOPK,), torch.float32),
            "topk_index": ((TOPK,), torch.int64),
            "new_seq_lens": ((), torch.int64),
        },
        ["hidden_states"],
    ),
    (
        EaglePackedFutureMap,
        {"topk": TOPK},
        {
            "output_tokens": ((), torch.int64),
            "topk_p": ((TOPK,), torch.float32),
            "topk_index": ((TOPK,), torch.int64),
            "new_seq_lens": ((), torch.int64),
        },
        ["hidden_states"],
    ),
    (
        EagleMultiLayerFutureMap,
        {"topk": TOPK},
        {
            "output_tokens": ((), torch.int64),
            "topk_p": ((TOPK,), torch.float32),
            "topk_index": ((TOPK,), torch.int64),
            "new_seq_lens": ((), torch.int64),
        },
        [],
    ),
    (
        EagleDraftProbsFutureMap,
        {"topk": TOPK},
        {
            "output_tokens": ((), torch.int64),
            "topk_p": ((TOPK,), torch.float32),
            "topk_index": ((TOPK,), torch.int64),
            "new_seq_lens": ((), torch.int64),
        },
        ["hidden_states", "draft_probs"],
    ),
    (
        EagleDsaFutureMap,
        {"topk": TOPK},
        {
            "output_tokens": ((), torch.int64),
            "topk_p": ((TOPK,), torch.float32),
            "topk_index": ((TOPK,), torch.int64),
            "new_seq_lens": ((), torch.int64),
        },
        ["hidden_states", "dsa_topk_indices"],
    ),
    (
        EagleConfidenceFutureMap,
        {"topk": TOPK, "draft_tokens": 3},
        {
            "output_tokens": ((), torch.int64),
            "topk_p": ((TOPK,), torch.float32),
            "topk_index": ((TOPK,), torch.int64),
            "new_seq_lens": ((), torch.int64),
            "draft_confidence": ((3,), torch.float32),
        },
        ["hidden_states"],
    ),
]
MAP_IDS = [cls.__name__ for cls, *_ in MAPS]


# -- buffers -------------------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "dims", "eager", "lazy"), MAPS, ids=MAP_IDS)
def test_eager_buffers_have_pool_size_rows_per_field(
    cls: type[Any],
    dims: dict[str, int],
    eager: dict[str, tuple[tuple[int, ...], torch.dtype]],
    lazy: list[str],
) -> None:
    """Each field has one ``<field>_buf`` of pool_size rows; eager ones exist at construction."""
    relay = cls("cpu", POOL, **dims)
    for name, (row, dtype) in eager.items():
        buf = getattr(relay, f"{name}_buf")
        assert buf.shape == (POOL, *row), name
        assert buf.dtype == dtype, name
        assert buf.device == torch.device("cpu")
        assert bool((buf == 0).all()), f"{name} starts zeroed outside debug mode"
    for name in lazy:
        assert getattr(relay, f"{name}_buf") is None, (
            f"{name} is lazy: no buffer before a stash"
        )
    buffers = {a[: -len("_buf")] for a in dir(relay) if a.endswith("_buf")}
    assert buffers == set(eager) | set(lazy)


def test_symbolic_dims_are_constructor_keywords() -> None:
    """Symbolic dims such as topk and draft_tokens size the rows of their fields."""
    eagle = EagleFutureMap("cpu", 5, topk=8)
    assert eagle.topk_p_buf.shape == (5, 8)
    assert eagle.topk_index_buf.shape == (5, 8)
    confidence = EagleConfidenceFutureMap(
        torch.device("cpu"), 7, topk=1, draft_tokens=6
    )
    assert confidence.draft_confidence_buf.shape == (7, 6)
    assert confidence.topk_p_buf.shape == (7, 1)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "4", None])
def test_bad_symbolic_dim_is_rejected_with_a_clear_value_error(bad: object) -> None:
    """A non-positive or non-int dim fails at construction, naming the map, dim and value."""
    with pytest.raises(
        ValueError, match=r"EagleFutureMap.*'topk'.*positive int"
    ) as info:
        EagleFutureMap("cpu", POOL, topk=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [0, -1, 3.5])
def test_bad_pool_size_is_rejected_with_a_clear_value_error(bad: object) -> None:
    """pool_size must be a positive int: the map names it and the value given."""
    with pytest.raises(ValueError, match=r"DecodeFutureMap.*'pool_size'.*positive int"):
        DecodeFutureMap("cpu", bad)  # type: ignore[arg-type]


def test_missing_symbolic_dim_is_a_type_error() -> None:
    """Symbolic dims are required keywords: forgetting one fails at the call."""
    with pytest.raises(TypeError, match="draft_tokens"):
        EagleConfidenceFutureMap("cpu", POOL, topk=1)  # type: ignore[call-arg]


def test_padded_rows_write_only_the_scratch_row() -> None:
    """Padded batch rows point at slot 0, the scratch row; real slots are untouched by them."""
    relay = DecodeFutureMap("cpu", POOL)
    relay.stash(slots(3, 5), DecodePayload(next_token_ids=torch.tensor([30, 50])))
    relay.stash(slots(5, 0, 0), DecodePayload(next_token_ids=torch.tensor([51, 7, 7])))
    assert relay.output_tokens_buf.tolist() == [7, 0, 0, 30, 0, 51, 0, 0, 0]


# -- stash, invalidate, resolve_future ------------------------------------------------------


_SENTINEL = Schema(
    name="SentinelFutureMap",
    doc="The May-2026 sentinel design: tokens and lengths through placeholders.",
    fields=[
        Field(
            "output_tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="next_token_ids",
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
            guard=Guard.NON_NEGATIVE,
        ),
        Field(
            "new_seq_lens",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            resolve=Resolve.PLACEHOLDER,
            host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"),
        ),
    ],
)


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A map generated from a schema that resolves both lanes through placeholders."""
    return load_generated(
        _SENTINEL, tmp_path_factory.mktemp("sentinel"), "relay_sentinel_map"
    )


def test_invalidate_writes_negative_slots_into_the_placeholder_targets_only(
    sentinel: Any,
) -> None:
    """invalidate sets each placeholder target to -slot and leaves the rest of the batch."""
    relay = sentinel.SentinelFutureMap("cpu", POOL)
    batch = batch_of(4, 1, 8)
    relay.invalidate(batch, batch.req_pool_indices)
    assert batch.input_ids.tolist() == [-4, -1, -8]
    assert batch.seq_lens.tolist() == [-4, -1, -8]
    assert batch.spec_info.topk_p.numel() == 0


def test_resolve_future_substitutes_every_placeholder_from_its_slot(
    sentinel: Any,
) -> None:
    """Each -slot in input_ids becomes the token stashed for that slot."""
    relay = sentinel.SentinelFutureMap("cpu", POOL)
    relay.stash(
        slots(2, 6, 7),
        sentinel.SentinelPayload(next_token_ids=torch.tensor([20, 60, 70])),
    )
    batch = batch_of(7, 2, 6)
    relay.invalidate(batch, batch.req_pool_indices)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [70, 20, 60]
    assert batch.req_pool_indices.tolist() == [7, 2, 6], "the slots are not overwritten"


def test_resolve_future_leaves_real_tokens_including_token_zero(sentinel: Any) -> None:
    """In a mixed batch real tokens (0 included) stay as they are; placeholders are filled."""
    relay = sentinel.SentinelFutureMap("cpu", POOL)
    relay.stash(
        slots(1, 3), sentinel.SentinelPayload(next_token_ids=torch.tensor([11, 33]))
    )
    batch = batch_of(1, 2, 3, 4)
    batch.input_ids = torch.tensor([-1, 0, -3, 5])
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [11, 0, 33, 5]


def test_schedule_placeholders_resolve_with_host_copy_and_sum(sentinel: Any) -> None:
    """A placeholder schedule field fills its target in place, then mirrors and sums it."""
    relay = sentinel.SentinelFutureMap("cpu", POOL)
    relay.publish(slots(3, 5), torch.tensor([30, 50]))
    batch = batch_of(5, 3)
    relay.invalidate(batch, batch.req_pool_indices)
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [50, 30]
    assert batch.seq_lens_cpu.tolist() == [50, 30] and batch.seq_lens_sum == 80


def test_decode_gathers_the_sampled_token_without_placeholders() -> None:
    """DecodeFutureMap: input_ids = output_tokens_buf[req_pool_indices], nothing to invalidate."""
    relay = DecodeFutureMap("cpu", POOL)
    assert not hasattr(relay, "invalidate") and not hasattr(relay, "publish")
    relay.stash(slots(2, 6, 7), DecodePayload(next_token_ids=torch.tensor([20, 60, 0])))
    batch = batch_of(7, 2, 6)
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [0, 20, 60]


def test_resolve_future_gathers_spec_info_by_the_batch_slots() -> None:
    """Gather targets get buf[req_pool_indices], in the batch's slot order."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    payload = eagle_payload(3, TOPK, base=1)
    relay.stash(slots(5, 2, 8), payload)
    batch = batch_of(8, 5)
    relay.resolve_future(batch)
    assert batch.spec_info.bonus_tokens.tolist() == [3, 1]
    assert torch.equal(batch.spec_info.topk_p, payload.topk_p[[2, 0]])
    assert torch.equal(batch.spec_info.topk_index, payload.topk_index[[2, 0]])
    assert batch.spec_info.hidden_states is None, (
        "hidden states never stashed: not resolved"
    )


def test_resolved_values_do_not_alias_the_buffers() -> None:
    """A later stash into the same slots does not change what a batch already resolved."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    relay.stash(slots(1, 2), eagle_payload(2, TOPK, base=1))
    batch = batch_of(1, 2)
    relay.resolve_future(batch)
    resolved = batch.spec_info.topk_index.clone()
    relay.stash(slots(1, 2), eagle_payload(2, TOPK, base=50))
    assert torch.equal(batch.spec_info.topk_index, resolved)


def test_multilayer_eagle_relays_no_hidden_states() -> None:
    """Multi-layer EAGLE declares no hidden states: no buffer, nothing resolved for it."""
    from relay.maps.eagle_multilayer import EagleMultiLayerPayload

    relay = EagleMultiLayerFutureMap("cpu", POOL, topk=1)
    assert not hasattr(relay, "hidden_states_buf")
    relay.stash(
        slots(1),
        EagleMultiLayerPayload(
            bonus_tokens=torch.tensor([4]),
            topk_p=torch.tensor([[0.5]]),
            topk_index=torch.tensor([[9]]),
        ),
    )
    batch = batch_of(1)
    relay.resolve_future(batch)
    assert batch.spec_info.bonus_tokens.tolist() == [4]
    assert batch.spec_info.topk_index.tolist() == [[9]]
    assert batch.spec_info.hidden_states is None


# -- publish, resolve_seq_lens_cpu ----------------------------------------------------------


def test_resolve_seq_lens_cpu_fills_device_host_and_sum() -> None:
    """seq_lens = buf[slots]; seq_lens_cpu a host tensor no later publish changes; the sum an int.

    On the CPU the host mirror is the gathered tensor itself (Note [CPU host mirror]), as
    sglang's ``.cpu()`` is: the relay never writes it again.
    """
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    relay.publish(slots(3, 1, 6), torch.tensor([30, 10, 60]))
    batch = batch_of(6, 3)
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [60, 30]
    assert batch.seq_lens.dtype == torch.int64
    assert batch.seq_lens_cpu.device == torch.device("cpu")
    assert batch.seq_lens_cpu.tolist() == [60, 30]
    assert type(batch.seq_lens_sum) is int and batch.seq_lens_sum == 90
    relay.publish(slots(6, 3), torch.tensor([61, 31]))
    assert batch.seq_lens_cpu.tolist() == [60, 30], "nor the buffer"


@pytest.mark.parametrize("n", [HOST_SUM_IN_PYTHON_MAX, HOST_SUM_IN_PYTHON_MAX + 1])
def test_the_host_sum_is_exact_on_either_side_of_its_python_count(n: int) -> None:
    """The generated resolve sums up to HOST_SUM_IN_PYTHON_MAX slots in Python and more
    with numpy, choosing by the slots' count: the same int either way."""
    relay = DecodeSeqLensFutureMap("cpu", 2 * n)
    lens = torch.arange(1, n + 1, dtype=torch.int64) * (1 << 40)  # beyond an int32
    indices = torch.arange(1, n + 1)
    relay.publish(indices, lens)
    batch = Batch(req_pool_indices=indices.flip(0))
    relay.resolve_seq_lens_cpu(batch)
    assert type(batch.seq_lens_sum) is int
    assert batch.seq_lens_sum == sum(lens.tolist())


def test_publish_accepts_keywords_and_casts_to_int64() -> None:
    """publish takes the schedule fields by keyword too, and stores them in the declared dtype."""
    relay = DecodeSeqLensFutureMap("cpu", POOL)
    relay.publish(slots(2), new_seq_lens=torch.tensor([17], dtype=torch.int32))
    assert relay.new_seq_lens_buf.dtype == torch.int64
    assert relay.new_seq_lens_buf[2].item() == 17


def test_resolve_draft_confidence_cpu_fills_spec_info_and_host_copy() -> None:
    """The float32 confidence lane lands in spec_info.draft_confidence and a host copy."""
    relay = EagleConfidenceFutureMap("cpu", POOL, topk=1, draft_tokens=3)
    confidence = torch.tensor([[0.1, 0.2, 0.3], [0.7, 0.8, 0.9]], dtype=torch.float64)
    relay.publish(slots(4, 7), torch.tensor([5, 6]), confidence)
    batch = batch_of(7, 4)
    relay.resolve_draft_confidence_cpu(batch)
    expected = confidence.to(torch.float32)[[1, 0]]
    assert batch.spec_info.draft_confidence.dtype == torch.float32
    assert torch.equal(batch.spec_info.draft_confidence, expected)
    assert torch.equal(batch.draft_confidence_cpu, expected)
    assert batch.seq_lens_sum == -1, (
        "the confidence resolve leaves the seq-len targets alone"
    )
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens_cpu.tolist() == [6, 5] and batch.seq_lens_sum == 11


# -- lazy fields -----------------------------------------------------------------------------


def test_hidden_states_buffer_keeps_the_payload_dtype() -> None:
    """hidden_states takes dtype and width from its first payload (bfloat16 stays bfloat16)."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    hidden = torch.randn(2, 16).to(torch.bfloat16)
    relay.stash(slots(3, 4), eagle_payload(2, TOPK, hidden=hidden))
    assert relay.hidden_states_buf is not None
    assert relay.hidden_states_buf.dtype == torch.bfloat16
    assert relay.hidden_states_buf.shape == (POOL, 16)
    batch = batch_of(4, 3)
    relay.resolve_future(batch)
    assert batch.spec_info.hidden_states is not None
    assert torch.equal(batch.spec_info.hidden_states, hidden[[1, 0]])
    relay.stash(
        slots(3), eagle_payload(1, TOPK, hidden=torch.ones(1, 16, dtype=torch.float32))
    )
    assert relay.hidden_states_buf.dtype == torch.bfloat16, (
        "later payloads are cast to it"
    )


def test_optional_lazy_field_absent_at_first_gets_its_buffer_when_it_appears() -> None:
    """A first payload without dsa_topk_indices does not disable it: a later one allocates it."""
    relay = EagleDsaFutureMap("cpu", POOL, topk=1)
    first = EagleDsaPayload(
        bonus_tokens=torch.tensor([1]),
        topk_p=torch.tensor([[0.5]]),
        topk_index=torch.tensor([[2]]),
    )
    relay.stash(slots(1), first)
    batch = batch_of(1)
    relay.resolve_future(batch)
    assert relay.dsa_topk_indices_buf is None
    assert batch.spec_info.dsa_topk_indices is None

    chosen = torch.tensor([[5, 9, 11], [0, 3, 4]], dtype=torch.int16)
    later = EagleDsaPayload(
        bonus_tokens=torch.tensor([1, 2]),
        topk_p=torch.tensor([[0.5], [0.6]]),
        topk_index=torch.tensor([[2], [3]]),
        dsa_topk_indices=chosen,
    )
    relay.stash(slots(1, 6), later)
    assert relay.dsa_topk_indices_buf is not None
    assert relay.dsa_topk_indices_buf.dtype == torch.int32, (
        "declared int32, whatever (widening) dtype the payload has"
    )
    assert relay.dsa_topk_indices_buf.shape == (POOL, 3)
    assert relay.hidden_states_buf is None, "each optional field is decided on its own"
    batch = batch_of(6, 1)
    relay.resolve_future(batch)
    assert batch.spec_info.dsa_topk_indices is not None
    assert batch.spec_info.dsa_topk_indices.tolist() == [[0, 3, 4], [5, 9, 11]]


def test_draft_probs_are_lazy_and_stored_as_float32() -> None:
    """draft_probs gets a (pool, vocab) float32 buffer from its first payload only."""
    relay = EagleDraftProbsFutureMap("cpu", POOL, topk=1)
    probs = torch.softmax(torch.randn(2, 32), dim=-1).to(torch.float16)
    relay.stash(
        slots(2, 3),
        EagleDraftProbsPayload(
            bonus_tokens=torch.tensor([1, 2]),
            topk_p=torch.rand(2, 1),
            topk_index=torch.zeros(2, 1, dtype=torch.int64),
            draft_probs=probs,
        ),
    )
    assert relay.draft_probs_buf is not None
    assert (
        relay.draft_probs_buf.shape == (POOL, 32)
        and relay.draft_probs_buf.dtype == torch.float32
    )
    batch = batch_of(3)
    relay.resolve_future(batch)
    assert batch.spec_info.draft_probs is not None
    assert torch.equal(batch.spec_info.draft_probs, probs[[1]].to(torch.float32))


def test_lazy_row_rank_mismatch_raises_a_clear_relay_error() -> None:
    """A first hidden_states payload whose rows are not 1-D is refused, naming field and shapes."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    with pytest.raises(
        RelayError,
        match=r"EagleFutureMap\.hidden_states: got a tensor of shape "
        r"\(2, 2, 8\) for 2 slot\(s\); expected \(2, '\?'\)",
    ):
        relay.stash(slots(1, 2), eagle_payload(2, TOPK, hidden=torch.zeros(2, 2, 8)))
    assert relay.hidden_states_buf is None


def test_narrow_rows_are_refused_instead_of_broadcast() -> None:
    """A (n, 1) topk_p for topk=4 raises, naming the field, instead of filling every column."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    payload = eagle_payload(2, TOPK)
    narrow = EaglePayload(
        bonus_tokens=payload.bonus_tokens,
        topk_p=torch.ones(2, 1),
        topk_index=payload.topk_index,
    )
    with pytest.raises(
        RelayError,
        match=r"EagleFutureMap\.topk_p: got a tensor of shape "
        r"\(2, 1\) for 2 slot\(s\); expected \(2, 4\)",
    ):
        relay.stash(slots(1, 2), narrow)


def test_a_refused_stash_writes_no_field() -> None:
    """When one field of a payload is refused, the fields before it are not written either."""
    relay = EagleFutureMap("cpu", POOL, topk=TOPK)
    payload = eagle_payload(2, TOPK, base=5)
    bad = EaglePayload(
        bonus_tokens=payload.bonus_tokens,
        topk_p=payload.topk_p,
        topk_index=torch.zeros(2, TOPK + 1, dtype=torch.int64),
    )
    with pytest.raises(RelayError, match=r"EagleFutureMap\.topk_index"):
        relay.stash(slots(1, 2), bad)
    assert not relay.output_tokens_buf.any() and not relay.topk_p_buf.any()


def test_one_token_for_three_slots_is_refused() -> None:
    """A single token stashed for three slots raises instead of being copied to all three."""
    relay = DecodeFutureMap("cpu", POOL)
    with pytest.raises(
        RelayError,
        match=r"DecodeFutureMap\.output_tokens: got a tensor of "
        r"shape \(1,\) for 3 slot\(s\)",
    ):
        relay.stash(slots(1, 2, 3), DecodePayload(next_token_ids=torch.tensor([7])))
    assert relay.output_tokens_buf.tolist() == [0] * POOL


_CUSTOM = Schema(
    name="ProbeFutureMap",
    doc="A probe relay with a required lazy field of fixed width.",
    fields=[
        Field(
            "next_tokens", lane=Lane.FORWARD, dtype=torch.int64, target="next_tokens"
        ),
        Field(
            "logits",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=(2, "vocab"),
            alloc=Alloc.LAZY,
            target="spec_info.logits",
        ),
    ],
)


@pytest.fixture(scope="module")
def probe_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A map generated from a schema with a required lazy field whose rows are (2, vocab)."""
    return load_generated(_CUSTOM, tmp_path_factory.mktemp("probe"), "relay_probe_map")


class _ProbeSpec:
    logits: torch.Tensor


class _ProbeBatch:
    def __init__(self, *values: int) -> None:
        self.req_pool_indices = slots(*values)
        self.next_tokens = torch.empty(0)
        self.spec_info = _ProbeSpec()


def test_lazy_row_shape_mismatch_against_fixed_dims_raises(probe_module: Any) -> None:
    """A first payload whose row disagrees with a fixed dim is refused with what was expected."""
    relay = probe_module.ProbeFutureMap("cpu", POOL)
    bad = probe_module.ProbePayload(
        next_tokens=torch.tensor([1]), logits=torch.zeros(1, 3, 5)
    )
    with pytest.raises(
        RelayError,
        match=r"ProbeFutureMap\.logits: got a tensor of shape "
        r"\(1, 3, 5\) for 1 slot\(s\); expected \(1, 2, '\?'\)",
    ):
        relay.stash(slots(1), bad)
    assert relay.logits_buf is None
    good = probe_module.ProbePayload(
        next_tokens=torch.tensor([1]), logits=torch.ones(1, 2, 5)
    )
    relay.stash(slots(1), good)
    assert relay.logits_buf.shape == (POOL, 2, 5)


def test_required_lazy_field_resolved_before_any_stash_raises(
    probe_module: Any,
) -> None:
    """Resolving a required lazy field that was never stashed names the field and the fix."""
    relay = probe_module.ProbeFutureMap("cpu", POOL)
    with pytest.raises(RelayError, match=r"ProbeFutureMap\.logits.*before any stash"):
        relay.resolve_future(_ProbeBatch(1))
    relay.stash(
        slots(1),
        probe_module.ProbePayload(
            next_tokens=torch.tensor([4]), logits=torch.ones(1, 2, 3)
        ),
    )
    batch = _ProbeBatch(1)
    relay.resolve_future(batch)
    assert torch.equal(batch.spec_info.logits, torch.ones(1, 2, 3))
    assert batch.next_tokens.tolist() == [4]


# -- idle ranks ------------------------------------------------------------------------------


def _empty_batch() -> Batch:
    batch = batch_of()
    batch.input_ids = torch.tensor([7])
    return batch


@pytest.mark.parametrize("debug", [False, True])
def test_zero_indices_make_every_method_a_no_op(debug: bool) -> None:
    """An idle data-parallel rank calls every method with no slots: nothing allocated or touched."""
    relay = EagleDsaFutureMap("cpu", POOL, topk=TOPK, debug=debug)
    before = {
        name: buf.clone()
        for name, buf in vars(relay).items()
        if name.endswith("_buf") and buf is not None
    }
    none = slots()
    relay.stash(
        none,
        EagleDsaPayload(
            bonus_tokens=torch.empty(0, dtype=torch.int64),
            topk_p=torch.empty(0, TOPK),
            topk_index=torch.empty(0, TOPK, dtype=torch.int64),
            hidden_states=torch.empty(0, 16, dtype=torch.bfloat16),
            dsa_topk_indices=torch.empty(0, 4, dtype=torch.int32),
        ),
    )
    relay.publish(none, torch.empty(0, dtype=torch.int64))
    batch = _empty_batch()
    relay.resolve_future(batch)
    relay.resolve_seq_lens_cpu(batch)
    assert relay.hidden_states_buf is None and relay.dsa_topk_indices_buf is None
    assert not relay._state.fence.created
    assert batch.input_ids.tolist() == [7]
    assert batch.seq_lens_sum == -1 and batch.seq_lens_cpu.numel() == 0
    assert batch.spec_info.dsa_topk_indices is None
    for name, buf in before.items():
        torch.testing.assert_close(
            getattr(relay, name), buf, rtol=0, atol=0, equal_nan=True
        )


def test_zero_indices_no_op_on_the_confidence_lane() -> None:
    """resolve_draft_confidence_cpu and publish with no slots do nothing either."""
    relay = EagleConfidenceFutureMap("cpu", POOL, topk=1, draft_tokens=2, debug=True)
    relay.publish(slots(), torch.empty(0, dtype=torch.int64), torch.empty(0, 2))
    batch = _empty_batch()
    relay.resolve_draft_confidence_cpu(batch)
    relay.resolve_seq_lens_cpu(batch)
    assert not relay._state.fence.created
    assert batch.draft_confidence_cpu.numel() == 0


# -- casts and guards -----------------------------------------------------------------------


def test_stash_casts_to_the_declared_dtypes() -> None:
    """int32 tokens are stored as int64 and float64 top-k probabilities as float32."""
    relay = EagleFutureMap("cpu", POOL, topk=2)
    relay.stash(
        slots(1, 2),
        EaglePayload(
            bonus_tokens=torch.tensor([5, 6], dtype=torch.int32),
            topk_p=torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64),
            topk_index=torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
        ),
    )
    assert relay.output_tokens_buf.dtype == torch.int64
    assert relay.output_tokens_buf[1:3].tolist() == [5, 6]
    assert relay.topk_p_buf.dtype == torch.float32
    assert relay.topk_p_buf[1].tolist() == [0.25, 0.75]
    batch = batch_of(2)
    relay.resolve_future(batch)
    assert (
        batch.spec_info.bonus_tokens.dtype == torch.int64
        and batch.spec_info.topk_p.dtype == torch.float32
    )


@pytest.mark.parametrize(
    ("field", "payload"),
    [
        (
            "output_tokens",
            EaglePayload(
                bonus_tokens=torch.tensor([3, -1]),
                topk_p=torch.rand(2, 1),
                topk_index=torch.zeros(2, 1, dtype=torch.int64),
            ),
        ),
        (
            "topk_index",
            EaglePayload(
                bonus_tokens=torch.tensor([3, 1]),
                topk_p=torch.rand(2, 1),
                topk_index=torch.tensor([[0], [-2]]),
            ),
        ),
    ],
)
def test_negative_token_guard_fails_naming_the_field(
    field: str, payload: EaglePayload
) -> None:
    """In debug mode a negative token id fails the non-negative guard; with debug off the
    guard costs nothing and the value is stored (Note [Guards in debug mode])."""
    relay = EagleFutureMap("cpu", POOL, topk=1, debug=True)
    with pytest.raises(RuntimeError, match=rf"EagleFutureMap\.{field}.*>= 0"):
        relay.stash(slots(1, 2), payload)
    EagleFutureMap("cpu", POOL, topk=1).stash(slots(1, 2), payload)


def test_negative_dsa_index_guard_fails_naming_the_field() -> None:
    """The int32 DSA indices are guarded non-negative too."""
    relay = EagleDsaFutureMap("cpu", POOL, topk=1, debug=True)
    payload = EagleDsaPayload(
        bonus_tokens=torch.tensor([1]),
        topk_p=torch.rand(1, 1),
        topk_index=torch.zeros(1, 1, dtype=torch.int64),
        dsa_topk_indices=torch.tensor([[4, -1]], dtype=torch.int32),
    )
    with pytest.raises(
        RuntimeError, match=r"EagleDsaFutureMap\.dsa_topk_indices.*>= 0"
    ):
        relay.stash(slots(1), payload)


@pytest.mark.parametrize("bad", [0, -5])
def test_non_positive_seq_len_guard_fails_naming_the_field(bad: int) -> None:
    """publish refuses a sequence length <= 0 through the positive guard."""
    relay = DecodeSeqLensFutureMap("cpu", POOL, debug=True)
    with pytest.raises(
        RuntimeError, match=r"DecodeSeqLensFutureMap\.new_seq_lens.*> 0"
    ):
        relay.publish(slots(1, 2), torch.tensor([4, bad]))


def test_guards_use_assert_async(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards go through torch._assert_async, so they never force a host sync on a device."""
    calls: list[str] = []
    real = torch._assert_async

    def spy(condition: torch.Tensor, message: str = "") -> None:
        calls.append(message)
        real(condition, message)

    monkeypatch.setattr(torch, "_assert_async", spy)
    quiet = DecodeSeqLensFutureMap("cpu", POOL)
    quiet.stash(slots(1), DecodeSeqLensPayload(next_token_ids=torch.tensor([3])))
    quiet.publish(slots(1), torch.tensor([3]))
    assert calls == [], "debug off: no guard runs"
    relay = DecodeSeqLensFutureMap("cpu", POOL, debug=True)
    relay.stash(slots(1), DecodeSeqLensPayload(next_token_ids=torch.tensor([3])))
    relay.publish(slots(1), torch.tensor([3]))
    assert any("output_tokens" in m for m in calls)
    assert any("new_seq_lens" in m for m in calls)


def test_decode_steps_round_trip_through_the_map() -> None:
    """Two decode steps hand tokens and lengths over through the map, as an engine does."""
    relay = DecodeSeqLensFutureMap("cpu", POOL)
    batch = batch_of(1, 2)
    relay.stash(
        batch.req_pool_indices,
        DecodeSeqLensPayload(next_token_ids=torch.tensor([100, 200])),
    )
    for step in range(3):
        relay.resolve_future(batch)
        sampled = batch.input_ids + 1
        relay.stash(
            batch.req_pool_indices, DecodeSeqLensPayload(next_token_ids=sampled)
        )
        relay.publish(batch.req_pool_indices, torch.tensor([10 + step, 20 + step]))
        relay.resolve_seq_lens_cpu(batch)
        assert batch.seq_lens_sum == 30 + 2 * step
    relay.resolve_future(batch)
    assert batch.input_ids.tolist() == [103, 203]


# -- optional fields: Note [Optional fields] ------------------------------------------------


def _dsa(
    n: int, *, hidden: torch.Tensor | None = None, base: int = 0
) -> EagleDsaPayload:
    return EagleDsaPayload(
        bonus_tokens=torch.arange(base, base + n),
        topk_p=torch.rand(n, 1),
        topk_index=torch.zeros(n, 1, dtype=torch.int64),
        hidden_states=hidden,
    )


@pytest.mark.parametrize("debug", [False, True])
def test_optional_field_omitted_by_the_latest_stash_resolves_to_none(
    debug: bool,
) -> None:
    """A stash without hidden states after one with them: the next resolve gets None, never
    the earlier rows; a later stash that carries them again hands them over."""
    relay = EagleDsaFutureMap("cpu", POOL, topk=1, debug=debug)
    relay.stash(slots(1, 2), _dsa(2, hidden=torch.ones(2, 4)))
    batch = batch_of(1, 2)
    relay.resolve_future(batch)
    assert batch.spec_info.hidden_states is not None

    relay.stash(slots(1, 2), _dsa(2))
    batch = batch_of(1, 2)
    batch.spec_info.hidden_states = torch.full((2, 4), 7.0)
    relay.resolve_future(batch)
    assert batch.spec_info.hidden_states is None

    relay.stash(slots(2), _dsa(1, hidden=torch.full((1, 4), 3.0)))
    batch = batch_of(2)
    relay.resolve_future(batch)
    assert batch.spec_info.hidden_states is not None
    assert batch.spec_info.hidden_states.tolist() == [[3.0] * 4]


def test_rows_of_an_omitting_stash_never_hand_over_an_earlier_value() -> None:
    """Debug off: rows whose latest stash omitted the field read zeros, not an old value,
    when a later stash carried it for other rows."""
    relay = EagleDsaFutureMap("cpu", POOL, topk=1)
    relay.stash(slots(1, 2), _dsa(2, hidden=torch.full((2, 4), 9.0)))
    relay.stash(slots(1), _dsa(1))  # row 1 omitted
    relay.stash(slots(2), _dsa(1, hidden=torch.full((1, 4), 5.0)))
    batch = batch_of(1, 2)
    relay.resolve_future(batch)
    assert batch.spec_info.hidden_states is not None
    assert batch.spec_info.hidden_states.tolist() == [[0.0] * 4, [5.0] * 4]


def test_rows_of_an_omitting_stash_are_reported_in_debug_mode() -> None:
    """Debug on: the same mixed read is reported instead of handing over zeros."""
    relay = EagleDsaFutureMap("cpu", POOL, topk=1, debug=True)
    relay.stash(slots(1, 2), _dsa(2, hidden=torch.full((2, 4), 9.0)))
    relay.resolve_future(batch_of(1, 2))
    relay.stash(slots(1), _dsa(1))
    relay.stash(slots(2), _dsa(1, hidden=torch.full((1, 4), 5.0)))
    with pytest.raises(RuntimeError, match=r"hidden_states"):
        relay.resolve_future(batch_of(1, 2))


# -- slots -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, POOL])
@pytest.mark.parametrize("debug", [False, True])
def test_slots_outside_the_pool_are_refused_by_every_method(
    bad: int, debug: bool
) -> None:
    """A negative slot never wraps to row P-1 and a slot >= P is refused, in both modes;
    the fields after the first are never written."""
    relay = EagleDsaFutureMap("cpu", POOL, topk=1, debug=debug)
    before = relay.topk_p_buf.clone()
    with pytest.raises((IndexError, RuntimeError)):
        relay.stash(slots(bad, 1), _dsa(2, base=3))
    torch.testing.assert_close(relay.topk_p_buf, before, rtol=0, atol=0, equal_nan=True)
    assert relay.output_tokens_buf[POOL - 1].item() == (-1 if debug else 0), (
        "no wrap-around"
    )
    with pytest.raises((IndexError, RuntimeError)):
        relay.publish(slots(bad), torch.tensor([5]))
    with pytest.raises((IndexError, RuntimeError)):
        relay.resolve_future(batch_of(bad))
    relay.publish(slots(1), torch.tensor([5]))
    with pytest.raises((IndexError, RuntimeError)):
        relay.resolve_seq_lens_cpu(batch_of(bad))


def test_debug_mode_checks_slots_before_writing_anything() -> None:
    """Debug on: check_slots refuses a bad slot before the first field is written."""
    relay = EagleFutureMap("cpu", POOL, topk=1, debug=True)
    with pytest.raises(RuntimeError, match=r"slots must be in"):
        relay.stash(slots(1, POOL + 3), eagle_payload(2, 1, base=4))
    assert relay.output_tokens_buf.tolist() == [-1] * POOL


def test_int32_indices_work_in_both_modes() -> None:
    """int32 slot tensors are accepted by every method, debug on or off."""
    for debug in (False, True):
        relay = EagleFutureMap("cpu", POOL, topk=1, debug=debug)
        idx = torch.tensor([3, 1], dtype=torch.int32)
        relay.stash(idx, eagle_payload(2, 1, base=4))
        relay.publish(idx, torch.tensor([7, 8]))
        batch = Batch(req_pool_indices=idx)
        relay.resolve_future(batch)
        relay.resolve_seq_lens_cpu(batch)
        assert batch.spec_info.bonus_tokens.tolist() == [4, 5]
        assert batch.seq_lens_sum == 15


# -- smaller refusals -----------------------------------------------------------------------


def test_zero_indices_with_a_non_empty_payload_are_refused() -> None:
    """No slots but a token: the same mismatch as two slots for one token."""
    relay = DecodeFutureMap("cpu", POOL)
    with pytest.raises(RelayError, match=r"shape \(1,\) for 0 slot\(s\)"):
        relay.stash(slots(), DecodePayload(next_token_ids=torch.tensor([7])))


def test_a_zero_width_first_payload_does_not_lock_a_lazy_buffer() -> None:
    """A first hidden_states payload of width 0 is refused; the buffer stays unallocated."""
    relay = EagleFutureMap("cpu", POOL, topk=1)
    with pytest.raises(RelayError, match=r"zero-width"):
        relay.stash(slots(1), eagle_payload(1, 1, hidden=torch.empty(1, 0)))
    assert relay.hidden_states_buf is None
    relay.stash(slots(1), eagle_payload(1, 1, hidden=torch.ones(1, 8)))
    assert relay.hidden_states_buf is not None and relay.hidden_states_buf.shape == (
        POOL,
        8,
    )


@pytest.mark.parametrize("debug", [False, True])
def test_float_values_into_an_int_field_are_refused_not_truncated(debug: bool) -> None:
    """Float tokens stashed into the int64 token field raise instead of truncating."""
    relay = DecodeFutureMap("cpu", POOL, debug=debug)
    with pytest.raises(
        RelayError, match=r"torch\.float32 values for a torch\.int64 field"
    ):
        relay.stash(slots(1), DecodePayload(next_token_ids=torch.tensor([2.7])))
    dsa = EagleDsaFutureMap("cpu", POOL, topk=1, debug=debug)
    payload = EagleDsaPayload(
        bonus_tokens=torch.tensor([1]),
        topk_p=torch.rand(1, 1),
        topk_index=torch.zeros(1, 1, dtype=torch.int64),
        dsa_topk_indices=torch.tensor([[1.5, 2.0]]),
    )
    with pytest.raises(RelayError, match=r"dsa_topk_indices"):
        dsa.stash(slots(1), payload)
    assert dsa.dsa_topk_indices_buf is None
