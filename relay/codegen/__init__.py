"""relay's code generator: schema modules in, typed FutureMap modules out.

Only this package imports jinja2; the ``relay`` runtime never does.
"""

from relay.codegen.api import (
    GenerateResult,
    Job,
    check_job,
    configured_job,
    explicit_job,
    generate_configured,
    plan,
    run_job,
)

__all__ = [
    "GenerateResult",
    "Job",
    "check_job",
    "configured_job",
    "explicit_job",
    "generate_configured",
    "plan",
    "run_job",
]
