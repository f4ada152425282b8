"""Which request a row's value belongs to: request ids as debug mode records them.

An engine says which request each row of a write or a read belongs to (``owners``): an
integer tensor of request ids, or a sequence of ints, strings (vLLM's request ids are
strings) or request objects (sglang's batches hold their ``Req`` objects, ``reqs``). The
state table keeps one int64 per row, so anything but an int is interned here, per map,
and named back in messages. A request object that carries its id as ``rid`` (sglang's
``Req``) is interned and named by that id, so the map holds no request object.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from relay.errors import RelayDebugError

__all__ = ["Owners", "Requests"]

#: What ``owners=`` takes: one request id per row.
Owners = torch.Tensor | Sequence[Hashable]

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
