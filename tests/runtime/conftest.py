"""Fixtures of the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import relay.debug
import relay.device


@pytest.fixture
def isolated_policies(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Policy registrations made by the test are undone afterwards."""
    monkeypatch.setattr(relay.device, "_FACTORIES", {})
    monkeypatch.setattr(relay.device, "_POLICIES", {})
    yield


@pytest.fixture
def clocks_on() -> Iterator[None]:
    """The happens-before clocks installed for the test, as an engine installs them
    (building a debug map does not), and uninstalled after it."""
    with relay.debug.happens_before():
        yield
    assert not relay.debug.happens_before_enabled(), "a test left the clocks installed"
