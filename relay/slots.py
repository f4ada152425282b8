"""Slots for engines that index by batch row (vLLM V1): each request keeps one slot.

A generated map's rows are request slots, kept by a request for its life. An engine
whose own state is indexed by last step's batch row (vLLM V1 reorders rows every step,
and rebuilds a previous-row to current-row map on the host) needs a slot per request
instead: ``SlotTable`` is that bookkeeping, and nothing of the scheduler. ``take`` a
slot when a request joins, ``indices(request ids in row order)`` each step (the map's
indices, and so the step-to-step row map), ``finish`` when requests end (their slots
released on every map and free again). What to schedule, when a request ends, and the
stream order of ``finish`` against a forward still in flight stay the engine's: see
docs/integrating.md, "An engine that indexes by last step's row".
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable, Sequence
from typing import Protocol

import torch

from relay.errors import RelayError

__all__ = ["Releases", "SlotTable"]


class Releases(Protocol):
    """A map a ``SlotTable`` releases slots on: any generated map."""

    def release(self, indices: torch.Tensor) -> None: ...


class SlotTable:
    """Request -> slot for ``pool_size`` rows: slots ``1 .. pool_size - 1`` (row 0 is
    the scratch row padding reads), the longest-free slot taken first."""

    def __init__(
        self,
        pool_size: int,
        maps: Sequence[Releases] = (),
        device: torch.device | str = "cpu",
    ) -> None:
        if (
            isinstance(pool_size, bool)
            or not isinstance(pool_size, int)
            or pool_size < 2
        ):
            raise RelayError(
                f"SlotTable: pool_size must be an int >= 2 (row 0 is the scratch row), "
                f"got {pool_size!r}"
            )
        self.pool_size = pool_size
        self.maps = tuple(maps)
        self.device = torch.device(device)
        self._free = collections.deque(range(1, pool_size))
        self._slot: dict[Hashable, int] = {}

    def __len__(self) -> int:
        """How many requests hold a slot."""
        return len(self._slot)

    def __contains__(self, request: object) -> bool:
        return request in self._slot

    @property
    def free(self) -> int:
        """How many slots are free."""
        return len(self._free)

    def take(self, request: Hashable) -> int:
        """A free slot for ``request``, which must hold none."""
        if request in self._slot:
            raise RelayError(
                f"SlotTable: request {request!r} already holds slot "
                f"{self._slot[request]}; finish it before it takes another"
            )
        if not self._free:
            raise RelayError(
                f"SlotTable: all {self.pool_size - 1} slots are held (pool_size "
                f"{self.pool_size}, row 0 the scratch row); finish a request first, or "
                "build the maps with a larger pool"
            )
        slot = self._free.popleft()
        self._slot[request] = slot
        return slot

    def slot(self, request: Hashable) -> int:
        """The slot ``request`` holds."""
        found = self._slot.get(request)
        if found is None:
            raise self._unknown(request, "slot")
        return found

    def indices(self, requests: Iterable[Hashable]) -> torch.Tensor:
        """The slots of ``requests`` in their order (this step's rows), int64 on the
        table's device: the indices of every map call for this batch. Rows reordered
        between steps reorder these; nothing else needs remapping."""
        slots = []
        for row, request in enumerate(requests):
            found = self._slot.get(request)
            if found is None:
                raise self._unknown(request, f"indices (row {row})")
            slots.append(found)
        host = torch.tensor(slots, dtype=torch.int64)
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def finish(self, requests: Iterable[Hashable]) -> torch.Tensor:
        """End ``requests``: their slots released on every map (debug mode marks unread
        values stale), then free for other requests. Returns the slots released.
        Call it where the engine returns a finished request's state, in stream order
        before the next forward (docs/integrating.md)."""
        ended = list(requests)
        for request in ended:
            if request not in self._slot:
                raise self._unknown(request, "finish")
        if len(set(ended)) != len(ended):
            raise RelayError(f"SlotTable.finish: a request is named twice in {ended!r}")
        slots = torch.tensor([self._slot.pop(r) for r in ended], dtype=torch.int64)
        if slots.numel():
            released = slots.to(self.device)
            for relay_map in self.maps:
                relay_map.release(released)
        self._free.extend(slots.tolist())
        return slots

    def _unknown(self, request: Hashable, op: str) -> RelayError:
        return RelayError(
            f"SlotTable.{op}: request {request!r} holds no slot (never taken, or "
            "finished); take(request) when it joins the batch"
        )
