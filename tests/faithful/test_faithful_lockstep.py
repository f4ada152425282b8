"""Each faithful ``sglang_*`` map agrees with the model of sglang 0.5.23's relay on
every value it hands over, over random engine steps, with debug mode off and on."""

from __future__ import annotations

import pytest
from faithful_support import run

ALGORITHMS = ["decode", "eagle", "ngram"]


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_faithful_map_agrees_with_the_sglang_model(algorithm: str, debug: bool) -> None:
    """40 runs of 60 steps each: admissions, decodes, idle steps, ends and reuse."""
    for seed in range(40):
        run(algorithm, seed, 60, debug=debug)
