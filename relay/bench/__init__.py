"""``relay bench``: the generated FutureMaps against hand-written baselines and floors.

``baseline`` (the hand-written maps), ``sides`` (what is compared, and one driver of a
step), ``plain`` (the floors), ``spans`` (the counted scatter), ``timing`` and ``main``
(the command). Nothing is imported here, so ``relay --help`` builds the flags without
torch. See docs/bench.md.
"""
