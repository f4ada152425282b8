"""The reference overlap engine: a small transformer served with continuous batching.

It runs plain and EAGLE-style speculative decoding in a synchronous loop and in an
overlap loop whose step-to-step hand-over goes through the generated maps
(``relay.maps.decode``, ``relay.maps.eagle``). See ``docs/engine.md``.

The maps are imported when a run starts, not when this package is imported, so the
demo can regenerate them first.
"""

from relay.engine.engine import EngineConfig, RunResult, StepAgreement, run_workload
from relay.engine.model import ModelConfig
from relay.engine.runner import SpecConfig
from relay.engine.scheduler import SchedulerConfig
from relay.engine.workload import RequestSpec, WorkloadConfig, make_workload

__all__ = [
    "EngineConfig",
    "ModelConfig",
    "RequestSpec",
    "RunResult",
    "SchedulerConfig",
    "SpecConfig",
    "StepAgreement",
    "WorkloadConfig",
    "make_workload",
    "run_workload",
]
