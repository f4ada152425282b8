"""What one step does, counted rather than timed: dispatched aten ops per method, the
bytes those ops move, and on CUDA the kernel launches.

Ops are counted with a ``TorchDispatchMode``: every aten op that reaches a kernel,
after autograd and composite decompositions, so ``x.to(torch.int64)`` on an int64
tensor counts nothing and ``int(t.sum())`` counts ``sum`` and
``_local_scalar_dense``. View ops (``relay.opcount.is_view_op``: they move no data and
launch no kernel) are counted apart, as sglang's own count leaves them out. The counts
are exact and machine-independent, unlike times.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from relay.bench.sides import Side
from relay.opcount import is_view_op

__all__ = ["MethodCount", "StepCount", "count_launches", "count_step"]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _row_bytes(buf: torch.Tensor) -> int:
    return _nbytes(buf) // max(buf.shape[0], 1) if buf.dim() else _nbytes(buf)


def _tensors(values: Iterable[object]) -> Iterable[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _bytes_moved(func: Any, args: tuple[Any, ...], out: object) -> int:
    """The least memory traffic of one op: what it must read plus what it writes.

    Views move nothing; indexed ops touch only the indexed rows of their buffer
    (reads of the rows and the index, writes of the rows); every other op reads its
    tensor inputs and writes its outputs in full.
    """
    if getattr(func, "is_view", False):
        return 0  # a view moves nothing
    name = func.overloadpacket.__name__
    # Gathers: read the rows and the index, write the rows.
    if name == "index" and isinstance(out, torch.Tensor):
        return 2 * _nbytes(out) + sum(_nbytes(i) for i in _tensors(args[1:]))
    if name == "index_select" and isinstance(out, torch.Tensor):
        return 2 * _nbytes(out) + _nbytes(args[2])
    # Scatters: read the values and the index, write the rows.
    if name in ("index_put_", "index_put", "_index_put_impl_"):
        buf, index = args[0], list(_tensors(args[1:2]))
        rows = index[0].numel() if index else 0
        return 2 * rows * _row_bytes(buf) + sum(_nbytes(i) for i in index)
    if name in ("index_copy_", "index_copy"):
        return 2 * _nbytes(args[3]) + _nbytes(args[2])
    if name in ("index_fill_", "index_fill"):
        index_t: torch.Tensor = args[2]
        return index_t.numel() * _row_bytes(args[0]) + _nbytes(index_t)
    inputs = sum(_nbytes(t) for t in _tensors(args))
    outputs = sum(
        _nbytes(t) for t in _tensors(out if isinstance(out, (list, tuple)) else [out])
    )
    return inputs + outputs


# TorchDispatchMode's own methods are untyped.
class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[str] = []
        self.views = 0
        self.bytes = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if is_view_op(func):
            self.views += 1
        else:
            self.ops.append(func.overloadpacket.__name__)
        self.bytes += _bytes_moved(func, args, out)
        return out


@attrs.frozen
class MethodCount:
    """The data ops one call of a method dispatched, in order, its view ops, and the
    bytes they move."""

    method: str
    ops: tuple[str, ...]
    bytes: int
    views: int = 0

    def summary(self) -> str:
        """``index_put_ x4, index`` style: each op with its count, in first-seen order."""
        counts = Counter(self.ops)
        return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())


@attrs.frozen
class StepCount:
    """One step of one side, method by method."""

    methods: tuple[MethodCount, ...]

    @property
    def ops(self) -> int:
        return sum(len(m.ops) for m in self.methods)

    @property
    def views(self) -> int:
        return sum(m.views for m in self.methods)

    @property
    def bytes(self) -> int:
        return sum(m.bytes for m in self.methods)

    def by_method(self) -> dict[str, MethodCount]:
        return {m.method: m for m in self.methods}


def count_step(side: Side) -> StepCount:
    """Run one step of ``side`` and count what each of its calls dispatched."""
    methods: list[MethodCount] = []
    for name, call in side.calls:
        with _Recorder() as recorder:
            call()
        methods.append(
            MethodCount(name, tuple(recorder.ops), recorder.bytes, recorder.views)
        )
    return StepCount(tuple(methods))


def count_launches(
    step: Callable[[], None], device: torch.device, *, steps: int = 10
) -> float:
    """Device activities (kernels, copies, fills) per call of ``step`` on CUDA, from the
    profiler's device-side trace; each is one launch the host paid for."""
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()  # lazy allocations and first-call setup stay out of the count
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    # Device-side records are kernels, copies and fills, plus CUPTI's synchronization
    # records ("Stream Sync", "Event Sync", ...), which are waits, not launches.
    launches = sum(
        1
        for event in prof.events()
        if event.device_type == DeviceType.CUDA and "Sync" not in event.name
    )
    return launches / steps
