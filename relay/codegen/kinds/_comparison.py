"""What the comparison guards share: they compare with 0, which bool and complex
values cannot be checked by."""

from __future__ import annotations

import torch

from relay.codegen.kinds.base import GuardKind, Problem
from relay.schema import Field


class ComparisonGuard(GuardKind):
    def problems(self, f: Field) -> list[Problem]:
        if isinstance(f.dtype, torch.dtype) and (
            f.dtype == torch.bool or f.dtype.is_complex
        ):
            return [
                (
                    (
                        f"guard={self.guard} compares values with 0, which {f.dtype} values "
                        f"cannot be checked by (got guard={self.guard} with dtype={f.dtype})"
                    ),
                    "remove the guard, or give the field a real integer or float dtype",
                )
            ]
        return []
