"""The reference model of relay semantics: what a generated map means, slot by slot.

Written for obviousness, not speed: plain dicts of per-slot row tensors, no buffers,
no streams, no debug bookkeeping. It follows the schema declarations directly, so it
works for any schema, and it states what each kind means itself (how a resolve hands a
value over, what a guard accepts, when a buffer's dtype is known), from the schema
vocabulary and the docs alone: it imports nothing of the generator it checks. The
lockstep harness (``relay.testing.lockstep``) runs it beside a generated map and
compares every value they hand over.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from relay.schema import (
    Carried,
    FromPayload,
    Guard,
    IfNone,
    Lane,
    Resolve,
    Schema,
    Switch,
    TargetShape,
    Unwritten,
)
from relay.schema import Field as FieldDecl

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

    def __init__(
        self,
        schema: Schema,
        dims: Mapping[str, int] | None = None,
        switches: Mapping[str, bool] | None = None,
    ) -> None:
        self.schema = schema
        #: Fields whose ``Switch`` keyword the map was built with false: a write's
        #: value for them is dropped, so they are never carried or handed over.
        self.off = {
            f.name
            for f in schema.fields
            if isinstance(f.gate, Switch)
            and not (switches or {}).get(f.gate.keyword, True)
        }
        #: Sizes of the symbolic dims: the rows a never-written zeros field reads.
        self.dims = dict(dims or {})
        #: field -> the slots any write ever reached (a zeros row reads zeros before).
        self.written: dict[str, set[int]] = {f.name: set() for f in schema.fields}
        self.fields: dict[str, FieldDecl] = {f.name: f for f in schema.fields}
        #: field -> slot -> row (already cast to the field's dtype).
        self.rows: dict[str, dict[int, torch.Tensor]] = {
            f.name: {} for f in schema.fields
        }
        #: The dtype of each field: declared, or taken from the first payload carrying it.
        self.dtype: dict[str, torch.dtype | None] = {
            f.name: None if isinstance(f.dtype, FromPayload) else f.dtype
            for f in schema.fields
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

    def stash_partial(
        self, slots: Sequence[int], values: Mapping[str, torch.Tensor | None]
    ) -> None:
        """A partial stash: the forward fields not kept, by payload name; every kept
        field's rows stay as they were."""
        self._write(Lane.FORWARD, slots, values, partial=True)

    def graph_wrote(
        self, slots: Sequence[int], values: Mapping[str, torch.Tensor]
    ) -> None:
        """A captured graph wrote ``values`` (by field name) into the rows of ``slots``
        of every graph-written field: they hold those values, as after a write."""
        for f in self.schema.fields:
            if f.graph_written and slots:
                self.written[f.name].update(slots)
                dtype = self.dtype[f.name]
                assert dtype is not None, "a graph-written field has a fixed dtype"
                for position, slot in enumerate(slots):
                    row = values[f.name][position].to(dtype).clone()
                    self.rows[f.name][slot] = row

    def _write(
        self,
        lane: Lane,
        slots: Sequence[int],
        values: Mapping[str, torch.Tensor | None],
        *,
        partial: bool = False,
    ) -> None:
        if not slots:
            return  # zero indices: nothing happens, not even to ``carried``
        for f in self.schema.fields:
            if f.lane is not lane or (partial and f.kept):
                continue
            value = None if f.name in self.off else values.get(f.payload_name)
            if value is None and (f.kept or f.graph_written):
                # A kept field left out keeps its rows and its carried flag; a
                # graph-written one left out was written by the graph (graph_wrote).
                continue
            self.written[f.name].update(slots)
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
        """Placeholders ``-slot`` into every placeholder target, in the indices' dtype."""
        if indices.numel() == 0:
            return
        for f in self.schema.fields:
            if f.resolve is Resolve.PLACEHOLDER and f.target is not None:
                slots = [int(s) for s in indices.tolist()]
                placeholders = torch.tensor([-s for s in slots], dtype=indices.dtype)
                set_path(batch, f.target, placeholders)

    def accepts(self, field: str, value: torch.Tensor) -> bool:
        """Whether debug mode lets ``value`` be written into ``field`` (its guard, as
        docs/schema.md states it: a ``>= 0`` or ``> 0`` guard lets NaN through, since
        NaN is not below the bound; ``FINITE`` refuses NaN and infinities)."""
        guard = self.fields[field].guard
        if guard is Guard.NON_NEGATIVE:
            return not bool((value < 0).any())
        if guard is Guard.POSITIVE:
            return not bool((value <= 0).any())
        if guard is Guard.FINITE:
            return bool(torch.isfinite(value).all())
        return True

    # -- reads -------------------------------------------------------------------------
    def row(self, field: str, slot: int) -> torch.Tensor:
        """The row written for ``slot`` most recently (ModelError where there is none)."""
        row = self.rows[field].get(slot)
        f = self.fields[field]
        zeros = f.unwritten is Unwritten.ZEROS and slot not in self.written[field]
        dtype = self.dtype[field]
        if row is None and zeros and dtype is not None:
            # Unwritten.ZEROS: a row no write has reached reads zeros (docs/schema.md).
            shape = tuple(d if isinstance(d, int) else self.dims[d] for d in f.shape)
            return torch.zeros(shape, dtype=dtype)
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

    def resolve_tails(self, field: str, batch: Any) -> None:
        """Late binding of a mixed batch's decode tails (docs/schema.md): with the
        decode rows' slots in ``batch.<tails>`` (the batch's last rows), each one's
        entry of the target (and of the host mirror) becomes its published length plus
        ``tails.add``, its KV location ``table[slot, published + tails.add - 1]`` and
        its entry of the prefix list ``published + tails.add - 1``; the host sum is
        the mirror's. Nothing is consumed: it is a second read of the published
        values."""
        f = self.fields[field]
        tails = f.tails
        assert tails is not None and f.target is not None
        mirror, total = (f.host.mirror, f.host.sum) if f.host else (None, None)
        slots = [int(s) for s in get_path(batch, tails.rows).tolist()]
        if not slots:
            return
        n = len(slots)
        lengths = torch.stack([self.row(f.name, slot) for slot in slots])

        def bound(path: str, rows: torch.Tensor) -> None:
            current: torch.Tensor = get_path(batch, path)
            new = current.clone()
            for k, value in enumerate(rows.tolist()):
                new[current.shape[0] - n + k] = value
            set_path(batch, path, new)

        bound(f.target, lengths + tails.add)
        if tails.kv is not None:
            table: torch.Tensor = get_path(batch, tails.kv.table)
            for s, x in zip(slots, lengths.tolist()):  # never a column before the row
                if not 0 <= x + tails.add - 1 < table.shape[1]:
                    raise ModelError(
                        f"{f.name}: slot {s}'s KV column is outside its row"
                    )
            bound(
                tails.kv.locations,
                torch.stack(
                    [table[s, int(x) + tails.add - 1] for s, x in zip(slots, lengths)]
                ),
            )
        if mirror is not None:
            bound(mirror, lengths + tails.add)
            if total is not None:
                set_path(batch, total, int(get_path(batch, mirror).sum()))
        if tails.prefix is not None:
            prefix: list[int] = get_path(batch, tails.prefix)
            prefixes = [int(x) + tails.add - 1 for x in lengths]
            set_path(batch, tails.prefix, list(prefix[: len(prefix) - n]) + prefixes)

    def _resolve(self, f: FieldDecl, batch: Any) -> None:
        if self._parent_absent(f, batch):
            return
        slots = [int(s) for s in get_path(batch, self._slots(f)).tolist()]
        if not slots:
            return
        value: torch.Tensor | None = None
        # A gate unset: the batch's rows do not hold the field; None, nothing read.
        if isinstance(f.gate, Carried):  # read only beside the field it names
            gated_off = not self.hands_over(f.gate.field)
        elif isinstance(f.gate, str):
            gated_off = not bool(get_path(batch, f.gate))
        else:  # a Switch: a field this map does not relay is never carried
            gated_off = False
        if not gated_off and (self.hands_over(f.name) or f.scatter is not None):
            # A scatter lays each row in whatever the latest write carried: a kept
            # optional one keeps its rows when left out.
            value = self._value(f, batch, slots)
        if f.target is not None:
            set_path(batch, f.target, value)
        if f.host is not None and f.host.mirror is not None:
            set_path(batch, f.host.mirror, None if value is None else value.clone())
        if f.host is not None and f.host.sum is not None:
            set_path(batch, f.host.sum, None if value is None else int(value.sum()))

    def _value(self, f: FieldDecl, batch: Any, slots: list[int]) -> torch.Tensor:
        """What the resolve of ``f`` hands over for ``slots``: the rows of the slots
        (gather), each placeholder ``-slot`` in the target replaced by the slot's row
        and every other value left as it is (placeholder), or the target with each
        row laid in from its start offset (scatter)."""
        if f.resolve is Resolve.GATHER:
            rows = torch.stack([self.row(f.name, slot) for slot in slots])
            # TargetShape.FLAT: the rows' dims flattened into the batch dim.
            return rows.flatten() if f.target_shape is TargetShape.FLAT else rows
        if f.scatter is not None and f.target is not None:
            # Each row's values into the flat target from the row's start offset.
            # With lengths, only each request's first lengths[i] values; with after,
            # from the end of the named field's values in the request's span.
            flat: torch.Tensor = get_path(batch, f.target).clone()
            starts = get_path(batch, f.scatter.offsets).tolist()
            # With when, the whole row where the request's flag is set, else none,
            # and its room in the span kept either way. A row laid 0 is not read.
            for request, (start, slot) in enumerate(zip(starts, slots)):
                at = start + sum(self._room(g, batch, request) for g in self._before(f))
                count = self._count(f, batch, request)
                if count:
                    row = self.row(f.name, slot).reshape(-1)
                    flat[at : at + count] = row[:count].to(flat.dtype)
            return flat
        if f.resolve is not Resolve.PLACEHOLDER or f.target is None:
            raise ModelError(f"{f.name}: the model does not know resolve={f.resolve}")
        current: torch.Tensor = get_path(batch, f.target)
        if not current.numel():
            return current.clone()
        return torch.stack(
            [
                self.row(f.name, -x).to(current.dtype)
                if x < 0
                else torch.tensor(x, dtype=current.dtype)
                for x in current.tolist()
            ]
        )

    def _before(self, f: FieldDecl) -> list[FieldDecl]:
        """The scatter fields whose values come before ``f``'s in a request's span."""
        found = []
        while f.scatter is not None and f.scatter.after is not None:
            f = self.fields[f.scatter.after]
            found.append(f)
        return found

    def _count(self, f: FieldDecl, batch: Any, request: int) -> int:
        """How many values of its row scatter field ``f`` lays in for ``request``: its
        ``lengths`` entry, none where its ``when`` flag is unset, else the whole row."""
        if f.scatter is not None and f.scatter.lengths is not None:
            return int(get_path(batch, f.scatter.lengths)[request])
        when = f.scatter.when if f.scatter is not None else None
        if when is not None and not bool(get_path(batch, when)[request]):
            return 0
        return self._width(f)

    def _room(self, f: FieldDecl, batch: Any, request: int) -> int:
        """How many positions of a request's span scatter field ``f`` takes: its
        count, or its whole row where a ``when`` flag decides whether it is laid."""
        if f.scatter is not None and f.scatter.when is not None:
            return self._width(f)
        return self._count(f, batch, request)

    def _width(self, f: FieldDecl) -> int:
        sizes = [d if isinstance(d, int) else self.dims[d] for d in f.shape]
        return math.prod(sizes)

    def _slots(self, f: FieldDecl) -> str:
        """Where the resolve of ``f`` reads its slots: a schedule field's from the
        schema's ``ScheduleSlots`` where it names them, every other from ``indices``."""
        return self.schema.slots_of(f.lane)

    def _parent_absent(self, f: FieldDecl, batch: Any) -> bool:
        """Whether ``f``'s target (or the slots) goes through an optional parent the
        batch holds as ``None``: the resolve leaves the field alone (IfNone.SKIP) or
        refuses (IfNone.REFUSE, a ModelError here: the harness never asks for it)."""
        parents = dict(self.schema.optional_parents)
        for path in (f.target, self._slots(f)):
            first = (path or "").split(".")[0]
            absent = path and "." in path and first in parents
            if absent and getattr(batch, first) is None:
                if parents[first] is IfNone.REFUSE:
                    raise ModelError(f"{f.name}: batch.{first} is None")
                return True
        return False
