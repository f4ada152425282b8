"""The lockstep harness: a generated map and the reference model, run on the same
operation sequences (drawn by Hypothesis), compared on every value handed over.

One call checks a schema::

    from relay.testing import check_lockstep
    check_lockstep(SCHEMA)                      # renders and imports the map itself
    check_lockstep(SCHEMA, MyFutureMap, dims={"hidden": 8}, operations=10_000)

Operations: stashes and publishes of random batches (size 0 included) into random
slots, payload dtypes other than the buffer's (cast), optional fields carried by some
writes and not others, NaN, inf and -1 among the values where no guard forbids them;
``invalidate`` then ``resolve_future`` with placeholder positions mixed with real
tokens; schedule-side resolves; releases and reuse of slots. Forward work runs on one
CPU ``ThreadStream``, publishes on it or on a second one, schedule resolves on the host,
as an overlap engine does. Only sequences a correct engine may issue are drawn (each
value read once, a publish before each schedule resolve), so the map runs in debug mode
and any debug report is a failure too.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import random
import sys
import typing
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from relay import debug as debug_mode
from relay.cpu_stream import ThreadStream, use_cpu_stream
from relay.schema import (
    Alloc,
    FromPayload,
    Guard,
    Lane,
    Members,
    Resolve,
    Schema,
    Switch,
    Unwritten,
)
from relay.schema import Field as FieldDecl
from relay.testing.model import ReferenceRelay, get_path, set_path

__all__ = [
    "LockstepDivergence",
    "Namespace",
    "check_lockstep",
    "load_map_class",
    "run_lockstep",
]


class LockstepDivergence(AssertionError):
    """The map and the model handed over different values (the message says where)."""


class _Unset:
    """What a batch attribute holds until the map (or model) sets it."""

    def __repr__(self) -> str:
        return "<never set>"


UNSET = _Unset()


class Namespace:
    """A batch (or ``spec_info``) with whatever attributes a map reads and writes."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)

    def __repr__(self) -> str:
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


def load_map_class(schema: Schema) -> type[Any]:
    """Render ``schema`` with the generator and import the class (needs ``relay.codegen``).

    The one use of the generator in ``relay.testing``: it makes the class under test and
    decides nothing the harness checks (the model states the semantics itself). The
    module is compiled from memory, nothing is written to disk; its source is kept in
    ``linecache`` under ``<relay.testing NAME>``, so tracebacks still show its lines."""
    from relay.codegen.render import render  # the subject, not the semantics

    name = f"_relay_lockstep_{schema.name.lower()}"
    source = render(schema, source=f"<{schema.name}>", command="relay.testing")
    filename = f"<relay.testing {schema.name}>"
    # No modification time: linecache.checkcache keeps the entry (there is no file).
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # typing.get_type_hints looks the module up
    # The generator's own output, rendered just above.
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102
    cls: type[Any] = getattr(module, schema.name)
    return cls


def _schedule_resolve(field: FieldDecl) -> str:
    """The schedule-side resolve of ``field``, as the generated class names it:
    ``resolve_`` and the last part of its host mirror, else of its target, else the
    field's name (``resolve_seq_lens_cpu``)."""
    leaf = (field.host.mirror if field.host else None) or field.target or field.name
    return f"resolve_{leaf.rsplit('.', 1)[-1]}"


def _host_paths(f: FieldDecl) -> list[str]:
    """The host copy and host sum ``f`` hands the scheduler, those it declares."""
    host = f.host
    return [p for p in ((host.mirror, host.sum) if host else ()) if p is not None]


def _scatter_paths(f: FieldDecl) -> list[str]:
    """The offsets, counts and row bounds a scatter field ``f`` reads, those it
    declares."""
    scatter = f.scatter
    if scatter is None:
        return []
    rows = scatter.rows
    paths = [scatter.offsets, scatter.lengths, scatter.when]
    paths += [rows.starts, rows.index] if rows is not None else []
    return [p for p in paths if p is not None]


def _payload_class(map_cls: type[Any]) -> type[Any] | None:
    stash = getattr(map_cls, "stash", None)
    if stash is None:
        return None
    hints = typing.get_type_hints(stash)
    payload: type[Any] = hints["payload"]
    return payload


