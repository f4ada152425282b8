"""``Guard.POSITIVE``: every written value is > 0 (debug mode)."""

from __future__ import annotations

import torch

from relay.codegen.kinds._comparison import ComparisonGuard
from relay.schema import Guard


class Positive(ComparisonGuard):
    guard = Guard.POSITIVE
    helper = "guard_positive"

    def accepts(self, value: torch.Tensor) -> bool:
        return bool((value > 0).all())


KIND = Positive()
