"""Helpers the generated maps call. Small, typed, and free when debug mode is off.

Generated modules import this module as ``_rt`` and nothing else from relay, so the
names here are part of the contract between the generator and the runtime.
"""

from __future__ import annotations

import torch

from typing import Any

from relay.device import Fence, HostMirror, policy_for
from relay.errors import RelayDebugError, RelayError

__all__ = [
    "DebugChecks",
    "check_rows",
    "Fence",
    "HostMirror",
    "check_dim",
    "check_slots",
    "consume",
    "guard_non_negative",
    "guard_positive",
    "lazy_buffer",
    "new_buffer",
    "never_stashed",
]


def _poison(dtype: torch.dtype) -> float | int | None:
    """The value unconsumed rows hold in debug mode: -1 for ints, NaN for floats."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return None  # no spare value to poison with
    return -1


def check_dim(owner: str, name: str, value: int) -> int:
    """A symbolic dim given to a constructor must be a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"{owner}: dim {name!r} must be a positive int (got {value!r} that is a "
            f"{type(value).__name__})"
        )
    return value


def new_buffer(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, debug: bool
) -> torch.Tensor:
    """A relay buffer: zeros, or poison in debug mode so an unwritten row is caught."""
    poison = _poison(dtype) if debug else None
    if poison is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.full(shape, poison, dtype=dtype, device=device)


def lazy_buffer(
    owner: str,
    field: str,
    pool_size: int,
    declared_row: tuple[int | None, ...],
    dtype: torch.dtype | None,
    first: torch.Tensor,
    debug: bool,
) -> torch.Tensor:
    """Allocate a lazy field from its first non-empty payload ``first``.

    ``declared_row`` holds the fixed dims of the row shape and ``None`` for symbolic
    ones; ``dtype`` is ``None`` when the schema takes it from the payload.
    """
    row = tuple(first.shape[1:])
    if len(row) != len(declared_row) or any(
        want is not None and want != got for want, got in zip(declared_row, row)
    ):
        expected = tuple("?" if d is None else d for d in declared_row)
        raise RelayError(
            f"{owner}.{field}: the first payload has rows of shape {row}, but the schema "
            f"declares rows of shape {expected} ('?' is taken from the payload); "
            f"pass a tensor of shape (n, {', '.join(map(str, expected))})"
        )
    return new_buffer((pool_size, *row), dtype or first.dtype, first.device, debug)


def check_rows(
    what: str,
    value: torch.Tensor,
    indices: torch.Tensor,
    buf: torch.Tensor | None,
    declared_row: tuple[int | None, ...] = (),
) -> None:
    """A payload must hold one row per index, shaped like the buffer's rows (while a
    lazy buffer does not exist yet: like ``declared_row``, ``None`` matching any size).

    Shapes only, no values: free of device work. Without it, indexing assignment
    would broadcast a (n, 1) tensor into (n, topk) rows without a word.
    """
    if (
        buf is not None
        and value.dim() > 0
        and value.shape[0] == indices.shape[0]
        and value.shape[1:] == buf.shape[1:]
    ):
        return  # the common case, kept cheap: it runs on every stash and publish
    got = tuple(value.shape)
    if buf is not None:
        expected: tuple[int | str, ...] = (indices.shape[0], *buf.shape[1:])
        ok = got == expected
    else:
        expected = (indices.shape[0], *("?" if d is None else d for d in declared_row))
        ok = len(got) == len(expected) and got[0] == expected[0] and all(
            want is None or want == size for want, size in zip(declared_row, got[1:])
        )
    if not ok:
        raise RelayError(
            f"{what}: got a tensor of shape {got} for {indices.shape[0]} slot(s); expected "
            f"{expected} (one row per index, rows as declared; '?' is any size)"
        )


def never_stashed(owner: str, field: str) -> RelayError:
    """The error for resolving a required lazy field before its first stash."""
    return RelayError(
        f"{owner}.{field}: resolved before any stash allocated its buffer; "
        "stash a payload carrying it (the forward that produced the rows) first"
    )


def guard_non_negative(value: torch.Tensor, what: str) -> None:
    """Assert ``value >= 0`` on the device, without a host sync."""
    torch._assert_async((value >= 0).all(), f"{what}: guard failed, values must be >= 0")


