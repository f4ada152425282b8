"""The counted scatter's silent bugs, planted into the vLLM-style port of
``test_vllm_drafts`` (the bundled ``vllm_drafts`` map driven as vLLM drives it: rows
admitted, finished and reordered every step): a count outside 0 to the row's width and a
span running into another request's span are refused before ``input_ids`` changes, with
debug on and off, in every one of the port's seeded runs, naming the map, the field and
the request. (The port runs on one thread: its seeds draw the batches, not an
interleaving.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from test_vllm_drafts import K, VllmStyleEngine, _overlap

from relay import RelayError
from relay.testing import Namespace

MODES = pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
PORT_SEEDS = pytest.mark.parametrize("seed", range(5), ids=lambda s: f"port-seed-{s}")


def _count(value: int) -> Callable[[Namespace], None]:
    def plant(batch: Namespace) -> None:
        """The first running request's count set to ``value``."""
        if batch.slots.numel():
            batch.num_draft_tokens = batch.num_draft_tokens.clone()
            batch.num_draft_tokens[0] = value

    return plant


def _into_the_next(batch: Namespace) -> None:
    """One extra draft for the first of two running requests: its span runs into the
    second's first token (a count within the width, larger than the span laid out)."""
    counts = batch.num_draft_tokens
    if batch.slots.numel() > 1 and int(counts[0]) < K:
        batch.num_draft_tokens = counts.clone()
        batch.num_draft_tokens[0] += 1


def _refused(plant: Callable[[Namespace], None], seed: int, debug: bool) -> str:
    """The message of the first refused step once ``plant`` is applied, checking that
    the refused resolve left ``input_ids`` as the batch handed it."""
    engine = VllmStyleEngine(seed, debug)
    for _ in range(8):
        engine.step()
    handed: list[tuple[Namespace, torch.Tensor]] = []

    def planting(batch: Namespace) -> None:
        plant(batch)
        handed.append((batch, batch.input_ids.clone()))

    for _ in range(100):
        try:
            engine.step(planting)
        except RelayError as error:
            batch, before = handed[-1]
            assert torch.equal(batch.input_ids, before), "a refused resolve wrote"
            return str(error)
    raise AssertionError("the planted bug was never refused")


@MODES
@PORT_SEEDS
@pytest.mark.parametrize("value", [K + 1, -1], ids=["above-the-width", "negative"])
def test_a_count_outside_the_row_is_refused(value: int, seed: int, debug: bool) -> None:
    """Never clamped: above the width it would leave a gap, negative it would lay the
    next field over the sampled token."""
    message = _refused(_count(value), seed, debug)
    assert message.startswith("VllmDraftsFutureMap.draft_tokens: request "), message
    assert "(row 0, slot " in message, message
    assert f"has a count of {value} value(s), outside [0, {K}]" in message


@MODES
@PORT_SEEDS
def test_a_span_into_the_next_requests_span_is_refused(seed: int, debug: bool) -> None:
    """Debug mode may name it first as a count above what the stash made."""
    message = _refused(_into_the_next, seed, debug)
    assert message.startswith("VllmDraftsFutureMap."), message
    overlap = "(row 1, slot " in message and "would overwrite" in message
    assert overlap or (debug and "disagree on its count" in message), message


@MODES
@PORT_SEEDS
def test_offsets_without_the_drafts_are_refused(seed: int, debug: bool) -> None:
    message = _refused(_overlap, seed, debug)
    assert message.startswith("VllmDraftsFutureMap."), message
    assert "one would overwrite the other's values" in message, message
