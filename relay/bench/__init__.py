"""``relay bench``: the generated FutureMaps timed against hand-written baselines.

``relay.bench.baseline`` holds the hand-written maps; ``relay.bench.main`` the
harness and the command line. See docs/bench.md.
"""

from relay.bench.baseline import DecodeFutureMapBaseline, EagleFutureMapBaseline

__all__ = ["DecodeFutureMapBaseline", "EagleFutureMapBaseline"]
