"""``relay bench``: the generated FutureMaps against hand-written baselines and floors
(docs/bench.md). Nothing is imported here: ``relay --help`` needs no torch."""
