"""``relay bench``: the generated FutureMaps against hand-written baselines, in one run.

One module per job: ``sizes`` (shapes, presets, every default), ``baseline`` (the
hand-written maps), ``sides`` (which map is compared with which, and how a step is
driven), ``floor`` (each map's step as its bare torch calls), ``breakdown`` (where a
method's time goes, statement by statement: ``relay bench --breakdown``), ``counts``
(dispatched ops, bytes, kernel launches), ``timing`` (timers and interleaving),
``measure`` (one pair at one shape: values, counts, time),
``codegen_speed`` (generation time against schema size), ``report`` (results and
tables) and ``main`` (the command line). See docs/bench.md.

Nothing is imported here: ``relay --help`` builds ``relay bench``'s flags from
``relay.bench.main``, which must not pull in torch or rich.
"""
