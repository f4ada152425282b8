"""The per-row state table of debug mode: what each row of each field holds, apart from
its values (Note [Debug state table]).

It knows nothing of streams or messages: writes are stamped with a writer id and a
clock the caller gives (``relay.debug.clocks``), and a failing row is read back as a
``Row`` for the caller to explain.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Hashable, Mapping
from typing import NamedTuple

import torch

from relay.debug.clocks import ALWAYS_SEEN, vector

__all__ = ["BLOCKED", "Plan", "Row", "State", "StateTable", "poison"]


def poison(dtype: torch.dtype) -> float | int | bool:
    """What unconsumed rows hold in debug mode, so a stray read still looks wrong.

    NaN for floats, -1 for signed ints, the largest value for unsigned ones, ``True``
    for bool. Only a visual aid: freshness is tracked apart from the values, so a
    written NaN (or -1, inf, ``True``) is handed over like any other value.
    """
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    if dtype.is_signed:
        return -1
    return int(torch.iinfo(dtype).max)


# Note [Debug state table]
# A map's debug state is one int64 table, [F, P + 1, C]: a plane per field (ids given
# at construction; a field first named later gets its plane on first use), a row per
# slot, and the columns below. A method's check is then a fixed number of ops whatever
# its field count: one gather of the [k, B, C] block of its k fields, the compares, and
# one index_put_ of a stamp broadcast over the rows (a write) or of the consumed mark
# (a read). What stays per field is inherent: the poison fill of each buffer read.
# - READY is the clock of the row's write while the row may be read, and BLOCKED
#   (above every vector entry) once it may not: never written, consumed, omitted or
#   released. So one compare, ``seen[WRITER] >= READY``, checks freshness and
#   happens-before together; with the clocks off, ``READY < BLOCKED``. STATE (never
#   written, written, consumed, omitted) and OP (the writing method) only name the
#   cause when a check fails; WRITTEN with READY BLOCKED means released.
# - WRITER is the writer id (relay.debug.clocks.Tick), 0 for "no writer": every vector
#   holds ALWAYS_SEEN at index 0, so an unwritten row needs no clamp and no compare of
#   its own, and a write made while the clocks were off is seen by every read. CLOCK
#   keeps the write's clock after a read blocks READY: two unordered writes race even
#   when a read came between them.
# - Row 0 is the scratch row padded batches point at: its checks must always pass. It
#   keeps WRITER 0 and READY 0 for ever, because every stamp goes through ``_sink``,
#   which sends row 0 to the spare row P; the gathers read row 0 itself.
# - One reduction per call: on the CPU a failure is read back and named (field, slot,
#   operations, streams); elsewhere one device-side assert covers the call, so its
#   summary names every field of the call, not the failing one.
# - OWNED and OWNER: the request the latest write was made for, where the write said
#   (OWNED 1); a write that did not say clears them, so a stale owner never survives.
# - READER, RCLOCK and ROP: the latest read of the row (its writer id, clock and
#   method), stamped only for fields a ``seed`` writes (a seed must be ordered after a
#   read still in flight, Note [Seeds in debug mode] in checks.py); a write keeps them.
# - A field whose never-written rows read as zeros (``initial_zeros``) may be read while
#   its row is EMPTY: the read neither consumes nor poisons such a row, so it reads zeros
#   again. Once written, the row is consumed once and released like any other.


class State(enum.IntEnum):
    """Per-row state of one field (column STATE), kept apart from the values."""

    EMPTY = 0  # never written
    WRITTEN = 1  # written and not read yet (or released, when READY is BLOCKED)
    CONSUMED = 2  # read since its last write
    OMITTED = 3  # the latest stash left this optional field out


# The columns of the state table.
_STATE, _WRITER, _CLOCK, _READY, _OP, _OWNED, _OWNER, _READER, _RCLOCK, _ROP = range(10)
_COLUMNS = 10
#: The columns a write stamps (the latest read's columns survive it).
_WRITTEN_COLUMNS = 7
#: READY of a row that no read may take: above every entry of every vector.
BLOCKED = ALWAYS_SEEN + 1


class Row(NamedTuple):
    """One row of one field, read back to explain a failed check."""

    state: State
    writer: int  # writer id of its latest write (0: none, or written with clocks off)
    clock: int  # the writer's clock at that write
    ready: int  # BLOCKED when no read may take it
    op: str  # the method that wrote it ("?" when never written)
    owner: int | None  # the request the latest write was made for, where it said
    reader: int  # writer id of the stream of its latest read (0: none recorded)
    read_clock: int  # that stream's clock at the read
    read_op: str  # the method that read it ("?" when none recorded)

    @property
    def released(self) -> bool:
        """Written, then released before any read took it."""
        return self.state is State.WRITTEN and self.ready == BLOCKED


class Plan:
    """The constants of one method's report of one set of fields, made on first use."""

    __slots__ = (
        "_fields",
        "_planes",
        "_reads",
        "_stamps",
        "_tick",
        "_zeros",
        "names",
        "op",
    )

    def __init__(
        self,
        names: tuple[str, ...],
        planes: torch.Tensor,
        zeros: torch.Tensor | None,
        op: int,
    ) -> None:
        #: The fields the report covers, in the order of the block's planes.
        self.names = names
        #: The id of the method that reports.
        self.op = op
        self._planes = planes  # the fields' planes, as a column [k, 1]
        self._fields = planes.unsqueeze(2)  # the same as [k, 1, 1], for single columns
        # [k, 1]: which of the fields read as zeros before their first write (None: none).
        self._zeros = zeros
        # A read's consumed mark [k, 1, 5] per reader id (STATE, READY, READER, RCLOCK,
        # ROP), for plans with a field a seed writes; None for the others.
        self._reads: dict[int, torch.Tensor] | None = None
        # A write's stamp [k, 1, C] per writer id (0: no writer), CLOCK and READY 0;
        # a write by a real writer adds ``_tick`` times its clock.
        self._stamps: dict[int, torch.Tensor] = {}
        self._tick: torch.Tensor | None = None


