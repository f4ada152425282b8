"""The reference model of relay semantics: what a generated map means, slot by slot.

Written for obviousness, not speed: plain dicts of per-slot row tensors, no buffers,
no streams, no debug bookkeeping. It follows the schema declarations directly, so it
works for any schema; what a kind means (how a resolve hands a value over, what a
guard accepts, when a buffer's dtype is known) is the kind's own reference behaviour
(Note [Kinds] in ``relay/codegen/kinds/__init__.py``). The lockstep harness (``relay.testing.lockstep``) runs it beside
a generated map and compares every value they hand over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from relay.codegen import kinds
from relay.schema import Field as FieldDecl
from relay.schema import Lane, Schema

__all__ = ["ModelError", "ReferenceRelay", "get_path", "set_path"]


class ModelError(AssertionError):
    """The model was asked for a value the relay does not define (a harness bug)."""


def get_path(obj: Any, path: str) -> Any:
    """``obj.a.b`` for ``path="a.b"``."""
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def set_path(obj: Any, path: str, value: Any) -> None:
    """``obj.a.b = value`` for ``path="a.b"``."""
    *parents, leaf = path.split(".")
    for name in parents:
        obj = getattr(obj, name)
    setattr(obj, leaf, value)


class ReferenceRelay:
    """A relay as a dictionary per field: slot -> the row most recently written for it.

    Optional fields follow Note [Optional fields] (``hands_over``); a slot released or
    left out by the latest write holds nothing, and asking for it is a ``ModelError``.
    """

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.fields: dict[str, FieldDecl] = {f.name: f for f in schema.fields}
        #: field -> slot -> row (already cast to the field's dtype).
        self.rows: dict[str, dict[int, torch.Tensor]] = {
            f.name: {} for f in schema.fields
        }
        #: The dtype of each field: declared, or taken from the first payload carrying it.
        self.dtype: dict[str, torch.dtype | None] = {
            f.name: kinds.alloc(f).initial_dtype(f) for f in schema.fields
        }
        #: Optional fields: whether the latest non-empty write carried them.
        self.carried: dict[str, bool] = {
            f.name: False for f in schema.fields if f.optional
        }

    # -- writes ------------------------------------------------------------------------
    def stash(
        self, slots: Sequence[int], values: Mapping[str, torch.Tensor | None]
    ) -> None:
        """The forward lane's write: ``values`` by payload attribute name."""
        self._write(Lane.FORWARD, slots, values)

    def publish(
        self, slots: Sequence[int], values: Mapping[str, torch.Tensor | None]
    ) -> None:
        """The schedule lane's write: ``values`` by publish keyword."""
        self._write(Lane.SCHEDULE, slots, values)

    def _write(
        self,
        lane: Lane,
        slots: Sequence[int],
        values: Mapping[str, torch.Tensor | None],
    ) -> None:
        if not slots:
            return  # zero indices: nothing happens, not even to ``carried``
        for f in self.schema.fields:
            if f.lane is not lane:
                continue
            value = values.get(f.payload_name)
            if f.optional:
                self.carried[f.name] = value is not None
            if value is None:
                for slot in slots:
                    self.rows[f.name].pop(slot, None)  # no earlier value survives
                continue
            dtype = self.dtype[f.name]
            if dtype is None:
                dtype = self.dtype[f.name] = value.dtype
            for position, slot in enumerate(slots):
                self.rows[f.name][slot] = value[position].to(dtype).clone()

    def release(self, slots: Sequence[int]) -> None:
        """The requests of ``slots`` ended: nothing written for them may be read again."""
        for rows in self.rows.values():
            for slot in slots:
                rows.pop(slot, None)

    def invalidate(self, batch: Any, indices: torch.Tensor) -> None:
        """Placeholders ``-slot`` into every placeholder target."""
        if indices.numel() == 0:
            return
        for f in self.schema.fields:
            kinds.resolve(f).model_invalidate(f, batch, indices)

    def accepts(self, field: str, value: torch.Tensor) -> bool:
        """Whether debug mode lets ``value`` be written into ``field`` (its guard)."""
        f = self.fields[field]
        return kinds.guard(f).accepts(value)

    # -- reads -------------------------------------------------------------------------
    def row(self, field: str, slot: int) -> torch.Tensor:
        """The row written for ``slot`` most recently (ModelError where there is none)."""
        row = self.rows[field].get(slot)
        if row is None:
            raise ModelError(
                f"{field}: slot {slot} holds no value the relay may hand over"
            )
        return row

    def hands_over(self, field: str) -> bool:
        """Note [Optional fields]: an optional field is handed over when the latest
        non-empty stash (or publish) carried it, and is ``None`` otherwise; a required
        field always is. The one place the model states that rule."""
        return self.carried.get(field, True)

    def resolve_future(self, batch: Any) -> None:
        """Every forward field with a target, handed to ``batch``."""
        for f in self.schema.fields:
            if f.lane is Lane.FORWARD and f.target is not None:
                self._resolve(f, batch)

    def resolve_schedule(self, field: str, batch: Any) -> None:
        """The schedule-side resolve of ``field``: target, host mirror and host sum."""
        self._resolve(self.fields[field], batch)

    def _resolve(self, f: FieldDecl, batch: Any) -> None:
        slots = [int(s) for s in get_path(batch, self.schema.indices).tolist()]
        if not slots:
            return
        value: torch.Tensor | None = None
        if self.hands_over(f.name):
            value = kinds.resolve(f).model_value(self, f, batch, slots)
        if f.target is not None:
            set_path(batch, f.target, value)
        if f.host_mirror is not None:
            set_path(batch, f.host_mirror, None if value is None else value.clone())
        if f.host_sum is not None:
            set_path(batch, f.host_sum, None if value is None else int(value.sum()))