def guard_positive(value: torch.Tensor, what: str) -> None:
    """Assert ``value > 0`` on the device, without a host sync."""
    torch._assert_async((value > 0).all(), f"{what}: guard failed, values must be > 0")


def check_slots(indices: torch.Tensor, what: str) -> None:
    """Debug: placeholders are ``-slot``; slot 0 is scratch and would read as token 0."""
    torch._assert_async(
        (indices >= 1).all(), f"{what}: slots must be >= 1 (row 0 is the scratch row)"
    )


def consume(
    buf: torch.Tensor,
    rows: torch.Tensor,
    values: torch.Tensor,
    taken: torch.Tensor | None,
    what: str,
) -> None:
    """Debug: check the gathered ``values`` were written since their last read, then
    poison ``rows`` again so each value is consumed exactly once.

    ``taken`` masks which of ``rows`` were really read (placeholder resolves read row
    0 for the positions that hold real values); ``None`` means all of them.
    """
    poison = _poison(buf.dtype)
    if poison is None or values.numel() == 0:
        return
    fresh = ~torch.isnan(values) if isinstance(poison, float) else values != poison
    fresh = fresh.reshape(values.shape[0], -1).all(dim=1)
    if taken is not None:
        fresh = fresh | ~taken.reshape(-1)
    torch._assert_async(
        fresh.all(),
        f"{what}: read a row that was not written since it was last consumed "
        "(a stash or publish is missing, or the slot was read twice)",
    )
    buf.index_fill_(0, rows.reshape(-1), poison)


def _stream_name(stream: Any) -> str:
    return "the host (no stream)" if stream is None else f"stream {stream!r}"


class DebugChecks:
    """Debug-mode bookkeeping of one map: slot generation stamps and stream order.

    Allocates nothing until debug mode uses it, so a map built with ``debug=False``
    pays one attribute and no memory.

    - Generation stamps: ``release`` bumps a slot's generation when its request
      ends; a resolve must see the generation its stash (or publish) saw, so a
      slot reused between stash and resolve is reported.
    - Stream order: the forward lane has no fence, so ``resolve_future`` must run on
      the stream that stashed; any other stream is reported.
    """

    def __init__(self, device: torch.device, pool_size: int, owner: str) -> None:
        self.device = device
        self.pool_size = pool_size
        self.owner = owner
        self._generation: torch.Tensor | None = None
        self._stamps: dict[str, torch.Tensor] = {}
        self._writer: dict[str, Any] = {}

    def _generations(self) -> torch.Tensor:
        if self._generation is None:
            self._generation = torch.zeros(self.pool_size, dtype=torch.int64, device=self.device)
        return self._generation

    def wrote(self, lane: str, indices: torch.Tensor) -> None:
        """Rows ``indices`` of ``lane`` were written now, on the current stream."""
        stamps = self._stamps.get(lane)
        if stamps is None:
            stamps = self._stamps[lane] = torch.zeros_like(self._generations())
        stamps[indices] = self._generations()[indices]
        self._writer[lane] = policy_for(self.device).current_stream()

    def read(self, lane: str, indices: torch.Tensor, op: str, *, same_stream: bool) -> None:
        """Rows ``indices`` of ``lane`` are read now by ``op``."""
        if same_stream and lane in self._writer:
            reader = policy_for(self.device).current_stream()
            if reader != self._writer[lane]:
                raise RelayDebugError(
                    f"{self.owner}.{op}: reads the {lane} lane on {_stream_name(reader)}, but "
                    f"it was written on {_stream_name(self._writer[lane])}; the {lane} lane is "
                    "ordered by the stream alone, so call it on the stream that stashed"
                )
        stamps = self._stamps.get(lane)
        if stamps is None:
            return
        torch._assert_async(
            (stamps[indices] == self._generations()[indices]).all(),
            f"{self.owner}.{op}: a slot was released and reused between its write and this "
            "read; the value belongs to the slot's previous request",
        )

    def release(self, indices: torch.Tensor) -> None:
        """The requests in slots ``indices`` ended: their unread values are stale."""
        generation = self._generations()
        generation.index_add_(0, indices, torch.ones_like(indices, dtype=torch.int64))
