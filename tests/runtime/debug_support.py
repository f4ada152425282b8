"""Whether the generated maps speak the debug-mode contract of ``relay.debug``.

Until the template change that makes generated maps call ``relay.debug.DebugChecks``
lands, tests that drive debug mode through a generated map are skipped with this
marker (and run for real once it has).
"""

from __future__ import annotations

import pytest

from relay.debug import DebugChecks
from relay.maps.decode import DecodeFutureMap


def maps_use_debug_contract() -> bool:
    """A bundled map built with ``debug=True`` holds a ``relay.debug.DebugChecks``."""
    return isinstance(getattr(DecodeFutureMap("cpu", 2, debug=True), "_debug", None), DebugChecks)


needs_debug_contract = pytest.mark.skipif(
    not maps_use_debug_contract(),
    reason="needs the generated maps to call relay.debug.DebugChecks (gen's template change)",
)
