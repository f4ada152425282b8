"""``Guard.NON_NEGATIVE``: every written value is >= 0 (debug mode)."""

from __future__ import annotations

import torch

from relay.codegen.kinds._comparison import ComparisonGuard
from relay.schema import Guard


class NonNegative(ComparisonGuard):
    guard = Guard.NON_NEGATIVE
    helper = "guard_non_negative"

    def accepts(self, value: torch.Tensor) -> bool:
        return bool((value >= 0).all())


KIND = NonNegative()
