"""``Resolve.PLACEHOLDER``: the sentinel protocol. ``invalidate`` writes ``-slot`` into
the target; the resolve replaces every negative ``x`` there by ``buf[-x]`` and leaves
the rest (tokens a mixed batch already holds)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from relay.codegen import naming
from relay.codegen.kinds.base import Names, Problem, Read, ResolveKind
from relay.schema import Field, FromPayload, Resolve

if TYPE_CHECKING:
    from relay.testing.model import ReferenceRelay


def _signed_int(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


class Placeholder(ResolveKind):
    resolve = Resolve.PLACEHOLDER
    target_always_tensor = True

    def problems(self, f: Field) -> list[Problem]:
        found = []
        if isinstance(f.dtype, FromPayload):
            found.append(
                (
                    (
                        "resolve=Resolve.PLACEHOLDER needs a fixed integer dtype, since "
                        "placeholders are negative slots (got dtype=FROM_PAYLOAD)"
                    ),
                    "give dtype=torch.int64, or use resolve=Resolve.GATHER",
                )
            )
        elif isinstance(f.dtype, torch.dtype) and not _signed_int(f.dtype):
            found.append(
                (
                    (
                        "resolve=Resolve.PLACEHOLDER needs an integer dtype, since "
                        f"placeholders are negative slots (got {f.dtype})"
                    ),
                    "use resolve=Resolve.GATHER for this field",
                )
            )
        elif isinstance(f.dtype, torch.dtype) and not f.dtype.is_signed:
            found.append(
                (
                    (
                        "resolve=Resolve.PLACEHOLDER needs a signed integer dtype, since "
                        f"placeholders are negative slots (got {f.dtype})"
                    ),
                    (
                        "give a signed dtype such as torch.int64, or use "
                        "resolve=Resolve.GATHER"
                    ),
                )
            )
        if f.optional is True:
            found.append(
                (
                    (
                        "resolve=Resolve.PLACEHOLDER needs the value on every step: a step "
                        "whose payload omits an optional field would leave the placeholders "
                        "(-slot) that invalidate wrote, or a previous step's value, for the "
                        "forward (got optional=True)"
                    ),
                    (
                        "make the field required (optional=False), or use "
                        "resolve=Resolve.GATHER"
                    ),
                )
            )
        if isinstance(f.shape, tuple) and f.shape:
            found.append(
                (
                    (
                        "resolve=Resolve.PLACEHOLDER needs one value per slot, shape=() "
                        f"(got shape={f.shape!r})"
                    ),
                    "use resolve=Resolve.GATHER for rows",
                )
            )
        if f.target is None:
            found.append(
                (
                    (
                        "resolve=Resolve.PLACEHOLDER needs a target holding the placeholders "
                        "(got target=None)"
                    ),
                    'add target="input_ids" (or another batch tensor)',
                )
            )
        return found

    def read(self, n: Names) -> Read:
        at, pending, rows = naming.placeholder_locals(n.field)
        return Read(
            (
                f"{at} = {n.target}",
                f"{pending} = {at} < 0",
                f"{rows} = {at}.neg().clamp(min=0)",
                f"{n.value} = {n.buf}.index_select(0, {rows})",
                f"{at}.copy_(torch.where({pending}, {n.value}, {at}))",
            ),
            host_src=at,
            rows=rows,
            extra=(f"taken={pending}",),
        )

    def invalidate(self, n: Names) -> list[str]:
        return [f"{n.target} = indices.neg()"]

    def read_doc(self, f: Field, later: str) -> str | None:
        return (
            f"- ``batch.{f.target}``: each placeholder ``-slot`` becomes "
            f"``{naming.buffer(f)}[slot]``{later}."
        )

    def model_value(
        self, model: ReferenceRelay, f: Field, batch: Any, slots: list[int]
    ) -> torch.Tensor:
        from relay.testing.model import get_path

        assert f.target is not None
        current: torch.Tensor = get_path(batch, f.target)
        if not current.numel():
            return current.clone()
        return torch.stack(
            [
                model.row(f.name, -x).to(current.dtype)
                if x < 0
                else torch.tensor(x, dtype=current.dtype)
                for x in current.tolist()
            ]
        )

    def model_invalidate(self, f: Field, batch: Any, indices: torch.Tensor) -> None:
        from relay.testing.model import set_path

        assert f.target is not None
        slots = [int(s) for s in indices.tolist()]
        set_path(
            batch, f.target, torch.tensor([-s for s in slots], dtype=indices.dtype)
        )


KIND = Placeholder()
