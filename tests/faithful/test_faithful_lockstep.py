"""Each faithful ``sglang_*`` map agrees with the model of sglang 0.5.23's relay on
every value it hands over, over random engine steps, with debug mode off and on."""

from __future__ import annotations

from collections import Counter

import pytest
from faithful_support import run

#: What each algorithm's runs must have compared, beyond plain decode steps.
EXERCISED = {
    "decode": {"decode", "beam_tail", "owners_written"},
    "eagle": {
        "decode",
        "graph_wrote",
        "stash_partial",
        "kept",
        "stream_ordered",
        "resolve_tails",
        "resolve_confidence_cpu",
        "no_draft_input",
        "no_future_indices",
        "dsa_gated_off",
        "draft_probs_without_topk",
        "mixed_tokens",
        "no_host_lengths",
        "staged",
        "staged_dsa_flag",
        "switched_off",
        "owners_written",
    },
    "ngram": {
        "decode",
        "stream_ordered",
        "no_draft_input",
        "no_future_indices",
        "owners_written",
    },
}


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("algorithm", sorted(EXERCISED))
def test_faithful_map_agrees_with_the_sglang_model(algorithm: str, debug: bool) -> None:
    """40 runs of 60 steps: admissions, decodes (idle ones too), the captured graph's
    writes, partial stashes, re-stashes keeping extras, stream-ordered reads, mixed
    batches' tails, batches without a draft input, ends and slot reuse, beam-search
    decode batches carrying their members' slots past their requests; every batch
    holds its requests, and half the runs name them at every write."""
    seen: Counter[str] = Counter()
    for seed in range(40):
        seen += run(algorithm, seed, 60, debug=debug).seen
    assert {kind for kind, count in seen.items() if count} >= EXERCISED[algorithm]
