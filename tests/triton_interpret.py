"""Triton kernels on the CPU for the tests: private copies of a kernel module run by Triton's
interpreter (``TRITON_INTERPRET=1``), or compiled for a CUDA target without a GPU.

Note [Interpreted kernels in tests]
Triton decides when ``@triton.jit`` decorates a kernel whether it is compiled or
interpreted, from ``TRITON_INTERPRET`` at that moment. A test therefore never sets the
variable for the whole process (the GPU tests in the same run must launch the compiled
gate kernel, and whatever imports it first would fix its mode for everyone):
``load_module`` executes a private copy of the kernel's file under another module name
with the variable set for the import only, and ``Interpreted`` sets it again around each
launch, since the interpreter also reads it while it runs. Tensors handed to an
interpreted kernel must be on the CPU (the interpreter reads and writes them in place;
CUDA tensors it would copy to the host and back).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def require_triton() -> None:
    """Skip where triton is not installed: relay does not depend on it, and torch's CUDA
    wheels bring it where the gates run for real."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip(
            f"triton is not installed ({sys.platform}/{platform.machine()}); torch's "
            "CUDA wheels bring it, `pip install triton` adds it to a CPU build"
        )


@contextmanager
def interpreting(on: bool) -> Iterator[None]:
    """``TRITON_INTERPRET`` set to 1 (or 0) inside, restored on exit."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


def load_module(path: Path, name: str, *, interpret: bool) -> ModuleType:
    """A private copy of the module at ``path`` (not in ``sys.modules``), its kernels
    interpreted or compiled as ``interpret`` says (Note [Interpreted kernels in tests])."""
    require_triton()
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with interpreting(interpret):
        spec.loader.exec_module(module)
    return module


class Interpreted:
    """An interpreted kernel, launched as ``kernel[grid](*args)`` like a compiled one, with
    ``TRITON_INTERPRET=1`` around each launch; ``launches`` lists each launch's grid."""

    def __init__(self, kernel: Any) -> None:
        assert type(kernel).__name__ == "InterpretedFunction", type(kernel)
        self.kernel = kernel
        self.launches: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append(tuple(grid))
            with interpreting(True):
                self.kernel[grid](*args, **kwargs)

        return launch