def _scheduler_batch(
    schema: Schema, f: FieldDecl, indices: torch.Tensor, owners: list[int]
) -> Namespace:
    """The scheduler's object for ``f``'s resolve, where the schema names the schedule
    lane's own slots or owners: those, and ``f``'s targets, nothing of the forward
    batch (so a resolve that read a forward attribute would fail)."""
    batch = Namespace()
    slots = schema.slots_of(Lane.SCHEDULE)
    requests = schema.owners_of(Lane.SCHEDULE)
    given: list[tuple[str, Any]] = [
        (p, UNSET) for p in (f.target, *_host_paths(f)) if p
    ]
    given += [(slots, indices), *_owner_paths(requests, owners)]
    for path, value in given:
        *parents, leaf = path.split(".")
        node = batch
        for name in parents:
            if not hasattr(node, name):
                setattr(node, name, Namespace())
            node = getattr(node, name)
        setattr(node, leaf, value)
    return batch


def _new_batch(
    schema: Schema,
    indices: torch.Tensor,
    owners: list[int] | None = None,
    dims: Mapping[str, int] | None = None,
    counts: Mapping[str, list[int]] | None = None,
) -> Namespace:
    batch = Namespace()
    for f in schema.fields:
        for path in (f.target, *_host_paths(f), *_scatter_paths(f)):
            if path is None:
                continue
            *parents, leaf = path.split(".")
            node = batch
            for name in parents:
                if not hasattr(node, name):
                    setattr(node, name, Namespace())
                node = getattr(node, name)
            setattr(node, leaf, UNSET)
    set_path(batch, schema.indices, indices)
    # A flat target of each request's span and a gap, the gaps left alone: the span
    # holds the values of every scatter field into the target, a counted one's
    # ``counts`` of each row (its whole row where none are given). No gap where a field
    # is guarded non-negative: debug mode reports a negative value the scatter left.
    spans: dict[str, list[FieldDecl]] = {}
    for f in schema.fields:
        if f.scatter is not None and f.target:
            spans.setdefault(f.target, []).append(f)
    n = len(indices)
    for target, fields in spans.items():
        guarded = any(f.guard in (Guard.NON_NEGATIVE, Guard.POSITIVE) for f in fields)
        sizes = [0 if guarded else 1] * n
        for f in fields:
            row = [d if isinstance(d, int) else (dims or {}).get(d, 3) for d in f.shape]
            lengths = f.scatter.lengths if f.scatter else None
            taken = (counts or {}).get(lengths or "", [math.prod(row)] * n)
            sizes = [size + count for size, count in zip(sizes, taken)]
            if lengths is not None:
                set_path(batch, lengths, torch.tensor(taken, dtype=torch.int64))
            when = f.scatter.when if f.scatter else None
            if when is not None:  # every row laid in: the harness reads them all
                set_path(batch, when, torch.ones(n, dtype=torch.bool))
        first = fields[0]
        laid = first.scatter.cast if first.scatter is not None else None
        dtype = laid or first.dtype
        dtype = dtype if isinstance(dtype, torch.dtype) else torch.int64
        set_path(batch, target, torch.full((sum(sizes),), -7, dtype=dtype))
        starts = [sum(sizes[:request]) for request in range(n)]
        assert first.scatter is not None
        set_path(batch, first.scatter.offsets, torch.tensor(starts, dtype=torch.int64))
        for f in fields:  # each request's row: its span and its gap
            rows = f.scatter.rows if f.scatter else None
            if rows is not None:
                ends = torch.tensor([*starts, sum(sizes)], dtype=torch.int64)
                set_path(batch, rows.starts, ends)
                if rows.index is not None:
                    set_path(batch, rows.index, torch.arange(n))
    for f in schema.fields:  # a gated field: this batch's rows hold it
        if isinstance(f.gate, str):
            set_path(batch, f.gate, True)
    for path, value in _owner_paths(schema.owners, owners):
        set_path(batch, path, value)
    return batch


def _owner_paths(
    owners: str | Members | None, ids: list[int] | None
) -> list[tuple[str, Any]]:
    """Where a batch names the requests ``ids``: the owners path, or a ``Members``'
    requests with no member rows after them (its tail ``None``)."""
    if isinstance(owners, Members):
        return [(owners.requests, ids), (owners.tail, None)]
    return [(owners, ids)] if owners is not None else []


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point or a.dtype.is_complex:
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    return type(a) is type(b) and a == b


