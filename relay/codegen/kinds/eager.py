"""``Alloc.EAGER``: the buffer is made at construction, its symbolic dims given there."""

from __future__ import annotations

from relay.codegen import naming
from relay.codegen.kinds.base import AllocKind, Names, Problem, join
from relay.schema import Alloc, Field, FromPayload


class Eager(AllocKind):
    alloc = Alloc.EAGER
    lazy = False

    def problems(self, f: Field) -> list[Problem]:
        if isinstance(f.dtype, FromPayload):
            return [
                (
                    (
                        "dtype=FROM_PAYLOAD needs a lazily allocated field, but alloc is "
                        "Alloc.EAGER"
                    ),
                    "add alloc=Alloc.LAZY, or give a fixed dtype such as torch.bfloat16",
                )
            ]
        return []

    def init(self, n: Names) -> list[str]:
        shape = naming.eager_shape(n.field)
        args = [shape, n.dtype or "None", "self.device", "debug"]
        return [join(f"{n.buf}: torch.Tensor = _rt.new_buffer(", args)]

    def init_cache(self, n: Names) -> list[str]:
        if not n.field.shape:
            return []
        row = naming.shape_literal(tuple(str(d) for d in n.field.shape))
        return [f"self.{naming.row_cache(n.field)} = {row}"]

    def write(self, n: Names, debug: str, *, cache: bool) -> list[str]:
        return [f"{n.buf}.index_copy_(0, slots, {n.src})"]


KIND = Eager()
