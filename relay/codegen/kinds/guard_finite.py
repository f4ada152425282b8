"""``Guard.FINITE``: no written value is NaN or infinite (debug mode; floating fields).

A NaN is otherwise a legal value: relay hands over whatever was written (debug mode
keeps its written/consumed state apart from the values for that reason), so a forward
that produced NaN hidden states is caught only where the field declares this guard.
"""

from __future__ import annotations

import torch

from relay.codegen.kinds.base import GuardKind, Problem
from relay.schema import Field, FromPayload, Guard


class Finite(GuardKind):
    guard = Guard.FINITE
    helper = "guard_finite"

    def problems(self, f: Field) -> list[Problem]:
        if isinstance(f.dtype, FromPayload) or not isinstance(f.dtype, torch.dtype):
            return []  # a payload dtype: integer payloads are finite by construction
        if f.dtype.is_floating_point:
            return []
        return [
            (
                (
                    f"guard=Guard.FINITE refuses NaN and infinities, which only floating "
                    f"values hold (got dtype={f.dtype})"
                ),
                (
                    "remove the guard, or give the field a floating dtype such as "
                    "torch.bfloat16"
                ),
            )
        ]

    def accepts(self, value: torch.Tensor) -> bool:
        return bool(torch.isfinite(value).all())


KIND = Finite()