def _switches(schema: Schema, data: st.DataObject) -> dict[str, bool]:
    """Each ``Switch`` keyword drawn: some runs' maps are built not to relay a field."""
    named = [f.gate.keyword for f in schema.fields if isinstance(f.gate, Switch)]
    return {k: data.draw(st.booleans()) for k in dict.fromkeys(named)}


class _Driver:
    """One lockstep run: the map, the model, the streams, and what may be read next."""

    def __init__(
        self,
        schema: Schema,
        map_cls: type[Any],
        data: st.DataObject,
        *,
        pool_size: int,
        max_batch: int,
        dims: Mapping[str, int],
        debug: bool,
        device: torch.device,
        forward: ThreadStream,
        second: ThreadStream,
        threads: bool,
    ) -> None:
        self.schema = schema
        self.data = data
        self.pool_size = pool_size
        self.max_batch = max_batch
        self.dims = dims
        self.device = device
        self.forward = forward
        self.second = second
        self.threads = threads
        keywords: dict[str, Any] = {
            name: dims[name]
            for name in typing.get_type_hints(map_cls.__init__)
            if name in dims
        }
        # Graph-written fields: the engine's own buffers, handed over in some runs.
        self.graph_fields = [f for f in schema.fields if f.graph_written]
        adopt: bool = bool(self.graph_fields) and data.draw(st.booleans())
        if adopt:
            for f in self.graph_fields:
                assert isinstance(f.dtype, torch.dtype)
                shape = (pool_size, *self._row_shape(f))
                keywords[f"{f.name}_buf"] = torch.zeros(shape, dtype=f.dtype)
        keywords.update(switches := _switches(schema, data))
        self.map = map_cls(device, pool_size, debug=debug, **keywords)
        self.tails_fields = [f for f in schema.fields if f.tails is not None]
        # Graph-written schedule rows not yet behind a publish's fence.
        self.behind_graph: set[int] = set()
        self.model = ReferenceRelay(schema, dims, switches)
        self.payload_cls = _payload_class(map_cls)
        self.forward_fields = [f for f in schema.fields if f.lane is Lane.FORWARD]
        self.schedule_fields = [f for f in schema.fields if f.lane is Lane.SCHEDULE]
        self.consumer = {f.name: _schedule_resolve(f) for f in self.schedule_fields}
        # What a correct engine may read next: per field the slots written and not yet
        # read; the consumers with a publish since their last wait.
        self.fresh: dict[str, set[int]] = {f.name: set() for f in schema.fields}
        # Fields whose unwritten rows read as zeros: the slots no write has reached.
        self.unwritten: dict[str, set[int]] = {
            f.name: set(range(1, pool_size))
            for f in schema.fields
            if f.unwritten is Unwritten.ZEROS
        }
        self.fence_fresh: set[str] = set()
        #: Counted scatters (``lengths``): the count each slot's latest stash carried.
        counted = [f.scatter.lengths for f in schema.fields if f.scatter is not None]
        self.produced: dict[str, dict[int, int]] = {c: {} for c in counted if c}
        # FROM_PAYLOAD fields: the dtype of the first payload, drawn once per run.
        self.payload_dtype = {
            f.name: data.draw(
                st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
            )
            for f in schema.fields
            if isinstance(f.dtype, FromPayload)
        }
        self.history: list[str] = []
        #: Each slot's request id (a schema's ``owners``): new after each release.
        self.owner: dict[int, int] = {}
        self.busy: ThreadStream | None = None  # the stream with work not drained yet
        self.kinds = self._kinds()
        # One integer per operation (Hypothesis' per-draw cost dominates otherwise): the
        # kind, the batch size and the index dtype in its low digits, a seed for the
        # rest above them; shrinking it shrinks towards the first kind and empty batches.
        self.operations = st.integers(0, 2**48 - 1)
        self.size = 0
        self.int32 = False
        self.rng = random.Random(0)

    # -- helpers -----------------------------------------------------------------------
    def _owners(self, indices: torch.Tensor) -> list[int]:
        """The request each slot of ``indices`` holds now (a schema's ``owners``)."""
        return [self.owner.get(s, s) for s in indices.tolist()]

    def _owned(
        self, indices: torch.Tensor, lane: Lane | None = Lane.FORWARD
    ) -> dict[str, list[int]]:
        """``owners=`` for a write of ``lane`` (of either lane: ``None``), where the
        schema declares owners its resolves read."""
        named = {
            Lane.FORWARD: self.schema.owners,
            Lane.SCHEDULE: self.schema.owners_of(Lane.SCHEDULE),
            None: self.schema.owners or self.schema.owners_of(Lane.SCHEDULE),
        }[lane]
        return {"owners": self._owners(indices)} if named else {}

    def _on(self, stream: ThreadStream, fn: Callable[[], None]) -> None:
        """Run ``fn`` on ``stream``. The harness orders its streams (work on one stream
        follows everything before it on the other), so its own writes never race; the
        debug checks would rightly say so.

        With ``threads``, ``fn`` is queued on the stream's worker without waiting, as an
        engine launches work (the other stream drained first). Without, it runs on this
        thread with ``stream`` current (``use_cpu_stream``): the same streams as far as
        the map and the checker can tell, without a thread hand-off per operation; the
        order between streams is then reported as a stream wait, as an engine would."""
        previous = self.busy
        if self.threads:
            if previous is not None and previous is not stream:
                previous.synchronize()
            stream.submit(fn)
        else:
            if previous is not None and previous is not stream:
                debug_mode.wait_stream(stream, previous)
            with use_cpu_stream(stream):
                fn()
        self.busy = stream

    def _drain(self) -> None:
        if self.busy is not None and self.threads:
            self.busy.synchronize()
            self.busy = None

    def _indices(self, slots: list[int]) -> torch.Tensor:
        dtype = torch.int32 if self.int32 else torch.int64
        return torch.tensor(slots, dtype=dtype, device=self.device)

    def _row_shape(self, f: FieldDecl) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else self.dims[d] for d in f.shape)

    def _dtype_choices(self, f: FieldDecl) -> list[torch.dtype]:
        """Payload dtypes for ``f``: the buffer's, and one the map must cast from (a
        widening one: a narrowing integer cast is refused)."""
        declared = f.dtype
        if isinstance(declared, FromPayload):
            return [self.payload_dtype[f.name]]
        if declared == torch.bool:
            return [torch.bool]
        if declared.is_floating_point:
            return [declared, torch.float64]
        return [declared, torch.int32 if declared != torch.int32 else torch.int16]

    def _value(self, f: FieldDecl, n: int) -> torch.Tensor:
        """``n`` random rows for ``f``, in a payload dtype that may differ from the buffer's."""
        dtype = self.rng.choice(self._dtype_choices(f))
        g = torch.Generator().manual_seed(self.rng.randrange(2**31))
        shape = (n, *self._row_shape(f))
        if dtype == torch.bool:
            value = torch.randint(0, 2, shape, generator=g).bool()
        elif dtype.is_floating_point:
            value = torch.randn(shape, generator=g).to(dtype)
            if f.guard is not Guard.NONE:
                value = value.abs() + 1
            elif n and self.rng.random() < 0.3:
                # Legal values, never a debug report (no Guard declared).
                value.view(-1)[0] = self.rng.choice((math.nan, math.inf, -math.inf))
        else:
            low = {Guard.POSITIVE: 1, Guard.NON_NEGATIVE: 0}.get(f.guard, -2)
            if f.tails is not None and f.tails.kv is not None:  # a KV column in its row
                low = max(low, 1 - f.tails.add)
            value = torch.randint(low, 1000, shape, generator=g).to(
                dtype
            )  # -1 included
        return value.to(self.device)

    def _slots(self, candidates: set[int] | range) -> list[int]:
        """Up to the drawn batch size of distinct ``candidates``, in random order."""
        pool = sorted(candidates)
        return self.rng.sample(pool, min(self.size, len(pool)))

    def _compare(
        self, what: str, map_batch: Any, model_batch: Any, paths: list[str]
    ) -> None:
        for path in paths:
            got, want = get_path(map_batch, path), get_path(model_batch, path)
            if not _same(got, want):
                recent = "\n  ".join(self.history[-12:])
                raise LockstepDivergence(
                    f"{self.schema.name}: after {what}, batch.{path} differs\n"
                    f"  map:   {got!r}\n  model: {want!r}\n"
                    f"recent operations (oldest first):\n  {recent}"
                )

    # -- operations --------------------------------------------------------------------
    def _kinds(self) -> list[str]:
        kinds = ["release"]
        if self.forward_fields:
            kinds += ["stash", "stash", "resolve_future", "resolve_future"]
        if any(f.kept for f in self.forward_fields):
            kinds.append("stash_partial")
        if self.graph_fields:
            kinds.append("graph")
        kinds += [f"tails:{f.name}" for f in self.tails_fields]
        if self.schedule_fields:
            kinds += [
                "publish",
                "publish",
                *(f"resolve:{f.name}" for f in self.schedule_fields),
            ]
        return kinds

    def step(self) -> None:
        code = self.data.draw(self.operations, label="operation")
        code, kind_index = divmod(code, len(self.kinds))
        code, self.size = divmod(code, self.max_batch + 1)
        seed, int32 = divmod(code, 2)
        kind, self.int32 = self.kinds[kind_index], bool(int32)
        self.rng = random.Random(seed)
        if kind == "stash":
            self.stash()
        elif kind == "stash_partial":
            self.stash_partial()
        elif kind == "graph":
            self.graph()
        elif kind.startswith("tails:"):
            self.resolve_tails(self.model.fields[kind.split(":", 1)[1]])
        elif kind == "publish":
            self.publish()
        elif kind == "resolve_future":
            self.resolve_future()
        elif kind == "release":
            self.release()
        else:
            self.resolve_schedule(self.model.fields[kind.split(":", 1)[1]])

    def _write_values(
        self, fields: list[FieldDecl], n: int
    ) -> dict[str, torch.Tensor | None]:
        values: dict[str, torch.Tensor | None] = {}
        for f in fields:
            carried = not (f.optional or f.graph_written) or self.rng.random() < 0.6
            values[f.payload_name] = self._value(f, n) if carried else None
        return values

    def _wrote(
        self, fields: list[FieldDecl], slots: list[int], values: Mapping[str, Any]
    ) -> None:
        if not slots:
            return
        for f in fields:
            if values[f.payload_name] is None and (f.kept or f.graph_written):
                continue  # left to the rows' earlier value, or to the graph
            self.unwritten.get(f.name, set()).difference_update(slots)
            if values[f.payload_name] is None:
                self.fresh[f.name] -= set(slots)
            else:
                self.fresh[f.name] |= set(slots)

    def stash(self) -> None:
        slots = self._slots(range(1, self.pool_size))
        indices = self._indices(slots)
        values = self._write_values(self.forward_fields, len(slots))
        for f in self.forward_fields:
            lengths = f.scatter.lengths if f.scatter else None
            if lengths is not None:  # the producer's count: 0 to the row's width
                width = math.prod(self._row_shape(f))
                made = [self.rng.randint(0, width) for _ in slots]
                values[lengths.rsplit(".", 1)[-1]] = torch.tensor(
                    made, dtype=torch.int64, device=self.device
                )
                self.produced[lengths].update(zip(slots, made))
        assert self.payload_cls is not None
        payload = self.payload_cls(**values)
        self.history.append(f"stash({slots}, {_describe(values)})")
        owners = self._owned(indices)
        self._on(self.forward, lambda: self.map.stash(indices, payload, **owners))
        self.model.stash(slots, values)
        self._wrote(self.forward_fields, slots, values)

    def publish(self) -> None:
        slots = self._slots(range(1, self.pool_size))
        indices = self._indices(slots)
        values = self._write_values(self.schedule_fields, len(slots))
        stream = self.rng.choice([self.forward, self.second])
        self.history.append(f"publish({slots}, {_describe(values)}) on {stream.name}")
        owners = self._owned(indices, Lane.SCHEDULE)
        self._on(stream, lambda: self.map.publish(indices, **values, **owners))
        self.model.publish(slots, values)
        self._wrote(self.schedule_fields, slots, values)
        if slots:
            self.fence_fresh = set(self.consumer.values())
            for f in self.schedule_fields:  # the graph's rows, now behind the fence
                if f.graph_written:
                    self.fresh[f.name] |= self.behind_graph
            self.behind_graph = set()

    def stash_partial(self) -> None:
        """A partial stash over rows whose kept fields still hold a value to keep."""
        partial = [f for f in self.forward_fields if not f.kept]
        candidates = set(range(1, self.pool_size))
        for f in self.forward_fields:
            if f.kept and self._keeps(f):
                candidates &= self.fresh[f.name] | self._zeros(f)
        slots = self._slots(candidates)
        indices = self._indices(slots)
        values = self._write_values(partial, len(slots))
        self.history.append(f"stash_partial({slots}, {_describe(values)})")
        owners = self._owned(indices)
        self._on(
            self.forward, lambda: self.map.stash_partial(indices, **values, **owners)
        )
        self.model.stash_partial(slots, values)
        self._wrote(partial, slots, values)

    def _zeros(self, f: FieldDecl) -> set[int]:
        """The slots of ``f`` that read as zeros: never written, of a field declared
        ``Unwritten.ZEROS`` whose buffer exists (a lazy one's is made by its first
        write; before it a resolve refuses, there being no row shape to read)."""
        if f.alloc is Alloc.LAZY and not self.model.written[f.name]:
            return set()
        return self.unwritten.get(f.name, set())

    def _keeps(self, f: FieldDecl) -> bool:
        """Whether debug mode checks kept field ``f``'s rows in a partial stash: it has
        a buffer, and (optional) the latest write carried it."""
        if f.alloc is Alloc.LAZY and not self.model.written[f.name]:
            return False  # no buffer yet
        return self.model.hands_over(f.name)

    def graph(self) -> None:
        """A captured graph writes rows of every graph-written field into the map's
        buffers, on the forward stream, and the engine declares it (graph_wrote)."""
        slots = self._slots(range(1, self.pool_size))
        indices = self._indices(slots)
        values = {f.name: self._value(f, len(slots)) for f in self.graph_fields}
        self.history.append(f"graph_wrote({slots}, {_describe(values)})")
        buffers = {
            f.name: getattr(self.map, f"{f.name}_buf") for f in self.graph_fields
        }
        owners = self._owned(indices, None)

        def run() -> None:
            for name, value in values.items():
                buffers[name][indices.long()] = value.to(buffers[name].dtype)
            self.map.graph_wrote(indices, **owners)

        self._on(self.forward, run)
        self.model.graph_wrote(slots, values)
        for f in self.graph_fields:
            self.unwritten.get(f.name, set()).difference_update(slots)  # as a write
            if f.lane is Lane.FORWARD:
                self.fresh[f.name] |= set(slots)
            else:  # read only behind the next publish's fence
                self.fresh[f.name] -= set(slots)
                self.behind_graph |= set(slots)

    def resolve_tails(self, f: FieldDecl) -> None:
        """resolve_tails over a mixed batch: prefill rows, then decode rows whose
        published lengths a reader may still take (a second read: nothing consumed)."""
        tails = f.tails
        assert tails is not None and f.target is not None
        mirror, total_path = (f.host.mirror, f.host.sum) if f.host else (None, None)
        slots = self._slots(self.fresh[f.name])  # published behind the fence, unread
        indices = self._indices(slots)
        prefill = self.rng.randrange(3)
        total = prefill + len(slots)
        g = torch.Generator().manual_seed(self.rng.randrange(2**31))
        lengths = torch.randint(1, 50, (total,), generator=g)
        batches = []
        for _ in range(2):
            batch = Namespace()
            set_path(batch, tails.rows, indices.clone())
            set_path(batch, f.target, lengths.clone())
            if mirror is not None:
                set_path(batch, mirror, lengths.clone())
            if total_path is not None:
                set_path(batch, total_path, int(lengths.sum()))
            if tails.kv is not None:
                set_path(batch, tails.kv.locations, torch.arange(total) * 7)
                width = 1002  # every published length the harness draws, and 1 more
                table = torch.arange(self.pool_size * width).reshape(-1, width)
                set_path(batch, tails.kv.table, table)
            if tails.prefix is not None:
                set_path(batch, tails.prefix, [int(x) - 1 for x in lengths])
            if self.schema.owners is not None:
                # One request per batch row: the prefill rows' new requests (no
                # slot's), then the decode rows' (the tails are the last rows).
                newcomers = [-1 - row for row in range(prefill)]
                named = newcomers + self._owners(indices)
                for path, value in _owner_paths(self.schema.owners, named):
                    set_path(batch, path, value)
            batches.append(batch)
        map_batch, model_batch = batches
        self.history.append(f"resolve_tails({slots})")
        self.map.resolve_tails(map_batch)  # on the host, behind the map's fence
        self.model.resolve_tails(f.name, model_batch)
        locations = tails.kv.locations if tails.kv else None
        paths = [f.target, locations, mirror, total_path, tails.prefix]
        if slots:
            self._compare(
                f"resolve_tails({slots})",
                map_batch,
                model_batch,
                [p for p in paths if p is not None],
            )

    def release(self) -> None:
        slots = self._slots(range(1, self.pool_size))
        indices = self._indices(slots)
        self.history.append(f"release({slots})")
        self._on(self.forward, lambda: self.map.release(indices))
        self.model.release(slots)
        for fresh in self.fresh.values():
            fresh -= set(slots)
        self.behind_graph -= set(slots)
        for slot in slots:  # the slot's next request is another one
            self.owner[slot] = self.owner.get(slot, slot) + self.pool_size

    def resolve_future(self) -> None:
        read = [
            f
            for f in self.forward_fields
            if f.target is not None
            and (self.model.hands_over(f.name) or f.scatter is not None)
        ]
        candidates = set(range(1, self.pool_size))
        for f in read:
            candidates &= self.fresh[f.name] | self._zeros(f)
        order = self._slots(candidates)  # picks come in any order
        indices = self._indices(list(order))
        # The consumer's counts: what the stash wrote, or fewer (a trim).
        counts = {
            path: [
                made if self.rng.random() < 0.5 else self.rng.randint(0, made)
                for made in (produced.get(slot, 0) for slot in order)
            ]
            for path, produced in self.produced.items()
        }
        map_batch, model_batch = (
            _new_batch(self.schema, indices, self._owners(indices), self.dims, counts),
            _new_batch(
                self.schema, indices.clone(), self._owners(indices), self.dims, counts
            ),
        )
        paths: list[str] = []
        for f in self.forward_fields:
            if f.target is None:
                continue
            paths.append(f.target)
            if f.resolve is Resolve.PLACEHOLDER:
                self.map.invalidate(map_batch, indices)
                self.model.invalidate(model_batch, indices)
        # A mixed batch: some placeholder positions hold real tokens already.
        for f in self.forward_fields:
            if f.resolve is Resolve.PLACEHOLDER and f.target is not None and order:
                real = [
                    self.rng.randrange(51) if self.rng.random() < 0.25 else None
                    for _ in order
                ]
                for target in (
                    get_path(map_batch, f.target),
                    get_path(model_batch, f.target),
                ):
                    for position, token in enumerate(real):
                        if token is not None:
                            target[position] = token
        self.history.append(f"resolve_future({list(order)})")
        self._on(self.forward, lambda: self.map.resolve_future(map_batch))
        self._drain()
        self.model.resolve_future(model_batch)
        if order:
            self._compare(
                f"resolve_future({list(order)})", map_batch, model_batch, paths
            )
            for f in read:
                self.fresh[f.name] -= set(order)

    def resolve_schedule(self, f: FieldDecl) -> None:
        consumer = self.consumer[f.name]
        reads = self.model.hands_over(f.name)
        candidates = self.fresh[f.name] if reads else set(range(1, self.pool_size))
        if consumer not in self.fence_fresh:
            candidates = set()  # no publish since the last wait: only an empty batch
        slots = self._slots(candidates)
        indices = self._indices(slots)
        if self.schema.schedule is not None:
            map_batch, model_batch = (
                _scheduler_batch(self.schema, f, indices, self._owners(indices)),
                _scheduler_batch(
                    self.schema, f, indices.clone(), self._owners(indices)
                ),
            )
        else:
            map_batch, model_batch = (
                _new_batch(self.schema, indices, self._owners(indices), self.dims),
                _new_batch(
                    self.schema, indices.clone(), self._owners(indices), self.dims
                ),
            )
        ordered = f.host is not None and f.host.stream_ordered
        ordered = ordered and self.rng.random() < 0.5
        keywords = {"stream_ordered": True} if ordered else {}
        self.history.append(
            f"{consumer}({slots}{', stream_ordered' if ordered else ''})"
        )
        getattr(self.map, consumer)(map_batch, **keywords)  # behind the map's fence
        self.model.resolve_schedule(f.name, model_batch)
        if slots:
            paths = [p for p in (f.target, *_host_paths(f)) if p is not None]
            self._compare(f"{consumer}({slots})", map_batch, model_batch, paths)
            self.fence_fresh.discard(consumer)
            if reads:
                self.fresh[f.name] -= set(slots)


