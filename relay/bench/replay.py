"""The floor: the aten calls one step of a generated map dispatched, replayed bare.

``record`` keeps every call of a step (op, arguments, output) with a
``TorchDispatchMode``; ``floor_calls`` makes of each method's calls one straight-line
function making the same calls on the same tensors, outputs feeding later calls as they
did. Left out is all that is not an aten op: checks, branches, attribute reads and
writes, the payload object, a fence's record and wait, a host sum in Python. A call is
spelled as a hand-written map spells it (``buf.index_select(0, idx)``, ``buf[idx]``)
where that dispatches exactly the recorded op, else the op overload is called.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from relay.opcount import OpCounts, count_ops, is_view_op

__all__ = ["Call", "Recording", "floor_calls", "record"]

Step = Sequence[tuple[str, Callable[[], None]]]


@attrs.frozen
class Call:
    """One dispatched aten call: the op overload, its arguments and its output."""

    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any


@attrs.frozen
class Recording:
    """The calls of one step, method by method, in order."""

    methods: tuple[tuple[str, tuple[Call, ...]], ...]

    def counts(self) -> dict[str, OpCounts]:
        """Data ops and view ops per method, as ``relay.opcount`` counts them."""
        out = {}
        for method, calls in self.methods:
            names = [(c.op.overloadpacket.__name__, is_view_op(c.op)) for c in calls]
            data = tuple(n for n, view in names if not view)
            out[method] = OpCounts(data, tuple(n for n, view in names if view))
        return out


# torch leaves TorchDispatchMode's __init__ and __init_subclass__ unannotated.
class _Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: list[Call] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.calls.append(Call(func, tuple(args), dict(kwargs), out))
        return out


def record(step: Step) -> Recording:
    """Run one step, method by method, and keep every aten call it dispatched."""
    methods = []
    for name, call in step:
        with _Recorder() as recorder:
            call()
        methods.append((name, tuple(recorder.calls)))
    return Recording(tuple(methods))


class _Source:
    """The floor's Python source and the namespace it runs in."""

    def __init__(self) -> None:
        self.names: dict[str, Any] = {}
        self.produced: dict[int, tuple[str, int]] = {}  # id(tensor) -> (name, method)
        self.read_elsewhere: set[str] = set()

    def const(self, value: Any) -> str:
        name = f"c{len(self.names)}"
        self.names[name] = value
        return name

    def expr(self, value: Any, method: int) -> str:
        """``value`` as an expression: the name of the call that produced it, a list of
        such names, or a constant of the namespace."""
        if isinstance(value, torch.Tensor) and id(value) in self.produced:
            name, producer = self.produced[id(value)]
            if producer != method:
                self.read_elsewhere.add(name.split("[")[0])
            return name
        if isinstance(value, (list, tuple)) and any(
            isinstance(v, torch.Tensor) and id(v) in self.produced for v in value
        ):
            items = ", ".join(self.expr(v, method) for v in value)
            return f"[{items}]" if isinstance(value, list) else f"({items},)"
        return self.const(value)

    def produce(self, call: Call, index: int, method: int) -> str | None:
        """Name the tensors ``call`` returned; the name to assign, if any."""
        name = f"o{index}"
        if isinstance(call.out, torch.Tensor):
            self.produced[id(call.out)] = (name, method)
            return name
        if isinstance(call.out, (list, tuple)) and call.out:
            for k, t in enumerate(call.out):
                if isinstance(t, torch.Tensor):
                    self.produced[id(t)] = (f"{name}[{k}]", method)
            return name
        return None


def _spelling(call: Call, src: _Source, method: int) -> str:
    """The call as a hand-written map spells it, if that dispatches exactly ``call.op``;
    else a call of the op overload."""
    packet = call.op.overloadpacket.__name__
    args = [src.expr(a, method) for a in call.args]
    kwargs = [f"{k}={src.expr(v, method)}" for k, v in call.kwargs.items()]
    candidates: list[str] = []
    if packet == "index" and len(call.args) == 2 and len(call.args[1]) == 1:
        candidates.append(f"{args[0]}[{src.expr(call.args[1][0], method)}]")
    if packet == "_local_scalar_dense":
        candidates.append(f"{args[0]}.item()")
    if (
        call.args
        and isinstance(call.args[0], torch.Tensor)
        and hasattr(torch.Tensor, packet)
    ):
        candidates.append(f"{args[0]}.{packet}({', '.join(args[1:] + kwargs)})")
    namespace = {**src.names, **_produced_read(src, call)}
    for text in candidates:
        code = compile(text, "<relay bench floor>", "eval")
        try:
            counts = count_ops(functools.partial(eval, code, namespace))
        except Exception:  # noqa: BLE001, S112 - a spelling that does not fit is not used
            continue
        if (*counts.data, *counts.views) == (packet,):
            return text
    return f"{src.const(getattr(call.op, '_op', call.op))}({', '.join(args + kwargs)})"


def _produced_read(src: _Source, call: Call) -> dict[str, Any]:
    """The produced tensors ``call`` reads, bound to their names (``o3``, or ``o3`` as
    a dict for ``o3[1]``), to try a spelling."""
    out: dict[str, Any] = {}
    for value in [*call.args, *call.kwargs.values()]:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, torch.Tensor) and id(v) in src.produced:
                name = src.produced[id(v)][0]
                if "[" in name:
                    base, k = name.rstrip("]").split("[")
                    out.setdefault(base, {})[int(k)] = v
                else:
                    out[name] = v
    return out


def floor_calls(recording: Recording) -> list[tuple[str, Callable[[], None]]]:
    """One bare function per recorded method, making the recorded calls in order."""
    src = _Source()
    bodies: list[tuple[str, list[tuple[str | None, str]]]] = []
    index = 0
    for m, (method, calls) in enumerate(recording.methods):
        lines = []
        for call in calls:
            text = _spelling(call, src, m)
            lines.append((src.produce(call, index, m), text))
            index += 1
        bodies.append((method, lines))
    source = []
    for m, (_, lines) in enumerate(bodies):
        shared = sorted({t for t, _ in lines if t in src.read_elsewhere})
        source.append(f"def m{m}():")
        if shared:
            source.append(f"    global {', '.join(shared)}")
        source += [f"    {t} = {e}" if t else f"    {e}" for t, e in lines]
        source.append("    return None")
    namespace = dict(src.names)
    exec(compile("\n".join(source), "<relay bench floor>", "exec"), namespace)  # noqa: S102
    return [(method, namespace[f"m{m}"]) for m, (method, _) in enumerate(bodies)]
