"""Shared pytest options and markers for relay's tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _torch_compiler_cache() -> Iterator[None]:
    """torch makes its compiler cache folder (``torchinductor_<user>`` in the temporary
    folder) the first time anything imports its compiler, as a ``TorchDispatchMode``
    does (relay's op counter): the tests and the processes they start point it at a
    folder of their own and remove it, so a test run leaves the temporary folder as it
    found it."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    folder = tempfile.mkdtemp(prefix="relay-tests-torch-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        yield
    finally:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        shutil.rmtree(folder, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/ from the generator instead of comparing (never in CI)",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """Whether golden files are being rewritten (``pytest --update-golden``)."""
    return bool(request.config.getoption("--update-golden"))


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    # GPU tests are skipped, visibly, where there is no CUDA device; never passed silently.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker: gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> torch.device:
    """Each test that takes ``device`` runs on the CPU, and on CUDA where there is one."""
    return torch.device(request.param)
