"""Fixtures of the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import relay.device


@pytest.fixture
def isolated_policies(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Policy registrations made by the test are undone afterwards."""
    monkeypatch.setattr(relay.device, "_FACTORIES", {})
    monkeypatch.setattr(relay.device, "_POLICIES", {})
    yield
