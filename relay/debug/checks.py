"""``DebugChecks``: one map's debug mode, composed of the state table
(``relay.debug.state``), the happens-before clocks (``relay.debug.clocks``) and the
messages (``relay.debug.messages``). The contract with the generated code is in the
package's docstring (``relay/debug/__init__.py``)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

import torch

from relay import cpu_stream
from relay.debug.clocks import FenceRecord, HappensBefore, Tick, clocks
from relay.debug.messages import request_at, text
from relay.debug.owners import Owners, Requests
from relay.debug.state import Plan, Row, State, StateTable, poison
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
    (placeholders reached vLLM's repetition penalties that way). Call it where the host
    reads the target, in debug runs.

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


# Note [Seeds in debug mode]
# A seed writes a forward-lane row from the scheduler (a prebuilt request's first token
# into its reused pool row). A forward of the row's previous request may still be in
# flight: its read of the row and its stash into it must both happen before the seed,
# or the stash lands on the seeded request's row. So a seed is checked against the
# row's latest write and, for the fields a seed writes (``seeds``), its latest read,
# whose reader those fields' reads record; and a write that finds a seed it is not
# ordered after is the same mistake seen from the other side. Both are reported as
# ``unordered_seed``. A map's own ``seed`` is written in the first forward launched
# after it, on the forward stream, behind the previous forward's read and stash (Note
# [Seeds] in relay/runtime.py); these checks catch a seed written any other way.


_P = ParamSpec("_P")
_R = TypeVar("_R")

# Note [Checks and stamps are atomic]
# A check reads a row's state and the stamp after it writes it. Two streams' operations
# on one row (a forward's stash on the worker, a host write the engine forgot to order)
# may run at the same moment; if both read before either stamps, each passes and the
# race goes unreported, on some runs only. Each map's checks and stamps therefore run
# under one lock: whichever comes second sees the first, in either order. Each report
# is also a switch point of a seeded schedule (Note [Seeded schedules] in
# relay/cpu_stream.py), taken before the lock: a participant never hands the baton
# on while it holds a lock another may need.


def _atomic(
    method: Callable[Concatenate[DebugChecks, _P], _R],
) -> Callable[Concatenate[DebugChecks, _P], _R]:
    """``method`` checks and stamps under the map's lock (Note [Checks and stamps
    are atomic])."""

    @functools.wraps(method)
    def locked(self: DebugChecks, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        cpu_stream.switch_point()
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class DebugChecks:
    """Debug-mode bookkeeping of one map: the calls the generated code makes.

    ``forward`` and ``schedule`` name the fields of each lane; ``consumers`` the
    schedule-side resolves, each of which must follow a fresh publish;
    ``initial_zeros`` the fields whose never-written rows read as zeros (a read of such
    a row is legal, and neither consumes nor poisons it); ``seeds`` the fields a
    ``seed`` writes (Note [Seeds in debug mode]). The order checks run while the
    happens-before clocks are installed (``relay.debug.happens_before``); building a
    map does not install them.
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
        initial_zeros: tuple[str, ...] = (),
        seeds: tuple[str, ...] = (),
        graph_written: tuple[str, ...] = (),
    ) -> None:
        self.device = torch.device(device)
        #: Fields a captured graph may write (``graph_wrote``). Once a graph writes
        #: rows of the map (a write left such a field to it, or ``graph_wrote``
        #: declared its write), a read finding nothing to take there is named as a
        #: read before the graph ran; until then every write was the map's own call
        #: (an engine that runs no graph), and the read is named as any other.
        self.graph_written = frozenset(graph_written)
        self.graph_writes = False
        self._lane_of = {
            "stash": forward,
            "stash_partial": forward,
            "publish": schedule,
        }
        self.pool_size = pool_size
        self.owner = owner
        self.state = StateTable(
            self.device,
            pool_size,
            forward + schedule,
            initial_zeros=initial_zeros,
            seeds=seeds,
        )
        self.clocks: HappensBefore = clocks  # the process's: streams are process-wide
        #: Name the failing slot by reading it back (True on the CPU, where that costs
        #: no sync); elsewhere a device-side assert carries the call's summary.
        self.name_failures = self.device.type == "cpu"
        self._policy = policy_for(self.device)
        self._consumers = consumers
        self._fresh: set[str] = set()
        self._requests = Requests(self.device)
        self._seed_ops: set[str] = set()
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
        self._lock = threading.Lock()

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
            # CUDA's device assert takes a message of under 255 bytes.
            torch._assert_async(ok.all(), _device_message(summary()))

    def _stream(self) -> Any:
        return self._policy.current_stream()

    def _tick(self) -> tuple[Tick | None, str]:
        """The calling stream's operation and its name, while the clocks are on."""
        if not self.clocks.enabled:
            return None, "its stream"
        tick = self.clocks.tick(self._stream(), self.device)
        return tick, self.clocks.writer_name(tick.writer)

    # -- the contract --------------------------------------------------------------
    def check_slots(
        self, op: str, indices: torch.Tensor, *, scratch_ok: bool = True
    ) -> None:
        """Before anything is written: every slot in range (row 0 only if ``scratch_ok``),
        and no slot twice (row 0 may repeat where it is allowed: padding)."""
        cpu_stream.switch_point()  # a relay call begins
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

    def check_scatter(
        self,
        field: str,
        indices: torch.Tensor,
        starts: torch.Tensor,
        width: int | torch.Tensor,
        size: int,
        owners: Owners | None = None,
    ) -> None:
        """Before a scatter: every request's ``width`` positions from its start lie in
        the target's ``size``, and no two requests' positions overlap (Note [Scatter
        destinations] in relay/runtime.py). ``width`` may be one per request (Note
        [Counted scatters]). ``owners`` names the batch's requests in messages."""
        n = starts.numel()
        if n == 0:
            return
        order = starts.argsort()
        ordered = starts[order]
        ends = ordered + (width if isinstance(width, int) else width[order])
        ok = (ordered >= 0) & (ends <= size)
        ok[1:] &= ordered[1:] >= ends[:-1]
        where = {"owner": self.owner, "field": field}

        def wide(j: int) -> int:
            return width if isinstance(width, int) else int(width[j])

        def problem(first: int) -> str:
            j = int(order[first])
            at = int(starts[j])
            slot = int(indices.reshape(-1)[j])
            if at < 0 or at + wide(j) > size:
                return text(
                    "scatter_outside",
                    request=request_at(j, slot, owners),
                    start=at,
                    width=wide(j),
                    size=size,
                    **where,
                )
            k = int(order[first - 1])
            return text(
                "scatter_overlap",
                request=request_at(j, slot, owners),
                start=at,
                other=request_at(k, int(indices.reshape(-1)[k]), owners),
                other_start=int(starts[k]),
                width=wide(k),
                **where,
            )

        self._require(ok, lambda: text("scatter_summary", **where), problem)

    def check_counts(
        self,
        field: str,
        indices: torch.Tensor,
        counts: torch.Tensor,
        width: int,
        produced: torch.Tensor | None = None,
        owners: Owners | None = None,
    ) -> None:
        """A counted scatter's counts (Note [Counted scatters] in relay/runtime.py):
        each in ``[0, width]``, and, where ``produced`` holds what each slot's stash
        carried, no more than that (a consumer reading values no producer wrote).
        ``owners`` names the requests in messages."""
        slots = indices.reshape(-1).long()
        ok = (counts >= 0) & (counts <= width)
        wrote = None
        if produced is not None:
            wrote = produced.index_select(0, slots.to(produced.device))
            ok &= counts <= wrote.to(counts.device)
        where = {"owner": self.owner, "field": field}

        def problem(j: int) -> str:
            count = int(counts[j])
            slot = int(slots[j])
            if not 0 <= count <= width or wrote is None:
                return text(
                    "scatter_count_outside",
                    request=request_at(j, slot, owners),
                    count=count,
                    width=width,
                    **where,
                )
            return text(
                "scatter_count_disagrees",
                request=request_at(j, slot, owners),
                count=count,
                wrote=int(wrote[j]),
                **where,
            )

        self._require(ok, lambda: text("scatter_count_summary", **where), problem)

    def check_claimed(
        self,
        field: str,
        indices: torch.Tensor,
        at: torch.Tensor,
        keep: torch.Tensor,
        target: torch.Tensor,
        owners: Owners | None = None,
    ) -> None:
        """Before a scatter into a non-negative field's target, its ranges checked:
        every position ``at`` (one row per request) where ``keep`` holds a negative
        placeholder, not a value another request's span already holds (Note [Scatter
        destinations] in relay/runtime.py)."""
        flat = target.reshape(-1)
        if flat.numel() == 0 or at.numel() == 0:
            return
        held = flat.index_select(0, torch.where(keep, at, 0).reshape(-1)).view_as(at)
        ok = (held < 0) | ~keep
        where = {"owner": self.owner, "field": field}

        def problem(first: int) -> str:
            j, column = divmod(first, at.shape[1])
            slot = int(indices.reshape(-1)[j])
            return text(
                "scatter_claimed",
                request=request_at(j, slot, owners),
                position=int(at[j, column]),
                value=int(held[j, column]),
                **where,
            )

        self._require(ok, lambda: text("scatter_claimed_summary", **where), problem)

    def check_scattered(self, field: str, target: torch.Tensor) -> None:
        """After a scatter into a non-negative field's target: no position still holds
        a negative placeholder that no request's row covered."""
        flat = target.reshape(-1)
        where = {"owner": self.owner, "field": field}
        self._require(
            flat >= 0,
            lambda: text("scatter_leftover_summary", **where),
            lambda first: text(
                "scatter_leftover",
                position=first,
                value=int(flat[first]),
                **where,
            ),
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
        owners: Owners | None = None,
    ) -> None:
        """``op`` wrote rows ``indices`` of ``fields`` on the current stream. ``carried``
        says, for each optional field among them, whether this call carried it: one left
        out is marked omitted (Note [Optional fields]). ``owners`` (one request id per
        row: an int tensor, or a sequence of ints or strings) records whose value each
        row now holds, for ``read(..., owners=...)``. Two unordered writes of one row
        are reported (``unordered_seed`` where one of them is a seed)."""
        left = self.graph_written.intersection(self._lane_of.get(op, ())) - set(fields)
        self.graph_writes = self.graph_writes or op == "graph_wrote" or bool(left)
        self._write(op, indices, fields, carried, owners, seed=False)

    def seeded(
        self,
        indices: torch.Tensor,
        fields: tuple[str, ...],
        *,
        op: str = "seed",
        carried: Mapping[str, bool] | None = None,
        owners: Owners | None = None,
    ) -> None:
        """``op`` (a seed from the scheduler) wrote rows ``indices`` of forward-lane
        ``fields`` on the current stream: like ``wrote``, and the seed must be ordered
        after the rows' latest write and their latest read (Note [Seeds in debug
        mode]), or ``unordered_seed`` is reported."""
        self._seed_ops.add(op)
        self._write(op, indices, fields, carried, owners, seed=True)

    @_atomic
    def _write(
        self,
        op: str,
        indices: torch.Tensor,
        fields: tuple[str, ...],
        carried: Mapping[str, bool] | None,
        owners: Owners | None,
        *,
        seed: bool,
    ) -> None:
        rows = self._slots(op, indices)
        if rows.numel() == 0:
            return
        requests = None
        if owners is not None:
            requests = self._requests.ids(self._where(op), owners, rows.numel())
        plan = self.state.write_plan(op, fields, carried)
        if seed and requests is not None:
            self._seed_keeps_live_values(op, rows, fields, plan, requests)
        tick, stream = self._tick()
        if tick is None:
            self.state.stamp(plan, rows, 0, 0, requests)
            return
        # Two writes of one row must be ordered, or which one a read sees is timing.
        block = self.state.block(plan, rows)
        ok = self.state.writes_ordered(block, tick.seen)
        if seed:
            ok = ok & self.state.reads_ordered(block, tick.seen)

        def unordered(first: int) -> str:
            j, i = divmod(first, rows.numel())
            row = self.state.row(block, j, i)
            where = {"owner": self.owner, "field": fields[j], "slot": int(rows[i])}
            return self._write_problem(op, stream, row, where, tick.seen, seed=seed)

        key = "unordered_seed_summary" if seed else "write_summary"
        fields_text = ", ".join(fields)
        self._require(
            ok,
            lambda: text(
                key, owner=self.owner, fields=fields_text, op=op, stream=stream
            ),
            unordered,
        )
        self.state.stamp(plan, rows, tick.writer, tick.clock, requests)

    def _seed_keeps_live_values(
        self,
        op: str,
        rows: torch.Tensor,
        fields: tuple[str, ...],
        plan: Plan,
        requests: torch.Tensor,
    ) -> None:
        """A seed for a request must not land on a value another request has not read
        yet and whose slot was never released: that request still holds the row."""
        block = self.state.block(plan, rows)
        lost = self.state.unread_of_others(block, requests)

        def problem(first: int) -> str:
            j, i = divmod(first, rows.numel())
            row = self.state.row(block, j, i)
            return text(
                "seed_over_unread",
                owner=self.owner,
                field=fields[j],
                slot=int(rows[i]),
                op=op,
                request=self._requests.name(int(requests[i])),
                writer_op=row.op,
                other=self._requests.name(row.owner or 0),
            )

        fields_text = ", ".join(fields)
        self._require(
            lost.logical_not(),
            lambda: text(
                "seed_over_unread_summary", owner=self.owner, fields=fields_text, op=op
            ),
            problem,
        )

    def _where(self, op: str) -> str:
        return f"{self.owner}.{op}"

    def _write_problem(
        self,
        op: str,
        stream: str,
        row: Row,
        where: dict[str, Any],
        seen: torch.Tensor,
        *,
        seed: bool,
    ) -> str:
        """Why a write (``seed``: a seed) of ``row`` is not ordered after what came
        before it: its latest write, or (a seed) its latest read."""
        writer_seen = int(seen[row.writer]) >= row.clock
        other_op, other = (
            (row.op, row.writer) if not writer_seen else (row.read_op, row.reader)
        )
        other_stream = self.clocks.writer_name(other)
        if seed or other_op in self._seed_ops:
            return text(
                "unordered_seed",
                op=op,
                stream=stream,
                other_op=other_op,
                other_stream=other_stream,
                **where,
            )
        return text(
            "unordered_write",
            op=op,
            stream=stream,
            writer_op=other_op,
            writer_stream=other_stream,
            **where,
        )

    @_atomic
    def read(
        self,
        op: str,
        rows: torch.Tensor,
        buffers: Mapping[str, torch.Tensor | None],
        *,
        carried: Mapping[str, bool] | None = None,
        taken: torch.Tensor | None = None,
        owners: Owners | None = None,
        distinct: bool = False,
    ) -> None:
        """``op`` gathered rows ``rows`` of the fields in ``buffers`` (field name ->
        buffer); ``carried`` says, for optional ones among them, whether the call read
        them (it did not where the latest write left the field out); ``taken`` masks
        the positions really read: a placeholder read, whose rows are the slots its
        placeholders name. Check each row was written for this request, not read since,
        and that the read is ordered after its write; then mark them consumed and poison
        them. A never-written row of an ``initial_zeros`` field passes (it reads zeros),
        except where a placeholder names it: a placeholder promises a pending value.

        ``owners`` (one request id per position, as ``wrote`` takes them) checks each
        row was written for the request that reads it. ``distinct`` checks that no slot
        but row 0 is named twice in ``rows``: a placeholder read asks for it, since no
        ``check_slots`` saw the slots its placeholders name."""
        rows = self._slots(op, rows)
        if rows.numel() == 0:
            return
        plan = self.state.read_plan(op, tuple(buffers), carried)
        names = plan.names
        if not names:
            return
        placeholders = taken is not None
        if taken is not None:
            rows = self.state.taken_only(rows, taken)
        if distinct:
            self._check_named_once(op, names, rows)
        requests = None
        if owners is not None:
            requests = self._requests.ids(self._where(op), owners, rows.numel())
        block = self.state.block(plan, rows)
        tick, stream = self._tick()
        ok = self.state.readable(block, None if tick is None else tick.seen)
        zeros = self.state.never_written_zeros(plan, block)
        if zeros is not None and not placeholders:
            ok = ok | zeros
        if requests is not None:
            ok = ok & self.state.owners_match(block, requests)

        def problem(first: int) -> str:
            j, i = divmod(first, rows.numel())
            reading = Reading(op, stream, i, placeholders, requests, owners)
            row = self.state.row(block, j, i)
            return self._read_problem(reading, names[j], int(rows[i]), row)

        summary = "placeholder_read_summary" if placeholders else "read_summary"
        fields_text = ", ".join(names)
        self._require(
            ok,
            lambda: text(
                summary, owner=self.owner, fields=fields_text, op=op, stream=stream
            ),
            problem,
        )
        if tick is None:
            self.state.consume(plan, rows, zeros, 0, 0)
        else:
            self.state.consume(plan, rows, zeros, tick.writer, tick.clock)
        self._poison(names, buffers, rows, zeros)

    def _poison(
        self,
        names: tuple[str, ...],
        buffers: Mapping[str, torch.Tensor | None],
        rows: torch.Tensor,
        zeros: torch.Tensor | None,
    ) -> None:
        """Fill the rows read with the poison, but for never-written rows of fields that
        read as zeros until their first write: those keep their zeros."""
        for j, name in enumerate(names):
            buf = buffers[name]
            if buf is None:
                continue
            if zeros is None or name not in self.state.initial_zeros:
                buf.index_fill_(0, rows, poison(buf.dtype))
                continue
            keep = zeros[j].reshape(-1, *(1,) * (buf.dim() - 1))
            value = buf.index_select(0, rows)
            buf.index_copy_(0, rows, torch.where(keep, value, poison(buf.dtype)))

    def _check_named_once(
        self, op: str, names: tuple[str, ...], rows: torch.Tensor
    ) -> None:
        """No slot but row 0 (padding, and positions not taken) twice in one read."""
        if rows.numel() < 2:
            return
        ordered = rows.sort().values
        twice = (ordered[1:] == ordered[:-1]) & (ordered[1:] != 0)
        fields_text = ", ".join(names)

        def detail(first: int) -> str:
            slot = int(ordered[1:][first])
            positions = (rows == slot).nonzero().reshape(-1).tolist()
            return text(
                "slot_named_twice",
                owner=self.owner,
                field=fields_text,
                op=op,
                slot=slot,
                first=positions[0],
                second=positions[1],
            )

        self._require(
            ~twice,
            lambda: text(
                "slot_named_twice_summary", owner=self.owner, fields=fields_text, op=op
            ),
            detail,
        )

    def _read_problem(self, reading: Reading, field: str, slot: int, row: Row) -> str:
        """Why ``reading`` may not take ``row`` (``field``, ``slot``)."""
        where = {"owner": self.owner, "field": field, "slot": slot, "op": reading.op}
        why = _nothing_pending(row)
        if why is not None and reading.placeholders:
            return text(
                "placeholder_nothing_pending",
                position=reading.position,
                placeholder=-slot,
                why=_WHY[why],
                **where,
            )
        if why is not None and field in self.graph_written and self.graph_writes:
            return text("graph_not_run", why=_WHY[why], **where) + self._for(reading)
        if why is not None:
            extra = {"writer_op": row.op} if why == "released" else {}
            return text(why, **where, **extra) + self._for(reading)
        if reading.requests is not None:
            request = int(reading.requests[reading.position])
            if row.owner is not None and row.owner != request:
                return text(
                    "wrong_owner",
                    position=reading.position,
                    reader=self._requests.whose(
                        reading.owners, reading.position, request
                    ),
                    writer_op=row.op,
                    writer_request=self._requests.name(row.owner),
                    **where,
                )
        return text(
            "unordered_read",
            stream=reading.stream,
            writer_op=row.op,
            writer_stream=self.clocks.writer_name(row.writer),
            **where,
        )

    def _for(self, reading: Reading) -> str:
        """Which request read the row, where the read names its requests."""
        if reading.requests is None:
            return ""
        position = reading.position
        request = int(reading.requests[position])
        whose = self._requests.whose(reading.owners, position, request)
        return f" (read for {whose}, position {position})"

    @_atomic
    def peek(
        self,
        op: str,
        rows: torch.Tensor,
        buffers: Mapping[str, torch.Tensor | None],
        *,
        carried: Mapping[str, bool] | None = None,
        stale: str,
        owners: Owners | None = None,
    ) -> None:
        """``op`` relies on rows ``rows`` of the fields in ``buffers`` without consuming
        them (a second read, or rows a partial stash keeps): each must hold a value a
        reader may take, ordered after its write. Nothing is consumed or poisoned.
        ``stale`` is the message key of a row that fails; ``owners`` (one request id
        per row) name the request a failing row was relied on for."""
        rows = self._slots(op, rows)
        if rows.numel() == 0:
            return
        plan = self.state.read_plan(op, tuple(buffers), carried)
        names = plan.names
        if not names:
            return
        requests = None
        if owners is not None:
            requests = self._requests.ids(self._where(op), owners, rows.numel())
        block = self.state.block(plan, rows)
        tick, stream = self._tick()
        ok = self.state.readable(block, None if tick is None else tick.seen)
        zeros = self.state.never_written_zeros(plan, block)
        if zeros is not None:
            ok = ok | zeros

        def problem(first: int) -> str:
            j, i = divmod(first, rows.numel())
            row = self.state.row(block, j, i)
            why = _nothing_pending(row)
            reason = (
                _WHY[why]
                if why is not None
                else f"its write ({row.op} on {self.clocks.writer_name(row.writer)}) "
                f"is not ordered before {op} on {stream}"
            )
            whose = ""
            if requests is not None:
                request = self._requests.whose(owners, i, int(requests[i]))
                whose = f" (for {request}, position {i})"
            return (
                text(
                    stale,
                    owner=self.owner,
                    field=names[j],
                    slot=int(rows[i]),
                    op=op,
                    why=reason,
                )
                + whose
            )

        fields_text = ", ".join(names)
        self._require(
            ok,
            lambda: text(
                stale + "_summary", owner=self.owner, fields=fields_text, op=op
            ),
            problem,
        )

    def publishing(self) -> None:
        """``publish`` is about to record the fence (before: the record may wake a waiter)."""
        cpu_stream.switch_point()
        self._fresh = set(self._consumers)
        if self._model_fence and self.clocks.enabled:
            self._fence = self.clocks.record_fence(self._stream(), self._fence)

    def waited(self, consumer: str | None) -> None:
        """``consumer`` waited on the fence: a publish must have come since its last wait.
        ``None``: a wait that is no consumer's (a second read, checked row by row)."""
        cpu_stream.switch_point()
        if consumer is not None:
            if consumer not in self._fresh:
                raise RelayDebugError(
                    text("stale_fence", owner=self.owner, op=consumer)
                )
            self._fresh.discard(consumer)
        if self._model_fence and self.clocks.enabled and self._fence is not None:
            self.clocks.join(self._stream(), self._fence.clock)

    @_atomic
    def release(self, indices: torch.Tensor) -> None:
        """The requests in slots ``indices`` ended: their unread values are stale (READY
        blocked, STATE kept: Note [Debug state table])."""
        rows = self._slots("release", indices)
        if rows.numel() == 0:
            return
        self.state.release(rows)


class Reading(NamedTuple):
    """One position of a read, as a failure names it."""

    op: str
    stream: str
    position: int
    placeholders: bool
    requests: torch.Tensor | None
    #: What the call passed as its owners, to tell a member row (Note [Member rows]).
    owners: Owners | None = None


def _device_message(text: str, limit: int = 250) -> str:
    """``text`` cut to what ``torch._assert_async`` takes on CUDA (under 255 bytes)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."


def _nothing_pending(row: Row) -> str | None:
    """The message key of why ``row`` holds no value for a read, or ``None`` if it does
    (then only the owner or the order can fail)."""
    if row.state is State.EMPTY:
        return "never_written"
    if row.state is State.CONSUMED:
        return "consumed"
    if row.state is State.OMITTED:
        return "omitted"
    if row.released:
        return "released"
    return None


#: How ``placeholder_nothing_pending`` says why, per ``_nothing_pending`` key.
_WHY = {
    "never_written": "no stash or publish ever wrote it",
    "consumed": "its value was already read",
    "omitted": "its latest stash left the field out",
    "released": "its request was released since the write",
}
