"""``DebugChecks``: one map's debug mode, composed of the state table
(``relay.debug.state``), the happens-before clocks (``relay.debug.clocks``) and the
messages (``relay.debug.messages``). The contract with the generated code is in the
package's docstring (``relay/debug/__init__.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from relay.debug.clocks import FenceRecord, HappensBefore, clocks
from relay.debug.messages import text
from relay.debug.state import Row, State, StateTable, poison
from relay.device import CpuPolicy, policy_for
from relay.errors import RelayDebugError

__all__ = ["DebugCheckFailed", "DebugChecks", "check_resolved"]


class DebugCheckFailed(RelayDebugError, RuntimeError):
    """A debug check on slots or rows failed (on the CPU, where the check names the slot).

    Also a ``RuntimeError``: on other devices the same check is a device-side assert,
    which surfaces as a ``RuntimeError``, so one ``except`` covers both.
    """


def check_resolved(
    value: torch.Tensor, consumer: str, *, name_failures: bool | None = None
) -> None:
    """Debug aid for an engine's host consumers of a placeholder target (``input_ids``
    read by a repetition penalty, say): ``value`` must hold no placeholder ``-slot``.

    A placeholder is replaced on the forward stream by the resolve; host code that reads
    the target between ``invalidate`` and that resolve sees ``-slot`` instead of a token
    (vLLM #27878). Call it where the host reads the target, in debug runs.

    ``name_failures``: read a failure back and name the position (default: on the
    CPU, where that costs no sync); else a device-side assert with the summary.
    """
    if value.numel() == 0:
        return
    pending = value.reshape(-1) < 0
    if name_failures is None:
        name_failures = value.device.type == "cpu"
    if not name_failures:
        torch._assert_async(
            ~pending.any(), text("placeholder_summary", consumer=consumer)
        )
        return
    if bool(pending.any()):
        position = int(pending.nonzero()[0, 0])
        placeholder = int(value.reshape(-1)[position])
        raise RelayDebugError(
            text(
                "placeholder",
                consumer=consumer,
                position=position,
                placeholder=placeholder,
                slot=-placeholder,
            )
        )


class DebugChecks:
    """Debug-mode bookkeeping of one map: the calls the generated code makes.

    ``forward`` and ``schedule`` name the fields of each lane; ``consumers`` the
    schedule-side resolves, each of which must follow a fresh publish. The order checks
    run while the happens-before clocks are installed (``relay.debug.happens_before``);
    building a map does not install them.
    """

    def __init__(
        self,
        device: torch.device,
        pool_size: int,
        owner: str,
        *,
        forward: tuple[str, ...] = (),
        schedule: tuple[str, ...] = (),
        consumers: tuple[str, ...] = (),
    ) -> None:
        self.device = torch.device(device)
        self.pool_size = pool_size
        self.owner = owner
        self.state = StateTable(self.device, pool_size, forward + schedule)
        self.clocks: HappensBefore = clocks  # the process's: streams are process-wide
        #: Name the failing slot by reading it back (True on the CPU, where that costs
        #: no sync); elsewhere a device-side assert carries the call's summary.
        self.name_failures = self.device.type == "cpu"
        self._policy = policy_for(self.device)
        self._consumers = consumers
        self._fresh: set[str] = set()
        # check_slots: sorted slots between these two edges must rise strictly.
        self._edges = {
            scratch_ok: (
                torch.tensor([-1 if scratch_ok else 0], device=self.device),
                torch.tensor([pool_size], device=self.device),
            )
            for scratch_ok in (True, False)
        }
        # Note [Happens-before in debug mode]: CpuEvents report themselves.
        self._model_fence = not isinstance(self._policy, CpuPolicy)
        self._fence: FenceRecord | None = None

    # -- helpers -------------------------------------------------------------------
    def _slots(self, op: str, indices: torch.Tensor) -> torch.Tensor:
        dtype = indices.dtype
        if dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
            raise RelayDebugError(
                text("indices_dtype", owner=self.owner, op=op, dtype=dtype)
            )
        return indices.reshape(-1).long()

    def _require(
        self, ok: torch.Tensor, summary: Callable[[], str], detail: Callable[[int], str]
    ) -> None:
        """Every element of ``ok`` must hold. Where failures are named, name the first
        failing element (its flat index) with ``detail``; elsewhere assert on the device
        with ``summary``."""
        if self.name_failures:
            if not ok.all().item():
                first = int((~ok).reshape(-1).nonzero()[0, 0])
                raise DebugCheckFailed(detail(first))
        else:
            torch._assert_async(ok.all(), summary())

    def _stream(self) -> Any:
        return self._policy.current_stream()

    # -- the contract --------------------------------------------------------------
    def check_slots(
        self, op: str, indices: torch.Tensor, *, scratch_ok: bool = True
    ) -> None:
        """Before anything is written: every slot in range (row 0 only if ``scratch_ok``),
        and no slot twice (row 0 may repeat where it is allowed: padding)."""
        rows = self._slots(op, indices)
        if rows.numel() == 0:
            return
        # Sorted between the edges (low - 1 and pool_size) the slots rise strictly: in
        # range and no repeat, in one compare; padding may repeat row 0.
        below, above = self._edges[scratch_ok]
        edges = torch.cat((below, rows.sort().values, above))
        after = edges[1:]
        ok = after > edges[:-1]
        if scratch_ok:
            ok |= after == 0
        suffix = "" if scratch_ok else "_no_scratch"
        where = {"owner": self.owner, "op": op, "pool": self.pool_size}
        self._require(
            ok,
            lambda: text("slots" + suffix + "_summary", **where),
            lambda _: self._slot_problem(rows, scratch_ok, where),
        )

    def _slot_problem(
        self, rows: torch.Tensor, scratch_ok: bool, where: dict[str, Any]
    ) -> str:
        low = 0 if scratch_ok else 1
        outside = ((rows < low) | (rows >= self.pool_size)).nonzero()
        if outside.numel():
            i = int(outside[0, 0])
            key = "slot_outside" if scratch_ok else "slot_outside_no_scratch"
            return text(key, slot=int(rows[i]), position=i, **where)
        ordered = rows.sort().values
        repeated = (ordered[1:] == ordered[:-1]) & (ordered[1:] != 0)
        return text("slot_twice", slot=int(ordered[1:][repeated][0]), **where)

    def wrote(
        self,
        op: str,
        indices: torch.Tensor,
        fields: tuple[str, ...],
        *,
        carried: Mapping[str, bool] | None = None,
    ) -> None:
        """``op`` wrote rows ``indices`` of ``fields`` on the current stream. ``carried``
        says, for each optional field among them, whether this call carried it: one left
        out is marked omitted (Note [Optional fields]). Two unordered writes of one row
        are reported."""
        rows = self._slots(op, indices)
        if rows.numel() == 0:
            return
        plan = self.state.write_plan(op, fields, carried)
        if not self.clocks.enabled:
            self.state.stamp(plan, rows, 0, 0)
            return
        tick = self.clocks.tick(self._stream(), self.device)
        # Two writes of one row must be ordered, or which one a read sees is timing.
        block = self.state.block(plan, rows)
        stream = self.clocks.writer_name(tick.writer)

        def unordered(first: int) -> str:
            j, i = divmod(first, rows.numel())
            row = self.state.row(block, j, i)
            return text(
                "unordered_write",
                owner=self.owner,
                field=fields[j],
                slot=int(rows[i]),
                op=op,
                stream=stream,
                writer_op=row.op,
                writer_stream=self.clocks.writer_name(row.writer),
            )

        self._require(
            self.state.writes_ordered(block, tick.seen),
            lambda: text(
                "write_summary",
                owner=self.owner,
                fields=", ".join(fields),
                op=op,
                stream=stream,
            ),
            unordered,
        )
        self.state.stamp(plan, rows, tick.writer, tick.clock)

    def read(
        self,
        op: str,
        rows: torch.Tensor,
        buffers: Mapping[str, torch.Tensor | None],
        *,
        carried: Mapping[str, bool] | None = None,
        taken: torch.Tensor | None = None,
    ) -> None:
        """``op`` gathered rows ``rows`` of the fields in ``buffers`` (field name ->
        buffer); ``carried`` says, for optional ones among them, whether the call read
        them (it did not where the latest write left the field out); ``taken`` masks
        the positions really read. Check each row was written for this request, not
        read since, and that the read is ordered after its write; then mark them
        consumed and poison them."""
        rows = self._slots(op, rows)
        if rows.numel() == 0:
            return
        plan = self.state.read_plan(op, tuple(buffers), carried)
        names = plan.names
        if not names:
            return
        if taken is not None:
            rows = self.state.taken_only(rows, taken)
        block = self.state.block(plan, rows)
        if self.clocks.enabled:
            tick = self.clocks.tick(self._stream(), self.device)
            stream = self.clocks.writer_name(tick.writer)
            ok = self.state.readable(block, tick.seen)
        else:
            stream = "its stream"
            ok = self.state.readable(block, None)

        def problem(first: int) -> str:
            j, i = divmod(first, rows.numel())
            return self._read_problem(
                op, names[j], int(rows[i]), stream, self.state.row(block, j, i)
            )

        self._require(
            ok,
            lambda: text(
                "read_summary",
                owner=self.owner,
                fields=", ".join(names),
                op=op,
                stream=stream,
            ),
            problem,
        )
        self.state.consume(plan, rows)
        for name in names:
            buf = buffers[name]
            if buf is not None:
                buf.index_fill_(0, rows, poison(buf.dtype))

    def _read_problem(
        self, op: str, field: str, slot: int, stream: str, row: Row
    ) -> str:
        """Why a read of ``row`` (``field``, ``slot``) may not take it."""
        where = {"owner": self.owner, "field": field, "slot": slot, "op": op}
        if row.state is State.EMPTY:
            return text("never_written", **where)
        if row.state is State.CONSUMED:
            return text("consumed", **where)
        if row.state is State.OMITTED:
            return text("omitted", **where)
        if row.released:
            return text("released", writer_op=row.op, **where)
        return text(
            "unordered_read",
            stream=stream,
            writer_op=row.op,
            writer_stream=self.clocks.writer_name(row.writer),
            **where,
        )

    def publishing(self) -> None:
        """``publish`` is about to record the fence (before: the record may wake a waiter)."""
        self._fresh = set(self._consumers)
        if self._model_fence and self.clocks.enabled:
            self._fence = self.clocks.record_fence(self._stream(), self._fence)

    def waited(self, consumer: str) -> None:
        """``consumer`` waited on the fence: a publish must have come since its last wait."""
        if consumer not in self._fresh:
            raise RelayDebugError(text("stale_fence", owner=self.owner, op=consumer))
        self._fresh.discard(consumer)
        if self._model_fence and self.clocks.enabled and self._fence is not None:
            self.clocks.join(self._stream(), self._fence.clock)

    def release(self, indices: torch.Tensor) -> None:
        """The requests in slots ``indices`` ended: their unread values are stale (READY
        blocked, STATE kept: Note [Debug state table])."""
        rows = self._slots("release", indices)
        if rows.numel() == 0:
            return
        self.state.release(rows)
