"""What every kind holds: the names a field's statements use, and the kinds' interfaces.

A kind (a ``Resolve``, ``Guard`` or ``Alloc`` member) owns three things, in its own
module (Note [Kinds] in ``relay/codegen/kinds/__init__.py``): its validation rule
(``problems``), the statements it contributes to the generated methods, and its
reference behaviour, which ``relay/testing/model.py`` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from relay.codegen import naming
from relay.schema import Alloc, Field, FromPayload, Guard, Lane, Resolve, Schema

if TYPE_CHECKING:
    from relay.testing.model import ReferenceRelay

__all__ = ["AllocKind", "GuardKind", "Names", "Problem", "ResolveKind", "join"]

#: A validation problem: (what is wrong, with the value given; the fix).
Problem = tuple[str, str]


def join(opener: str, args: Sequence[str], closer: str = ")") -> str:
    """``opener`` + the arguments + ``closer`` on one line: the formatter lays it out."""
    return opener + ", ".join(args) + closer


@attrs.frozen
class Names:
    """Every spelling one field's statements use, made once from the declaration."""

    field: Field
    #: ``self.topk_p_buf``.
    buf: str
    #: The local (or publish parameter) holding the checked value: the payload name.
    src: str
    #: Where the value arrives: ``payload.topk_p`` (stash) or ``topk_p`` (publish).
    given: str
    #: ``"EagleFutureMap.topk_p"``: how messages name the field.
    what: str
    #: ``self._hidden_states_carried`` of an optional field, else ``None``.
    carried: str | None
    #: ``batch.spec_info.topk_p``, or ``None``.
    target: str | None
    #: The local a resolve gathers into.
    value: str
    #: The resolve that reads the field: ``resolve_future`` or ``resolve_seq_lens_cpu``.
    reader: str
    #: ``self._new_seq_lens_host`` where the field is mirrored or summed on the host.
    host: str | None
    #: The row shape a lazy buffer is checked against (``None`` for symbolic dims).
    row: str
    #: The declared dtype's spelling, ``None`` for ``FROM_PAYLOAD``.
    dtype: str | None

    @classmethod
    def of(cls, schema: Schema, f: Field) -> Names:
        forward = f.lane is Lane.FORWARD
        mirrored = f.host_mirror is not None or f.host_sum is not None
        return cls(
            field=f,
            buf=f"self.{naming.buffer(f)}",
            src=f.payload_name,
            given=f"payload.{f.payload_name}" if forward else f.payload_name,
            what=naming.string_literal(f"{schema.name}.{f.name}"),
            carried=f"self.{naming.carried_flag(f)}" if f.optional else None,
            target=f"batch.{f.target}" if f.target is not None else None,
            value=naming.value_local(f),
            reader="resolve_future" if forward else naming.resolve_method(f),
            host=f"self.{naming.host_mirror(f)}" if mirrored else None,
            row=naming.declared_row(f),
            dtype=None if isinstance(f.dtype, FromPayload) else naming.dtype(f.dtype),
        )


class GuardKind:
    """A value check, run in debug mode only (Note [Guards in debug mode])."""

    guard: Guard
    #: The ``relay.runtime`` helper that checks a written value on the device.
    helper: str | None = None

    def problems(self, f: Field) -> list[Problem]:
        """Why ``f`` cannot take this guard (its dtype); none by default."""
        return []

    def statement(self, n: Names) -> str | None:
        """The debug-mode check of the value about to be written."""
        if self.helper is None:
            return None
        return join(f"_rt.{self.helper}(", [n.src, n.what])

    def accepts(self, value: torch.Tensor) -> bool:
        """Reference behaviour: whether debug mode lets ``value`` be written."""
        return True


class AllocKind:
    """When a field's buffer is made, and so how it is written and read."""

    alloc: Alloc
    lazy: bool

    def problems(self, f: Field) -> list[Problem]:
        return []

    def init(self, n: Names) -> list[str]:
        """The constructor's statements for the buffer."""
        raise NotImplementedError

    def init_cache(self, n: Names) -> list[str]:
        """The constructor's statements for what the inline row check compares with
        (Note [Checked values] in runtime.py): the row dims, a lazy field's dtype."""
        return []

    def check_args(self, n: Names) -> list[str]:
        """``check_rows``'s arguments after the buffer (a lazy row's declared shape)."""
        return []

    def write(self, n: Names, debug: str, *, cache: bool) -> list[str]:
        """The write of the checked value into rows ``slots`` (``debug``: whether the
        map checks, as source: a new lazy buffer then starts poisoned; ``cache``:
        whether a new buffer's dtype and row are kept for the inline check of Note
        [Checked values] in runtime.py)."""
        raise NotImplementedError

    def fast_write(self, n: Names) -> list[str]:
        """The write on the fast path (Note [Fast writes] in runtime.py), whose test
        saw the buffer made: a lazy field's dtype is set only once it is."""
        return [f"{n.buf}.index_copy_(0, indices, {n.src})"]

    def before_read(self, schema: Schema, n: Names) -> list[str]:
        """What a resolve of a required field runs before reading the buffer."""
        return []

    def initial_dtype(self, f: Field) -> torch.dtype | None:
        """Reference behaviour: the buffer's dtype before any write (``None``: taken
        from the first payload that carries the field)."""
        return None if isinstance(f.dtype, FromPayload) else f.dtype


@attrs.frozen
class Read:
    """What a resolve kind hands the batch: statements, then where the host copies come
    from, and the rows and extra arguments of the debug-mode ``read`` report."""

    stmts: tuple[str, ...]
    host_src: str
    rows: str
    extra: tuple[str, ...] = ()


class ResolveKind:
    """How a field's value reaches the batch."""

    resolve: Resolve
    #: A target the batch Protocol types as never ``None`` (it holds placeholders).
    target_always_tensor: bool = False

    def problems(self, f: Field) -> list[Problem]:
        return []

    def read(self, n: Names) -> Read:
        raise NotImplementedError

    def invalidate(self, n: Names) -> list[str]:
        """``invalidate``'s statements for the field (none unless it has placeholders)."""
        return []

    def read_doc(self, f: Field, later: str) -> str | None:
        """The resolve doc string's line for the target (``later``: the optional note)."""
        raise NotImplementedError

    def model_value(
        self, model: ReferenceRelay, f: Field, batch: Any, slots: list[int]
    ) -> torch.Tensor:
        """Reference behaviour: the value the resolve hands ``batch`` for ``slots``."""
        raise NotImplementedError

    def model_invalidate(self, f: Field, batch: Any, indices: torch.Tensor) -> None:
        """Reference behaviour of ``invalidate`` for the field."""
