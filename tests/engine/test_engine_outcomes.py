"""What the engine's public run API reports, where a wrong engine would still produce
tokens that look right: every abort ends its request (prebuilt ones still queued too),
and n-gram speculation keeps the acceptance its relay makes possible."""

from __future__ import annotations

import attrs
import pytest

from relay.engine import (
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    WorkloadConfig,
    run_workload,
)
from relay.engine.spec import SpecConfig

TINY = ModelConfig(
    vocab_size=1024, hidden=32, layers=1, heads=2, ffn=64, max_context=96
)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_every_abort_ends_its_request_prebuilt_ones_still_queued_too(
    overlap: bool,
) -> None:
    """Many prebuilt requests arrive faster than slots free up, and many are aborted
    while they wait: each abort counted ends its request as aborted (one left queued
    would be admitted later and run to its length), and only requests that were not
    aborted first are admitted as prebuilt."""
    workload = WorkloadConfig(
        requests=48,
        min_prompt=4,
        max_prompt=40,
        min_output=2,
        max_output=24,
        arrival_rate=4.0,
        abort_share=0.4,
        prebuilt_share=0.6,
    )
    config = EngineConfig(
        model=TINY,
        workload=workload,
        scheduler=SchedulerConfig(
            max_running=4, max_prefill_tokens=24, kv_pages=10, page_size=8
        ),
        overlap=overlap,
        debug=True,
    )
    result = run_workload(config)
    assert result.aborts > 0 and result.prebuilt > 0
    assert len(result.aborted_ids) == result.aborts, (
        f"{result.aborts} aborts counted, but only {len(result.aborted_ids)} requests "
        f"ended as aborted: {result.finish_reasons}"
    )
    assert result.finish_reasons["abort"] == result.aborts


#: A vocabulary this small makes the tiny model's greedy outputs repeat themselves,
#: so n-gram drafts are often right: an acceptance of about 3 of the 4 tokens a step
#: can emit (3 drafts and the bonus).
REPEATING = attrs.evolve(TINY, vocab_size=16)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_ngram_acceptance_stays_where_the_relayed_lengths_put_it(
    overlap: bool,
) -> None:
    """The accepted drafts reach the next step's context only through the relayed
    ``accept_lens``: were they handed over as 0, outputs would not change (greedy
    verification) but the drafts would miss and acceptance would fall to about 2."""
    workload = WorkloadConfig(
        requests=16, min_prompt=4, max_prompt=40, min_output=16, max_output=40
    )
    scheduler = SchedulerConfig(
        max_running=4, max_prefill_tokens=64, kv_pages=96, page_size=8, retract=False
    )
    ngram = EngineConfig(
        model=REPEATING,
        workload=workload,
        scheduler=scheduler,
        spec=SpecConfig(steps=3, method="ngram"),
        overlap=overlap,
        debug=True,
    )
    result = run_workload(ngram)
    assert result.accept_length > 2.5, result.accept_length
    plain = run_workload(attrs.evolve(ngram, spec=None))
    assert plain.outputs == result.outputs


def test_variable_draft_counts_change_acceptance_not_outputs() -> None:
    """N-gram speculation with variable draft counts: each request verifies only the
    drafts its match found (0 to 3 a step), so fewer drafts are accepted than with a
    short match padded by its last token, and the outputs stay plain decoding's, in
    both loops, with the relay's maps in debug mode."""
    workload = WorkloadConfig(
        requests=16, min_prompt=4, max_prompt=40, min_output=16, max_output=40
    )
    scheduler = SchedulerConfig(
        max_running=4, max_prefill_tokens=64, kv_pages=96, page_size=8, retract=False
    )
    fixed = EngineConfig(
        model=REPEATING,
        workload=workload,
        scheduler=scheduler,
        spec=SpecConfig(steps=3, method="ngram"),
        overlap=True,
        debug=True,
    )
    variable = attrs.evolve(
        fixed, spec=SpecConfig(steps=3, method="ngram", variable_drafts=True)
    )
    padded, counted = run_workload(fixed), run_workload(variable)
    synced = run_workload(attrs.evolve(variable, overlap=False))
    assert counted.outputs == padded.outputs == synced.outputs
    assert 1.0 < counted.accept_length < padded.accept_length, (
        counted.accept_length,
        padded.accept_length,
    )


def test_variable_drafts_need_ngram() -> None:
    """EAGLE's draft head always drafts ``steps`` tokens: the option is refused there."""
    with pytest.raises(ValueError, match="variable_drafts needs method='ngram'"):
        SpecConfig(steps=3, variable_drafts=True)