def _describe(values: Mapping[str, torch.Tensor | None]) -> str:
    return ", ".join(
        f"{k}=None" if v is None else f"{k}={v.dtype}{tuple(v.shape)}"
        for k, v in values.items()
    )


def _default_dims(schema: Schema, dims: Mapping[str, int] | None) -> dict[str, int]:
    chosen = {}
    for f in schema.fields:
        for d in f.shape:
            if isinstance(d, str):
                chosen[d] = 3
    chosen.update(dims or {})
    return chosen


def run_lockstep(
    schema: Schema,
    map_cls: type[Any],
    data: st.DataObject,
    *,
    steps: int = 100,
    pool_size: int = 9,
    max_batch: int = 4,
    dims: Mapping[str, int] | None = None,
    debug: bool = True,
    device: torch.device | str = "cpu",
    threads: bool = False,
) -> int:
    """Run ``steps`` operations drawn from ``data`` on a fresh map and model; returns the
    number run. Use it inside your own ``@given(st.data())`` test.

    In debug mode the happens-before clocks are installed for the run (and left as they
    were after it), so an unordered read or write fails it too."""
    with debug_mode.happens_before() if debug else contextlib.nullcontext():
        return _run(
            schema,
            map_cls,
            data,
            steps=steps,
            pool_size=pool_size,
            max_batch=max_batch,
            dims=dims,
            debug=debug,
            device=device,
            threads=threads,
        )


