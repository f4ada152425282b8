"""``Alloc.LAZY``: the buffer is made by the first non-empty write that carries the
field, with that payload's row shape (and dtype, for ``FROM_PAYLOAD``)."""

from __future__ import annotations

from relay.codegen import naming
from relay.codegen.kinds.base import AllocKind, Names, join
from relay.schema import Alloc, Schema


class Lazy(AllocKind):
    alloc = Alloc.LAZY
    lazy = True

    def init(self, n: Names) -> list[str]:
        return [f"{n.buf}: torch.Tensor | None = None"]

    def check_args(self, n: Names) -> list[str]:
        return [n.row, n.dtype or "None"]

    def init_cache(self, n: Names) -> list[str]:
        # No dtype equals None and no shape NO_ROWS: the check's slow path until the
        # first write allocates the buffer.
        stmts = [f"self.{naming.dtype_cache(n.field)}: torch.dtype | None = None"]
        if n.field.shape:
            row = f"self.{naming.row_cache(n.field)}: tuple[int, ...]"
            stmts.append(f"{row} = _rt.NO_ROWS")
        return stmts

    def write(self, n: Names, debug: str, *, cache: bool) -> list[str]:
        args = [n.what, "self.pool_size", n.row, n.dtype or "None", n.src, debug]
        kept = [f"    self.{naming.dtype_cache(n.field)} = {n.buf}.dtype"]
        if n.field.shape:
            kept.append(f"    self.{naming.row_cache(n.field)} = {n.buf}.shape[1:]")
        return [
            f"if {n.buf} is None:",
            "    " + join(f"{n.buf} = _rt.lazy_buffer(", args),
            *(kept if cache else []),
            f"{n.buf}.index_copy_(0, slots, {n.src})",
        ]

    def fast_write(self, n: Names) -> list[str]:
        # Always true there (the test compared the dtype the buffer's making set); the
        # test narrows the optional attribute for mypy.
        return [
            f"if {n.buf} is not None:",
            f"    {n.buf}.index_copy_(0, indices, {n.src})",
        ]

    def before_read(self, schema: Schema, n: Names) -> list[str]:
        # A required lazy field read before its first stash has no buffer to read.
        owner = naming.string_literal(schema.name)
        field = naming.string_literal(n.field.name)
        return [
            f"if {n.buf} is None:",
            f"    raise _rt.never_stashed({owner}, {field})",
        ]


KIND = Lazy()
