"""The floors: a generated map's step as the same torch calls on its own buffers, built
from the schema, checked or bare (docs/bench.md, the floors)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from relay.bench.sides import (
    SEQ_LENS_PLUS_ONE,
    Shape,
    Side,
    advance_seq_lens,
    new_batch,
)
from relay.codegen.layout import packed_groups
from relay.device import CpuPolicy, HostMirror, policy_for
from relay.runtime import HOST_SLOTS_IN_PYTHON_MAX as SLOTS_LISTED
from relay.runtime import HOST_SUM_IN_PYTHON_MAX, slot_set
from relay.schema import Field, Lane, Resolve, Schema, TargetShape, resolve_method

__all__ = ["Plain", "Unsupported", "build_plain"]


class Unsupported(Exception):
    """A step the floor does not write (placeholders, scatters): no floor is reported."""


@attrs.define
class Plain(Side):
    """A floor, driven as a side: its source and the names its functions read (the
    workload's values as ``v_<name>``)."""

    source: str = ""
    namespace: dict[str, Any] = attrs.field(factory=dict)


class _Builder:
    def __init__(
        self, schema: Schema, relay_map: Any, shape: Shape, work: Any, graph: bool
    ) -> None:
        self.schema, self.device, self.shape = schema, relay_map.device, shape
        self.graph = graph
        self.values: Mapping[str, torch.Tensor | None] = work.values
        self.batch = new_batch(work.indices, work.seq_lens)
        self.ns: dict[str, Any] = {"idx": work.indices, "batch": self.batch}
        self.ns["advance"] = advance_seq_lens
        self.carried: set[str] = set()
        for f in schema.fields:
            if not isinstance(f, Field):
                raise Unsupported(f"{f!r} is not a field")
            if f.resolve is not Resolve.GATHER:
                kind = "scatter" if f.scatter else getattr(f.resolve, "value", "?")
                raise Unsupported(f"{f.name} resolves by {kind}")
        self.ns["P"] = relay_map.pool_size
        self.ns["S"] = slot_set(relay_map.pool_size)
        self._buffers(relay_map)

    def _value(self, f: Field) -> torch.Tensor | None:
        if self.graph and f.graph_written:
            return None  # a captured graph wrote it: the map is handed None
        name = f.payload_name
        if name not in self.values:
            raise Unsupported(f"{f.name}: the workload has no {name}")
        self.ns[f"v_{name}"] = self.values[name]
        return self.values[name]

    def _buffers(self, relay_map: Any) -> None:
        """The map's buffers after its first stash (a packed group's: its views' base)."""
        ns = self.ns
        for g in packed_groups(self.schema):
            views = [getattr(relay_map, f"{m.field.name}_buf") for m in g.members]
            packed = views[0]._base
            if packed is None or any(v._base is not packed for v in views):
                raise Unsupported(f"no packed {g.dtype} buffer on the map")
            key = str(g.dtype).removeprefix("torch.")
            ns[f"p_{key}"] = packed
            ns[f"w_{key}"] = tuple(math.prod(v.shape[1:]) for v in views)
        for f in self.schema.fields:
            value = self._value(f)
            if value is not None or f.graph_written:  # a graph-written one: always
                self.carried.add(f.name)
            buf = getattr(relay_map, f"{f.name}_buf")
            if buf is not None:  # a lazy field never carried has none, and no ops
                ns[f"b_{f.name}"] = buf
            elif value is not None:
                raise Unsupported(f"{f.name}: no buffer after a stash that carried it")

    def fence(self) -> None:
        policy = policy_for(self.device)
        event = policy.new_event()
        self.ns["record"] = event.record  # on the current stream, as policy.record
        wait = functools.partial(policy.wait, event)  # the CPU's: the event's sync
        self.ns["wait"] = event.synchronize if type(policy) is CpuPolicy else wait

    def writes(self, fields: Sequence[Field], check: bool) -> list[str]:
        lines = []  # relay's host check of the slots (S: the pool's, runtime.slot_set)
        if check and self.device.type == "cpu" and self.shape.batch <= SLOTS_LISTED:
            lines.append("if not S.issuperset(idx.tolist()): raise IndexError(idx)")
        elif check and self.device.type == "cpu":
            out = "if lo.tolist() < 0 or hi.tolist() >= P: raise IndexError(idx)"
            lines += ["lo, hi = idx.aminmax()", out]
        for f in fields:
            if f"b_{f.name}" not in self.ns:
                continue  # a lazy field never carried: the map writes nothing either
            if (f.kept or f.graph_written) and self._value(f) is None:
                continue  # kept as it is, or written by the captured graph
            if f.name in self.carried:
                lines.append(f"b_{f.name}.index_copy_(0, idx, v_{f.payload_name})")
            else:
                lines.append(f"b_{f.name}.index_fill_(0, idx, 0)")  # omitted: cleared
        return lines

    def gather(self, f: Field) -> str:
        """``f``'s rows as the map hands them: a flat target's rows of one element
        from the buffer's flat view (Note [One-element rows] in relay/runtime.py)."""
        rows, buf = f"b_{f.name}.index_select(0, idx)", self.ns[f"b_{f.name}"]
        if f.target_shape is not TargetShape.FLAT:
            return rows
        if math.prod(buf.shape[1:]) != 1:
            return rows + ".flatten()"
        self.ns[f"f_{f.name}"] = buf.view(-1)
        return f"f_{f.name}.index_select(0, idx)"

    def resolve_future(self) -> list[str]:
        reads = [f for f in self.schema.fields if f.lane is Lane.FORWARD and f.target]
        lines, spelled = [], {}
        for f in reads:  # each dotted target's parent bound once
            first, _, rest = str(f.target).partition(".")
            if rest and f"{first} = batch.{first}" not in lines:
                lines.append(f"{first} = batch.{first}")
            spelled[f.name] = f.target if rest else f"batch.{f.target}"
        groups = packed_groups(self.schema)
        # Packed: one gather per group and per field of its own, then the views
        # (relay/codegen/layout.py, Note [Packed layout]).
        late = []
        for g in groups:
            key = str(g.dtype).removeprefix("torch.")
            names = ", ".join(f"r_{m.field.name}" for m in g.members)
            lines.append(f"g_{key} = p_{key}.index_select(0, idx)")
            late.append(f"{names}, = g_{key}.split_with_sizes(w_{key}, 1)")
        members = {m.field.name for g in groups for m in g.members}
        for f in reads:
            if f.name in members:
                unflatten = f".unflatten(1, b_{f.name}.shape[1:])"
                view = {0: ".squeeze(1)", 1: ""}.get(len(f.shape), unflatten)
                late.append(f"{spelled[f.name]} = r_{f.name}{view}")
            elif f.name not in self.carried:
                late.append(f"{spelled[f.name]} = None")
            elif groups:  # a packed map flattens after its gathers, as it is made
                flat = ".flatten()" if f.target_shape is TargetShape.FLAT else ""
                lines.append(f"r_{f.name} = b_{f.name}.index_select(0, idx){flat}")
                late.append(f"{spelled[f.name]} = r_{f.name}")
            else:
                lines.append(f"{spelled[f.name]} = {self.gather(f)}")
        return lines + late

    def resolve_schedule(self, f: Field) -> list[str]:
        if f.name not in self.carried:
            host = f.host
            nones = [f.target, *((host.mirror, host.sum) if host else ())]
            return ["wait()", *(f"batch.{p} = None" for p in nones if p)]
        lines = ["wait()", f"r = {self.gather(f)}"]
        if f.target is not None:
            lines.append(f"batch.{f.target} = r")
        host_mirror, host_sum = (f.host.mirror, f.host.sum) if f.host else (None, None)
        if host_mirror is None and host_sum is None:
            return lines
        mirror = HostMirror(self.device, self.shape.pool)
        if mirror.copy is torch.Tensor.clone:
            lines.append("h = r.clone()")
        else:
            self.ns[f"copy_{f.name}"] = mirror.copy  # the device policy's host copy
            lines.append(f"h = copy_{f.name}(r)")
        if host_mirror is not None:
            lines.append(f"batch.{host_mirror} = h")
        if host_sum is not None:  # the generated map's host sum, its branch taken
            dtype = f.dtype if isinstance(f.dtype, torch.dtype) else torch.float32
            total = "int(h.numpy().sum())"
            if dtype.is_floating_point or dtype.is_complex:
                total = "int(h.sum())"
            elif self.shape.batch <= HOST_SUM_IN_PYTHON_MAX:
                total = "sum(h.tolist())"
            lines.append(f"batch.{host_sum} = {total}")
        return lines


def build_plain(schema: Schema, relay_map: Any, shape: Shape, work: Any, methods: Sequence[str],
                *, graph: bool = False, check: bool = True) -> Plain:  # fmt: skip
    """The floor of ``relay_map`` (one stash in): a function per name of ``methods``."""
    b = _Builder(schema, relay_map, shape, work, graph)
    fields = schema.fields
    schedule = {resolve_method(f): f for f in fields if f.lane is Lane.SCHEDULE}
    if schedule:
        b.fence()
    # publish's parameters: the required schedule fields first.
    published = sorted((f for f in fields if f.lane is Lane.SCHEDULE), key=lambda f: f.optional)  # fmt: skip
    bodies: list[tuple[str, list[str]]] = []
    for name in methods:
        if name == "stash":
            body = b.writes([f for f in fields if f.lane is Lane.FORWARD], check)
        elif name == "publish":
            body = [*b.writes(published, check), "record()"]
        elif name == "resolve_future":
            body = b.resolve_future()
        elif name in schedule:
            body = b.resolve_schedule(schedule[name])
        elif name == SEQ_LENS_PLUS_ONE:
            body = ["advance(batch)"]  # the scheduler's own work, as the driver does it
        elif name == "graph_wrote" and graph:
            body = []  # debug mode's record of the graph's write: nothing to do here
        else:
            raise Unsupported(f"no plain {name}")
        bodies.append((name, body or ["pass"]))
    source = []
    for m, (_, body) in enumerate(bodies):
        source += [f"def m{m}():", *(f"    {line}" for line in body)]
    text = "\n".join(source) + "\n"
    step = "def step(): " + "; ".join(f"m{m}()" for m in range(len(bodies)))  # a map's
    exec(compile(f"{text}{step}\n", "<relay bench floor>", "exec"), b.ns)  # noqa: S102
    calls = tuple((name, b.ns[f"m{m}"]) for m, (name, _) in enumerate(bodies))
    return Plain(None, b.batch, calls, None, b.ns["step"], text, b.ns)