def _run(
    schema: Schema,
    map_cls: type[Any],
    data: st.DataObject,
    *,
    steps: int,
    pool_size: int,
    max_batch: int,
    dims: Mapping[str, int] | None,
    debug: bool,
    device: torch.device | str,
    threads: bool,
) -> int:
    forward, second = (
        ThreadStream("lockstep-forward"),
        ThreadStream("lockstep-publisher"),
    )
    try:
        driver = _Driver(
            schema,
            map_cls,
            data,
            pool_size=pool_size,
            max_batch=max_batch,
            dims=_default_dims(schema, dims),
            debug=debug,
            device=torch.device(device),
            forward=forward,
            second=second,
            threads=threads,
        )
        for _ in range(steps):
            driver.step()
        driver._drain()
        return steps
    finally:
        forward.close()
        second.close()


def check_lockstep(
    schema: Schema | ModuleType,
    map_cls: type[Any] | None = None,
    *,
    operations: int = 10_000,
    steps: int = 100,
    pool_size: int = 9,
    max_batch: int = 4,
    dims: Mapping[str, int] | None = None,
    debug: bool = True,
    device: torch.device | str = "cpu",
    threads: bool = False,
    shrink: bool = True,
) -> int:
    """Check a generated map against the reference model on at least ``operations``
    operations (in runs of ``steps``); raises ``LockstepDivergence`` (shrunk by
    Hypothesis) or the map's own error. Returns the number of operations run.

    ``schema`` is a ``Schema`` or a schema module holding ``SCHEMA``; ``map_cls`` the
    generated class (rendered and imported from the schema when omitted); ``dims`` the
    sizes of symbolic dims (3 where not given); ``threads`` runs the two streams on
    worker threads (slower; see ``_Driver._on``); ``shrink=False`` reports the first
    failing sequence as found instead of shrinking it (minutes for a long sequence).
    """
    if isinstance(schema, ModuleType):
        schema = typing.cast(Schema, schema.SCHEMA)
    cls = map_cls if map_cls is not None else load_map_class(schema)
    runs = math.ceil(operations / steps)
    done = [0]

    @settings(
        max_examples=runs,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate],
    )
    @given(data=st.data())
    def lockstep(data: st.DataObject) -> None:
        done[0] += run_lockstep(
            schema,
            cls,
            data,
            steps=steps,
            pool_size=pool_size,
            max_batch=max_batch,
            dims=dims,
            debug=debug,
            device=device,
            threads=threads,
        )

    lockstep()
    return done[0]
