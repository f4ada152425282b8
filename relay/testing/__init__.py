"""Testing aids for relay users: the reference model and the lockstep harness.

``check_lockstep(SCHEMA)`` runs a generated map and ``ReferenceRelay`` side by side on
Hypothesis-drawn operation sequences and fails on the first value they disagree on
(see docs/debugging.md). Needs ``hypothesis`` (the ``dev`` extra).
"""

from relay.testing.lockstep import (
    LockstepDivergence,
    Namespace,
    check_lockstep,
    load_map_class,
    run_lockstep,
)
from relay.testing.model import ModelError, ReferenceRelay

__all__ = [
    "LockstepDivergence",
    "ModelError",
    "Namespace",
    "ReferenceRelay",
    "check_lockstep",
    "load_map_class",
    "run_lockstep",
]