class StateTable:
    """The state of every row of every field of one map (Note [Debug state table])."""

    def __init__(
        self,
        device: torch.device,
        pool_size: int,
        fields: tuple[str, ...],
        *,
        initial_zeros: tuple[str, ...] = (),
        seeds: tuple[str, ...] = (),
    ) -> None:
        self.device = device
        self.pool_size = pool_size
        #: Fields whose never-written rows read as zeros.
        self.initial_zeros = frozenset(initial_zeros)
        #: Fields a ``seed`` writes: their reads record the reader.
        self.seeds = frozenset(seeds)
        self._ids = {field: i for i, field in enumerate(dict.fromkeys(fields))}
        self._table = self._planes(len(self._ids))
        self._create = threading.Lock()
        self._ops: list[str] = ["?"]
        self._writes: dict[Hashable, Plan] = {}
        self._reads: dict[Hashable, Plan] = {}
        self._all: tuple[int, torch.Tensor] | None = None
        self._sink = torch.arange(pool_size, dtype=torch.int64, device=device)
        self._sink[0] = pool_size
        self._written_columns = torch.arange(_WRITTEN_COLUMNS, device=device)
        self._owner_columns = torch.tensor([_OWNED, _OWNER], device=device)
        self._consumed_columns = torch.tensor([_STATE, _READY], device=device)
        self._consumed = torch.tensor([int(State.CONSUMED), BLOCKED], device=device)
        self._read_columns = torch.tensor(
            [_STATE, _READY, _READER, _RCLOCK, _ROP], device=device
        )
        self._read_tick = torch.tensor([0, 0, 0, 1, 0], device=device)
        self._ready_column = torch.tensor(_READY, device=device)
        self._blocked = torch.tensor(BLOCKED, device=device)
        self._row0 = torch.tensor(0, device=device)
        self._spare = torch.tensor(pool_size, device=device)

    # -- plans -------------------------------------------------------------------------
    def _planes(self, count: int) -> torch.Tensor:
        """``count`` fresh planes: nothing written; row 0 readable."""
        planes = torch.zeros(
            (count, self.pool_size + 1, _COLUMNS), dtype=torch.int64, device=self.device
        )
        planes[:, 1:, _READY] = BLOCKED
        return planes

    def _field(self, field: str) -> int:
        """The plane of ``field``; a field the constructor did not name gets one now."""
        plane = self._ids.get(field)
        if plane is None:
            with self._create:
                plane = self._ids.get(field)
                if plane is None:
                    self._table = torch.cat((self._table, self._planes(1)))
                    plane = self._ids[field] = len(self._ids)
        return plane

    def _plan(self, names: tuple[str, ...], op: str) -> Plan:
        planes = [self._field(name) for name in names]
        zeros = None
        if any(name in self.initial_zeros for name in names):
            flags = [int(name in self.initial_zeros) for name in names]
            zeros = vector(flags, self.device).bool().unsqueeze(1)
        plan = Plan(
            names, vector(planes, self.device).unsqueeze(1), zeros, self._op(op)
        )
        if any(name in self.seeds for name in names):
            plan._reads = {}
        return plan

    def _op(self, op: str) -> int:
        try:
            return self._ops.index(op)
        except ValueError:
            self._ops.append(op)
            return len(self._ops) - 1

    def write_plan(
        self, op: str, fields: tuple[str, ...], carried: Mapping[str, bool] | None
    ) -> Plan:
        """The plan of ``op`` writing ``fields``; ``carried`` says for each optional
        one whether the call carried it (one left out is stamped omitted)."""
        key = (op, fields) if carried is None else (op, fields, *carried.values())
        plan = self._writes.get(key)
        if plan is None:
            plan = self._writes[key] = self._new_write_plan(op, fields, carried)
        return plan

    def _new_write_plan(
        self, op: str, fields: tuple[str, ...], carried: Mapping[str, bool] | None
    ) -> Plan:
        plan = self._plan(fields, op)
        written = [carried is None or carried.get(f, True) for f in fields]
        shape = (len(fields), 1, _WRITTEN_COLUMNS)
        ticks = [[0, 0, 1, int(w), 0, 0, 0] for w in written]
        plan._tick = vector([v for t in ticks for v in t], self.device).reshape(shape)
        op_id = plan.op
        stamps = [
            [State.WRITTEN, 0, 0, 0, op_id, 0, 0]
            if w
            else [State.OMITTED, 0, 0, BLOCKED, op_id, 0, 0]
            for w in written
        ]
        flat = [int(v) for t in stamps for v in t]
        plan._stamps[0] = vector(flat, self.device).reshape(shape)
        return plan

    def read_plan(
        self, op: str, fields: tuple[str, ...], carried: Mapping[str, bool] | None
    ) -> Plan:
        """The plan of ``op`` reading ``fields``, less the optional ones ``carried``
        says the call did not read."""
        key = (op, fields) if carried is None else (op, fields, *carried.values())
        plan = self._reads.get(key)
        if plan is None:
            read = tuple(f for f in fields if carried is None or carried.get(f, True))
            plan = self._reads[key] = self._plan(read, op)
        return plan

    # -- checks --------------------------------------------------------------------------
    def block(self, plan: Plan, rows: torch.Tensor) -> torch.Tensor:
        """The state of ``rows`` of the plan's fields, ``[k, len(rows), C]``."""
        return self._table[plan._planes, rows]

    @staticmethod
    def writes_ordered(block: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """Per row: whether a writer that has ``seen`` is ordered after the row's write."""
        return seen.take(block[..., _WRITER]) >= block[..., _CLOCK]

    @staticmethod
    def reads_ordered(block: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """Per row: whether a writer that has ``seen`` is ordered after the row's latest
        recorded read (a row with none recorded passes)."""
        return seen.take(block[..., _READER]) >= block[..., _RCLOCK]

    @staticmethod
    def readable(block: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
        """Per row: whether a reader may take it (fresh and, given what the reader has
        ``seen``, ordered after its write; ``None``: the clocks are off)."""
        if seen is None:
            return block[..., _READY] < BLOCKED
        return seen.take(block[..., _WRITER]) >= block[..., _READY]

    @staticmethod
    def never_written_zeros(plan: Plan, block: torch.Tensor) -> torch.Tensor | None:
        """Per row: a never-written row of a field that reads as zeros until its first
        write (``None``: the plan has no such field)."""
        if plan._zeros is None:
            return None
        return (block[..., _STATE] == State.EMPTY) & plan._zeros

    @staticmethod
    def owners_match(block: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """Per row: the read's owner (``owners``, one per row) is the one the latest
        write was made for, or that write did not say."""
        return (block[..., _OWNED] == 0) | (block[..., _OWNER] == owners)

    @staticmethod
    def unread_of_others(block: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """Per row: a value no read has taken and no release ended (readable, clocks
        on or off), which the latest write made for another request than ``owners``."""
        return (
            (block[..., _READY] < BLOCKED)
            & (block[..., _OWNED] != 0)
            & (block[..., _OWNER] != owners)
        )

    def taken_only(self, rows: torch.Tensor, taken: torch.Tensor) -> torch.Tensor:
        """``rows`` with the positions ``taken`` leaves out sent to row 0, whose checks
        pass (no host sync to drop them)."""
        return torch.where(taken.reshape(-1), rows, self._row0)

    def row(self, block: torch.Tensor, field: int, position: int) -> Row:
        """Row ``position`` of field ``field`` (its index in the plan) of ``block``."""
        values = [int(v) for v in block[field, position]]
        state, writer, clock, ready, op, owned, owner, reader, read_clock, read_op = (
            values
        )
        return Row(
            State(state),
            writer,
            clock,
            ready,
            self._ops[op],
            owner if owned else None,
            reader,
            read_clock,
            self._ops[read_op],
        )

    # -- updates -------------------------------------------------------------------------
    def stamp(
        self,
        plan: Plan,
        rows: torch.Tensor,
        writer: int,
        clock: int,
        owners: torch.Tensor | None = None,
    ) -> None:
        """``rows`` of the plan's fields were written by ``writer`` at ``clock`` (writer
        0: the clocks are off), for the requests ``owners`` (one per row) if given."""
        stamp = plan._stamps.get(writer)
        if stamp is None:
            stamp = plan._stamps[0].clone()
            stamp[:, :, _WRITER] = writer
            plan._stamps[writer] = stamp
        if writer:
            assert plan._tick is not None
            stamp = torch.add(stamp, plan._tick, alpha=clock)
        sunk = self._sink[rows].unsqueeze(1)
        self._table.index_put_((plan._fields, sunk, self._written_columns), stamp)
        if owners is not None:
            owned = torch.stack((torch.ones_like(owners), owners), dim=1)
            self._table.index_put_((plan._fields, sunk, self._owner_columns), owned)

    def consume(
        self,
        plan: Plan,
        rows: torch.Tensor,
        keep: torch.Tensor | None,
        reader: int,
        clock: int,
    ) -> None:
        """``rows`` of the plan's fields were read by ``reader`` at ``clock``: no read may
        take them again. Rows ``keep`` marks (never written, reading as zeros) stay as
        they are; the reader is recorded where a seed writes the field."""
        sunk = self._sink[rows]
        if keep is not None:
            sunk = torch.where(keep, self._spare, sunk)
        target = (plan._fields, sunk.unsqueeze(-1))
        if plan._reads is None:
            self._table.index_put_((*target, self._consumed_columns), self._consumed)
            return
        mark = plan._reads.get(reader)
        if mark is None:
            mark = plan._reads[reader] = vector(
                [int(State.CONSUMED), BLOCKED, reader, 0, plan.op], self.device
            )
        if reader:
            mark = torch.add(mark, self._read_tick, alpha=clock)
        self._table.index_put_((*target, self._read_columns), mark)

    def release(self, rows: torch.Tensor) -> None:
        """The requests in ``rows`` ended: no read may take their unread values (READY
        blocked, STATE kept)."""
        everything = self._all
        if everything is None or everything[0] != len(self._ids):
            planes = torch.arange(len(self._ids), device=self.device).unsqueeze(1)
            everything = self._all = (len(self._ids), planes)
        self._table.index_put_(
            (everything[1], self._sink[rows], self._ready_column), self._blocked
        )
