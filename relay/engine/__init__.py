"""The reference overlap engine: a small transformer served with continuous batching.

It runs plain, EAGLE and n-gram decoding in a synchronous loop and in an overlap loop
whose hand-over between steps goes through the generated maps, imported when a run
starts (so the demo can generate them first). See ``docs/engine.md``.
"""

from relay.engine.engine import EngineConfig, RunResult, StepAgreement, run_workload
from relay.engine.model import ModelConfig
from relay.engine.scheduler import SchedulerConfig
from relay.engine.spec import SpecConfig
from relay.engine.workload import RequestSpec, WorkloadConfig, make_workload

__all__ = ["EngineConfig", "ModelConfig", "RequestSpec", "RunResult", "SchedulerConfig"]
__all__ += ["SpecConfig", "StepAgreement", "WorkloadConfig", "make_workload"]
__all__ += ["run_workload"]
