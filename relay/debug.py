"""Debug mode of the generated maps: what each method reports to ``DebugChecks``.

This module fixes the contract between the generator and the debug runtime: the
generated code calls exactly these methods, and only when the map was built with
``debug=True`` (``self._debug`` is ``None`` otherwise, so debug off costs one
attribute test per method). The bookkeeping behind them is free to change.

Per method, in this order:

- ``stash`` / ``publish``: ``check_slots`` (before anything is written), the writes,
  then ``wrote`` for each field written and ``omitted`` for each optional field the
  payload left out; ``publish`` calls ``publishing`` right before its fence record.
- ``invalidate``: ``check_slots(..., scratch_ok=False)`` before the placeholders.
- ``resolve_future``: ``check_slots``, then per field the gather and ``read``.
- schedule resolves: the fence wait, ``waited``, ``check_slots``, the gather, ``read``.
- ``release``: ``release``.
"""

from __future__ import annotations

from typing import Any

import torch

from relay.device import policy_for
from relay.errors import RelayDebugError

__all__ = ["DebugChecks"]

# Per-row state of one field, kept apart from the values.
_CONSUMED = 0  # never written, or read since its last write
_WRITTEN = 1  # written and not read yet
_OMITTED = 2  # the latest stash left this optional field out


def poison(dtype: torch.dtype) -> float | int | bool:
    """What unconsumed rows hold in debug mode, so a stray read still looks wrong."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return -1


def _stream_name(stream: Any) -> str:
    return "the host (no stream)" if stream is None else f"stream {stream!r}"


class DebugChecks:
    """Debug-mode bookkeeping of one map.

    ``forward`` and ``schedule`` name the fields of each lane; ``consumers`` the
    schedule-side resolves, each of which must follow a fresh publish.
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
        self.device = device
        self.pool_size = pool_size
        self.owner = owner
        self._lane = {**{f: "forward" for f in forward}, **{f: "schedule" for f in schedule}}
        self._consumers = consumers
        self._fresh: set[str] = set()
        self._state: dict[str, torch.Tensor] = {}
        self._stamp: dict[str, torch.Tensor] = {}
        self._generation = torch.zeros(pool_size, dtype=torch.int64, device=device)
        self._writer: dict[str, Any] = {}

    def _rows(self, field: str) -> torch.Tensor:
        state = self._state.get(field)
        if state is None:
            state = self._state[field] = torch.zeros(
                self.pool_size, dtype=torch.int8, device=self.device
            )
            self._stamp[field] = torch.zeros_like(self._generation)
        return state

    def check_slots(self, op: str, indices: torch.Tensor, *, scratch_ok: bool = True) -> None:
        """Before anything is written: every slot in range (row 0 only if ``scratch_ok``)."""
        rows = indices.reshape(-1).long()
        low = 0 if scratch_ok else 1
        torch._assert_async(
            ((rows >= low) & (rows < self.pool_size)).all(),
            f"{self.owner}.{op}: slots must be in [{low}, {self.pool_size})",
        )

    def wrote(self, op: str, field: str, buf: torch.Tensor, indices: torch.Tensor) -> None:
        """Rows ``indices`` of ``field`` were written by ``op`` on the current stream."""
        rows = indices.reshape(-1).long()
        self._rows(field)[rows] = _WRITTEN
        self._stamp[field][rows] = self._generation[rows]
        self._writer[field] = policy_for(self.device).current_stream()

    def omitted(self, op: str, field: str, indices: torch.Tensor) -> None:
        """``op`` stashed rows ``indices`` without the optional ``field``."""
        self._rows(field)[indices.reshape(-1).long()] = _OMITTED

    def read(
        self,
        op: str,
        field: str,
        buf: torch.Tensor,
        rows: torch.Tensor,
        taken: torch.Tensor | None = None,
    ) -> None:
        """``op`` gathered rows ``rows`` of ``field`` (``taken`` masks the rows really
        read); check they were written since their last read, then poison them."""
        rows = rows.reshape(-1).long()
        if rows.numel() == 0:
            return
        if self._lane.get(field) == "forward" and field in self._writer:
            reader = policy_for(self.device).current_stream()
            if reader != self._writer[field]:
                raise RelayDebugError(
                    f"{self.owner}.{op}: reads {field} on {_stream_name(reader)}, but it was "
                    f"written on {_stream_name(self._writer[field])}; the forward lane is "
                    "ordered by the stream alone, so call it on the stream that stashed"
                )
        state = self._rows(field)[rows]
        fresh = (state == _WRITTEN) & (self._stamp[field][rows] == self._generation[rows])
        if taken is not None:
            fresh = fresh | ~taken.reshape(-1)
        torch._assert_async(
            fresh.all(),
            f"{self.owner}.{field}: read a row that was not written since it was last consumed "
            "(a stash or publish is missing, the slot was read twice or reused)",
        )
        read_rows = rows if taken is None else rows[taken.reshape(-1)]
        self._state[field][read_rows] = _CONSUMED
        buf.index_fill_(0, read_rows, poison(buf.dtype))

    def publishing(self) -> None:
        """``publish`` is about to record the fence (before: the record may wake a waiter)."""
        self._fresh = set(self._consumers)

    def waited(self, consumer: str) -> None:
        """``consumer`` waited on the fence: a publish must have come since its last wait."""
        if consumer not in self._fresh:
            raise RelayDebugError(
                f"{self.owner}.{consumer}: fence waited on with no publish since the "
                "last wait; the rows it would read are stale. Call publish(...) for "
                "this step before resolving."
            )
        self._fresh.discard(consumer)

    def release(self, indices: torch.Tensor) -> None:
        """The requests in slots ``indices`` ended: their unread values are stale."""
        rows = indices.reshape(-1).long()
        self._generation.index_add_(0, rows, torch.ones_like(rows))
