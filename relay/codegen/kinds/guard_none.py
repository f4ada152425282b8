"""``Guard.NONE``: no value check."""

from __future__ import annotations

from relay.codegen.kinds.base import GuardKind
from relay.schema import Guard


class NoGuard(GuardKind):
    guard = Guard.NONE


KIND = NoGuard()
