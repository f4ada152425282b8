"""Which request a row's value belongs to: request ids as debug mode records them.

An engine says which request each row of a write or a read belongs to (``owners``): an
integer tensor of request ids, or a sequence of ints, strings (vLLM's request ids are
strings) or request objects (sglang's batches hold their ``Req`` objects, ``reqs``). The
state table keeps one int64 per row, so anything but an int is interned here, per map,
and named back in messages. A request object that carries its id as ``rid`` (sglang's
``Req``) is interned and named by that id, so the map holds no request object.

A batch may carry rows past its requests that belong to them (sglang's beam members,
Note [Member rows]): ``MemberRows`` names each such row by its leader's request.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol, overload

import torch

from relay.errors import RelayDebugError

__all__ = ["MemberEntry", "MemberRows", "MemberTail", "Owners", "Requests"]

#: What ``owners=`` takes: one request id per row.
Owners = torch.Tensor | Sequence[Hashable]

# Note [Member rows]
# sglang's beam search decodes a request as its leader row plus member rows that have
# no request object of their own: a decode batch appends every live group's member
# slots after the rows of its ``reqs`` and lists them in ``beam_tail`` (the leader's
# row in ``reqs``, and the members' rows counted from the end of ``reqs``). A member
# row belongs to its leader's request, so its id is the leader's: a write of the
# group's rows names the leader for each (``owners=[leader] * k``), and a read checks
# that. Messages say which rows were members ("a member row of request 'r3'"). The
# tail is read in debug mode only, where the resolve builds ``MemberRows`` of it.


class MemberEntry(Protocol):
    """One leader's member rows in a ``MemberTail`` (sglang's ``BeamTailEntry``)."""

    @property
    def leader_idx(self) -> int:
        """The leader's row: its position in the batch's requests."""
        ...

    @property
    def start(self) -> int:
        """The first member row, counted from the first row past the requests."""
        ...

    @property
    def end(self) -> int:
        """One past the last member row, counted as ``start`` is."""
        ...


class MemberTail(Protocol):
    """The member rows a batch carries past its requests (sglang's ``BeamTail``)."""

    @property
    def entries(self) -> Sequence[MemberEntry]:
        """One entry per leader, in row order."""
        ...


class MemberRows(Sequence[Hashable]):
    """A batch's owners where rows past its ``requests`` are member rows listed by
    ``tail`` (``None``: there are none): row ``i`` is ``requests[i]``, and a member row
    is its leader's request (Note [Member rows])."""

    def __init__(self, requests: Owners, tail: MemberTail | None) -> None:
        self.requests = requests
        self.tail = tail
        self._leaders: list[int] | None = None

    @property
    def leading(self) -> int:
        """How many rows the requests name; the member rows follow."""
        return len(self.requests)

    def leaders(self, where: str = "owners") -> list[int]:
        """Per member row, in row order, its leader's row; ``RelayDebugError`` naming
        ``where`` if the tail's entries do not lay its rows out one after another
        from the first row past the requests, or name a leader that is none of them."""
        if self._leaders is not None:
            return self._leaders
        found: list[int] = []
        for k, entry in enumerate(self.tail.entries if self.tail is not None else ()):
            leader, start, end = entry.leader_idx, entry.start, entry.end
            if not 0 <= leader < self.leading or start != len(found) or end < start:
                raise RelayDebugError(
                    f"{where}: the member tail's entry {k} (leader_idx={leader}, "
                    f"start={start}, end={end}) does not follow its rows: a leader must "
                    f"be one of the batch's {self.leading} requests, and each entry's "
                    f"rows must start where the previous entry's end ({len(found)}); "
                    "build the tail as the batch's rows lie"
                )
            found += [leader] * (end - start)
        self._leaders = found
        return found

    def __len__(self) -> int:
        return self.leading + len(self.leaders())

    @overload
    def __getitem__(self, row: int) -> Hashable: ...
    @overload
    def __getitem__(self, row: slice) -> Sequence[Hashable]: ...
    def __getitem__(self, row: int | slice) -> Hashable | Sequence[Hashable]:
        if isinstance(row, slice):
            return [self[i] for i in range(len(self))[row]]
        if row < 0:
            row += len(self)
        if row < self.leading:
            return _request(self.requests, row)
        return _request(self.requests, self.leaders()[row - self.leading])


def _request(requests: Owners, row: int) -> Hashable:
    if isinstance(requests, torch.Tensor):
        named: Hashable = requests.reshape(-1)[row].item()
        return named
    return requests[row]


#: Interned ids start here, far from any request number an engine counts up to, so a
#: message can tell an interned name from a plain int.
_INTERNED = 1 << 48


class Requests:
    """One map's request ids: ``owners`` arguments as int64 tensors, and their names."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._ids: dict[Hashable, int] = {}
        self._names: list[Hashable] = []

    def ids(self, where: str, owners: Owners, count: int) -> torch.Tensor:
        """``owners`` as an int64 tensor of ``count`` ids on the map's device."""
        if isinstance(owners, MemberRows):
            leading = self.ids(where, owners.requests, owners.leading)
            members = leading[owners.leaders(where)]
            if owners.leading + members.numel() != count:
                raise RelayDebugError(
                    f"{where}: owners must name one request per row: {count} rows, "
                    f"but the requests name {owners.leading} and the tail "
                    f"{members.numel()} member row(s) after them; list every row past "
                    "the requests in the tail, and nothing else"
                )
            return torch.cat((leading, members))
        if isinstance(owners, torch.Tensor):
            dtype = owners.dtype
            if dtype == torch.bool or dtype.is_floating_point or dtype.is_complex:
                raise RelayDebugError(
                    f"{where}: owners must be integer request ids, got a {dtype} "
                    "tensor; pass one id per row (an int tensor, or a list of ints or "
                    "strings)"
                )
            ids = owners.reshape(-1).to(self.device, torch.int64)
        else:
            ids = torch.tensor(
                [self._id(owner) for owner in owners],
                dtype=torch.int64,
                device=self.device,
            )
        if ids.numel() != count:
            raise RelayDebugError(
                f"{where}: owners must name one request per row: {count} rows, "
                f"{ids.numel()} owners"
            )
        return ids

    def _id(self, owner: Hashable) -> int:
        rid = getattr(owner, "rid", None)
        if rid is not None:
            owner = rid
        if isinstance(owner, int) and not isinstance(owner, bool):
            return owner
        found = self._ids.get(owner)
        if found is None:
            found = self._ids[owner] = _INTERNED + len(self._names)
            self._names.append(owner)
        return found

    def name(self, request: int) -> str:
        """How a message names request id ``request``."""
        if _INTERNED <= request < _INTERNED + len(self._names):
            return repr(self._names[request - _INTERNED])
        return str(request)

    def whose(self, owners: Owners | None, position: int, request: int) -> str:
        """How a message names the request of row ``position`` of a call whose
        ``owners`` gave it id ``request``: ``request 'r3'``, or ``a member row of
        request 'r3'`` past the batch's requests (Note [Member rows])."""
        named = f"request {self.name(request)}"
        if isinstance(owners, MemberRows) and position >= owners.leading:
            return f"a member row of {named}"
        return named
