"""A pytest fixture for the lockstep harness.

Enable it in your root ``conftest.py``::

    pytest_plugins = ["relay.testing.pytest_plugin"]

then::

    def test_my_relay(relay_lockstep):
        relay_lockstep(my_schemas.SCHEMA, MyFutureMap, dims={"hidden": 8})

``pytest --relay-lockstep-ops N`` sets how many operations each call runs (default
10,000), so a quick local run and a thorough CI run share one test.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from relay.testing.lockstep import check_lockstep

__all__ = ["pytest_addoption", "relay_lockstep"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--relay-lockstep-ops",
        type=int,
        default=None,
        help="operations each relay_lockstep call runs (default: 10000)",
    )


@pytest.fixture
def relay_lockstep(request: pytest.FixtureRequest) -> Callable[..., int]:
    """``check_lockstep`` with the operation count from ``--relay-lockstep-ops``."""
    try:
        ops = request.config.getoption("--relay-lockstep-ops")
    except (
        ValueError
    ):  # the plugin's option is not registered (fixture imported directly)
        ops = None
    if ops is None:
        return check_lockstep
    return functools.partial(check_lockstep, operations=ops)
