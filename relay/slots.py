"""Slots for engines that index by batch row (vLLM V1): each request keeps one slot.

A generated map's rows are request slots, kept by a request for its life. An engine
whose own state is indexed by last step's batch row (vLLM V1 reorders rows every step,
and rebuilds a previous-row to current-row map on the host) needs a slot per request
instead: ``SlotTable`` is that bookkeeping, and nothing of the scheduler. ``take`` a
slot when a request joins, ``indices(request ids in row order)`` each step (the map's
indices, and so the step-to-step row map), ``launched`` and ``processed`` as each step
starts and its outputs are handled, ``finish`` when requests end, are aborted or are
preempted: their slots return to the pool once no step in flight can write them
(Note [Slots freed in stream order]). What to schedule and when a request ends stay
the engine's: see docs/integrating.md, "vLLM 0.33: both model runners".
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

    @property
    def pool_size(self) -> int: ...

    def release(self, indices: torch.Tensor) -> None: ...


# Note [Slots freed in stream order]
# A request ends (finished, aborted, preempted) while the engine's newest steps are
# still in flight, and one of them may still write its slot: a stash of its extra
# token, a publish. Handing the slot to a new request at once lets that write land on
# the new request's row whenever the new request's first write is not ordered behind
# the step (a write from the scheduler's thread, or another stream). So ``finish``
# forgets the request at once but holds its slot back until every step launched by
# then has been processed, as vLLM defers a freed request's KV blocks under async
# scheduling: steps that carry rows are numbered as they launch (an empty step writes
# nothing and gets none), a held-back slot waits for the newest number at its finish,
# and held-back slots return to the pool in the order they were finished. The maps
# release a slot just before it returns (after the steps' last read of it, so debug
# mode does not call that read stale), and a release that raises leaves it held back.
# With no step in flight a slot returns at once: an engine that never calls
# ``launched`` (a synchronous loop) frees at ``finish``.


class SlotTable:
    """Request -> slot for ``pool_size`` rows: slots ``1 .. pool_size - 1`` (row 0 is
    the scratch row padding reads), the longest-free slot taken first; a finished
    request's slot free again once the steps in flight at its finish are processed
    (Note [Slots freed in stream order])."""

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
        maps = tuple(maps)
        for i, relay_map in enumerate(maps):
            if relay_map.pool_size < pool_size:
                raise RelayError(
                    f"SlotTable: pool_size {pool_size} is larger than the pool of "
                    f"maps[{i}] ({type(relay_map).__name__}, pool_size "
                    f"{relay_map.pool_size}): a slot past its rows cannot be written. "
                    "Build the table with the maps' pool_size, or the maps with a "
                    "larger one"
                )
        self.pool_size = pool_size
        self.maps = maps
        self.device = torch.device(device)
        self._free = collections.deque(range(1, pool_size))
        self._slot: dict[Hashable, int] = {}
        #: Steps that carry rows, numbered as they launch, and how many are processed.
        self._launched = 0
        self._processed = 0
        #: Each request's newest launched step (0: none launched yet).
        self._last_step: dict[Hashable, int] = {}
        #: Slots held back, oldest first, each with the step that must be processed
        #: before it returns to the pool.
        self._held: collections.deque[tuple[int, list[int]]] = collections.deque()

    def __len__(self) -> int:
        """How many requests hold a slot."""
        return len(self._slot)

    def __contains__(self, request: object) -> bool:
        return request in self._slot

    @property
    def free(self) -> int:
        """How many slots are free."""
        return len(self._free)

    @property
    def held_back(self) -> int:
        """How many slots of ended requests wait for a step in flight to be processed."""
        return sum(len(slots) for _, slots in self._held)

    def take(self, request: Hashable) -> int:
        """A free slot for ``request``, which must hold none."""
        if request in self._slot:
            raise RelayError(
                f"SlotTable: request {request!r} already holds slot "
                f"{self._slot[request]}; finish it before it takes another"
            )
        if not self._free:
            held = self.held_back
            waiting = (
                f"; {held} of them ended and wait for step {self._held[0][0]} to be "
                "processed (SlotTable.processed)"
                if held
                else ""
            )
            raise RelayError(
                f"SlotTable: all {self.pool_size - 1} slots are held (pool_size "
                f"{self.pool_size}, row 0 the scratch row){waiting}; finish a request "
                "first, or build the maps with a larger pool"
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
        host = torch.tensor(self._slots_of(requests, "indices"), dtype=torch.int64)
        if self.device.type == "cpu":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def launched(self, requests: Iterable[Hashable]) -> int:
        """A step with rows for ``requests`` was launched: its number, for
        ``processed`` (0 for a step with no rows, which writes no slot)."""
        named = self._requests(requests, "launched")
        self._slots_of(named, "launched")
        if not named:
            return 0
        self._launched += 1
        for request in named:
            self._last_step[request] = self._launched
        return self._launched

    def processed(self, step: int) -> torch.Tensor:
        """Step ``step``'s outputs were processed, and so every step launched before it:
        the slots held back for them return to the pool, oldest finish first, released
        on every map. Returns the slots that returned."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise RelayError(
                f"SlotTable.processed: step must be the int launched returned "
                f"(got {step!r} that is a {type(step).__name__})"
            )
        if not 0 <= step <= self._launched:
            raise RelayError(
                f"SlotTable.processed: step {step} was never launched (steps "
                f"1..{self._launched} were); pass the number launched returned"
            )
        self._processed = max(self._processed, step)
        returned: list[int] = []
        while self._held and self._held[0][0] <= self._processed:
            slots = self._held[0][1]
            self._release(slots)  # raises with the slots still held back
            self._held.popleft()
            self._free.extend(slots)
            returned += slots
        return torch.tensor(returned, dtype=torch.int64)

    def finish(self, requests: Iterable[Hashable]) -> torch.Tensor:
        """End ``requests`` (finished, aborted or preempted): the table forgets them, and
        each slot returns to the pool, released on every map (debug mode marks unread
        values stale), once every step launched by now that may write it has been
        processed; at once where none may (Note [Slots freed in stream order]).
        Returns the requests' slots, in their order."""
        ended = self._requests(requests, "finish")
        for request in ended:
            if request not in self._slot:
                raise self._unknown(request, "finish")
        if len(set(ended)) != len(ended):
            raise RelayError(
                f"SlotTable.finish: a request is named twice in {ended!r}; name each "
                "once"
            )
        slots = [self._slot[r] for r in ended]
        in_flight = [self._last_step.get(r, 0) > self._processed for r in ended]
        now = [slot for slot, held in zip(slots, in_flight) if not held]
        later = [slot for slot, held in zip(slots, in_flight) if held]
        self._release(now)  # a release that raises leaves every request held
        for request in ended:
            del self._slot[request]
            self._last_step.pop(request, None)
        self._free.extend(now)
        if later:
            self._held.append((self._launched, later))
        return torch.tensor(slots, dtype=torch.int64)

    def _release(self, slots: list[int]) -> None:
        if slots:
            released = torch.tensor(slots, dtype=torch.int64).to(self.device)
            for relay_map in self.maps:
                relay_map.release(released)

    def _requests(self, requests: Iterable[Hashable], op: str) -> list[Hashable]:
        """``requests`` as a list; a string (one request's id, not an iterable of them)
        refused."""
        if isinstance(requests, (str, bytes)):
            raise RelayError(
                f"SlotTable.{op}: takes an iterable of request ids, got the string "
                f"{requests!r} (it would be read one character per request); write "
                f"{op}([{requests!r}])"
            )
        return list(requests)

    def _slots_of(self, requests: Iterable[Hashable], op: str) -> list[int]:
        slots = []
        for row, request in enumerate(self._requests(requests, op)):
            found = self._slot.get(request)
            if found is None:
                raise self._unknown(request, f"{op} (row {row})")
            slots.append(found)
        return slots

    def _unknown(self, request: Hashable, op: str) -> RelayError:
        return RelayError(
            f"SlotTable.{op}: request {request!r} holds no slot (never taken, or "
            "finished); take(request) when it joins the batch"
        )
