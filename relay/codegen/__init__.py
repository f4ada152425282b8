"""relay's code generator: schema modules in, typed FutureMap modules out.

Only this package imports jinja2; the ``relay`` runtime never does. The names below
are loaded on first use, so ``relay.codegen.cli`` (the flags of ``relay generate``)
imports without jinja2 or the pipeline.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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


def __getattr__(name: str) -> object:
    if name in __all__:
        return getattr(importlib.import_module("relay.codegen.api"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
