"""``Resolve.GATHER``: the target gets ``buf[indices]``, one ``index_select``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from relay.codegen import naming
from relay.codegen.kinds.base import Names, Read, ResolveKind
from relay.schema import Field, Lane, Resolve

if TYPE_CHECKING:
    from relay.testing.model import ReferenceRelay


class Gather(ResolveKind):
    resolve = Resolve.GATHER

    def read(self, n: Names) -> Read:
        gather = f"{n.buf}.index_select(0, indices)"
        if n.field.lane is Lane.SCHEDULE:
            # A local first: the host mirror and sum copy it too.
            return Read(
                (f"{n.value} = {gather}", f"{n.target} = {n.value}"),
                host_src=n.value,
                rows="indices",
            )
        return Read((f"{n.target} = {gather}",), host_src=n.value, rows="indices")

    def read_doc(self, f: Field, later: str) -> str | None:
        return f"- ``batch.{f.target} = {naming.buffer(f)}[indices]``{later}."

    def model_value(
        self, model: ReferenceRelay, f: Field, batch: Any, slots: list[int]
    ) -> torch.Tensor:
        return torch.stack([model.row(f.name, slot) for slot in slots])


KIND = Gather()
