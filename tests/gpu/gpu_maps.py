"""The bundled maps, found by module and driven generically, for the GPU tests.

Schemas change while these tests stay put, so nothing here names a field. Each module
of ``relay/maps/`` is one map; its schema (``relay/schemas/<module>.py``, the file it was
generated from) gives each field's lane, row shape, dtype, payload name and target;
the generated classes give the rest (constructor dims, payload fields, publish
keywords, schedule-side resolves). Whatever the driver cannot drive (a symbolic dim
with no size here, a payload field with no schema field) fails the test loudly,
naming the map and what to add.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math
import pkgutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import torch

import relay.maps
from relay.schema import Field, Lane, Resolve, Schema, TargetShape

REPO = Path(__file__).resolve().parents[2]

#: Sizes of the schemas' symbolic dims: small, and distinct so a wrong axis is a wrong shape.
DIM_SIZES: dict[str, int] = {
    "topk": 3,
    "hidden": 16,
    "draft_tokens": 5,
    "vocab": 24,
    "dsa_topk": 6,
    "draft_token_num": 4,
}

#: The dtype given to fields whose dtype comes from the payload (hidden states are bf16).
FROM_PAYLOAD_DTYPE = torch.bfloat16


class DriverError(AssertionError):
    """The generic driver cannot drive a bundled map; the message says what to add."""


def map_modules() -> list[str]:
    """The module names of ``relay/maps/`` (one generated map each; private helpers
    excluded), sorted."""
    names = (info.name for info in pkgutil.iter_modules(relay.maps.__path__))
    return sorted(name for name in names if not name.startswith("_"))


def _load_schema(stem: str) -> Schema:
    path = REPO / "relay" / "schemas" / f"{stem}.py"
    if not path.is_file():
        raise DriverError(
            f"relay/maps/{stem}.py has no schema at relay/schemas/{stem}.py; the GPU tests read "
            "each map's schema by module name (relay generate names modules after schemas)"
        )
    spec = importlib.util.spec_from_file_location(f"_gpu_tests_schema_{stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    schema = getattr(module, "SCHEMA", None)
    if not isinstance(schema, Schema):
        raise DriverError(f"schemas/{stem}.py defines no SCHEMA = Schema(...)")
    return schema


def _one(stem: str, module: Any, suffix: str, *, required: bool) -> type[Any] | None:
    names = getattr(module, "__all__", None) or [
        n for n in vars(module) if not n.startswith("_")
    ]
    found = [
        getattr(module, name)
        for name in names
        if name.endswith(suffix) and isinstance(getattr(module, name), type)
    ]
    if len(found) > 1 or (required and not found):
        raise DriverError(
            f"relay/maps/{stem}.py exports {len(found)} classes named *{suffix}; the GPU "
            f"tests expect {'exactly one' if required else 'at most one'}"
        )
    return found[0] if found else None


def _row(stem: str, field: Field) -> tuple[int, ...]:
    row: list[int] = []
    for dim in field.shape:
        if isinstance(dim, str):
            if dim not in DIM_SIZES:
                raise DriverError(
                    f"{stem}.{field.name}: symbolic dim {dim!r} has no size; add "
                    f"{dim!r}: <small int> to DIM_SIZES in tests/gpu/gpu_maps.py"
                )
            row.append(DIM_SIZES[dim])
        else:
            row.append(dim)
    return tuple(row)


def _dtype(field: Field) -> torch.dtype:
    return field.dtype if isinstance(field.dtype, torch.dtype) else FROM_PAYLOAD_DTYPE


def values_for(field: Field, row: tuple[int, ...], n: int, base: int) -> torch.Tensor:
    """``n`` host rows for ``field``, distinct per ``base``; valid under every guard
    (ints >= 1), exact in every float dtype (quarters below 25)."""
    dtype = _dtype(field)
    codes = torch.arange(base, base + n * math.prod(row), dtype=torch.int64).reshape(
        n, *row
    )
    if dtype == torch.bool:
        return codes % 2 == 1
    if dtype.is_floating_point:
        return ((codes % 97 + 1).to(torch.float64) / 4).to(dtype)
    if dtype.is_complex:
        raise DriverError(
            f"{field.name}: complex fields are not driven by the GPU tests"
        )
    modulus = min(torch.iinfo(dtype).max, 1_000_000)
    return (codes % modulus + 1).to(dtype)


def get_path(obj: Any, path: str) -> Any:
    """``obj.a.b`` for ``path == "a.b"``."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def set_path(obj: Any, path: str, value: Any) -> None:
    """``obj.a.b = value`` for ``path == "a.b"``, making missing parents."""
    *parents, leaf = path.split(".")
    for part in parents:
        if not hasattr(obj, part):
            setattr(obj, part, SimpleNamespace())
        obj = getattr(obj, part)
    setattr(obj, leaf, value)


@attrs.frozen
class BundledMap:
    """One bundled map and what the driver knows of it."""

    stem: str
    cls: type[Any]
    payload_cls: type[Any] | None
    schema: Schema
    dims: Mapping[str, int]
    rows: Mapping[str, tuple[int, ...]]  # field name -> row shape at DIM_SIZES
    schedule_resolves: tuple[str, ...]  # resolve_* methods besides resolve_future

    @property
    def forward(self) -> list[Field]:
        return [f for f in self.schema.fields if f.lane is Lane.FORWARD]

    @property
    def schedule(self) -> list[Field]:
        return [f for f in self.schema.fields if f.lane is Lane.SCHEDULE]

    @property
    def placeholders(self) -> list[Field]:
        return [
            f for f in self.forward if f.resolve is Resolve.PLACEHOLDER and f.target
        ]

    @property
    def mirrored(self) -> list[Field]:
        """Schedule fields copied to the host (through the pinned mirror on CUDA)."""
        return [f for f in self.schedule if f.host and f.host.mirror]

    def new(self, device: torch.device, pool_size: int, *, debug: bool = False) -> Any:
        """A fresh map on ``device``."""
        return self.cls(device, pool_size, debug=debug, **self.dims)

    def values(
        self, fields: Sequence[Field], n: int, base: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """Rows for ``n`` slots of each field, by field name, on ``device``."""
        return {
            f.name: values_for(f, self.rows[f.name], n, base + 7919 * i).to(device)
            for i, f in enumerate(fields)
        }

    def stash(
        self, relay: Any, indices: torch.Tensor, values: Mapping[str, torch.Tensor]
    ) -> None:
        """``relay.stash`` with a payload built from the generated payload class."""
        if self.payload_cls is None:
            return
        names = {f.payload_name: f.name for f in self.forward}
        payload = self.payload_cls(
            **{a.name: values[names[a.name]] for a in attrs.fields(self.payload_cls)}
        )
        relay.stash(indices, payload)

    def publish(
        self, relay: Any, indices: torch.Tensor, values: Mapping[str, torch.Tensor]
    ) -> None:
        """``relay.publish`` with each schedule field as its keyword."""
        if self.schedule:
            relay.publish(
                indices, **{f.payload_name: values[f.name] for f in self.schedule}
            )

    def batch(self, indices: torch.Tensor) -> SimpleNamespace:
        """An engine batch over ``indices`` with every attribute the map reads or writes."""
        batch = SimpleNamespace()
        set_path(batch, self.schema.indices, indices)
        for f in self.schema.fields:
            host = (f.host.mirror, f.host.sum) if f.host else ()
            for path in (f.target, *host):
                if path:
                    set_path(batch, path, None)
        return batch

    def invalidate(self, relay: Any, batch: Any, indices: torch.Tensor) -> None:
        """Placeholders for the next forward, where the map has placeholder targets."""
        if self.placeholders:
            relay.invalidate(batch, indices)

    def resolve_schedule(self, relay: Any, batch: Any) -> None:
        """Every schedule-side resolve (fence wait, gather, host mirror)."""
        for name in self.schedule_resolves:
            getattr(relay, name)(batch)

    def check_forward(
        self, batch: Any, values: Mapping[str, torch.Tensor], n: int, what: str
    ) -> None:
        """The first ``n`` rows of every forward target hold ``values``."""
        for f in self.forward:
            if f.target:
                got = get_path(batch, f.target)
                if f.target_shape == TargetShape.FLAT and isinstance(got, torch.Tensor):
                    got = got.reshape(-1, *self.rows[f.name])  # (n * row,) as handed
                _assert_rows(f"{what}: batch.{f.target}", got, values[f.name], n)

    def check_schedule(
        self, batch: Any, values: Mapping[str, torch.Tensor], what: str
    ) -> None:
        """Every schedule target, host mirror and host sum holds ``values``."""
        for f in self.schedule:
            want = values[f.name]
            if f.target:
                got = get_path(batch, f.target)
                _assert_rows(f"{what}: batch.{f.target}", got, want, want.shape[0])
            mirror = f.host.mirror if f.host else None
            if mirror:
                host = get_path(batch, mirror)
                assert host.device.type == "cpu", (
                    f"{what}: batch.{mirror} is not on the host"
                )
                _assert_rows(f"{what}: batch.{mirror}", host, want, want.shape[0])
            if f.host_sum:
                total = get_path(batch, f.host_sum)
                assert total == int(want.sum()), (
                    f"{what}: batch.{f.host_sum} is {total}"
                )

    def tensors(self, relay: Any) -> dict[str, torch.Tensor]:
        """Every tensor the map holds, by attribute (its buffers, whatever their layout)."""
        found = {
            name: t for name, t in vars(relay).items() if isinstance(t, torch.Tensor)
        }
        # Lazy buffers live in the map's state (a property reads them).
        for f, buf in zip(self.schema.fields, relay._state.buffers):
            if buf is not None:
                found.setdefault(f"{f.name}_buf", buf)
        return found


def _assert_rows(what: str, got: Any, want: torch.Tensor, n: int) -> None:
    assert isinstance(got, torch.Tensor), (
        f"{what} is {type(got).__name__}, not a tensor"
    )
    got_rows = got[:n].cpu()
    want_rows = want[:n].cpu().to(got_rows.dtype)
    assert got_rows.shape == want_rows.shape, (
        f"{what}: shape {tuple(got_rows.shape)}, want {tuple(want_rows.shape)}"
    )
    assert torch.equal(got_rows, want_rows), (
        f"{what}:\n got {got_rows}\nwant {want_rows}"
    )


@functools.cache
def load_map(stem: str) -> BundledMap:
    """Discover ``relay/maps/<stem>.py``: its classes, schema, dims and resolves."""
    module = importlib.import_module(f"relay.maps.{stem}")
    cls = _one(stem, module, "FutureMap", required=True)
    assert cls is not None
    payload_cls = _one(stem, module, "Payload", required=False)
    schema = _load_schema(stem)
    if schema.name != cls.__name__:
        raise DriverError(
            f"schemas/{stem}.py declares {schema.name}, but relay/maps/{stem}.py holds "
            f"{cls.__name__}; run `relay generate`"
        )
    rows = {f.name: _row(stem, f) for f in schema.fields}
    dims: dict[str, int] = {}
    for param in inspect.signature(cls.__init__).parameters.values():
        # A graph-written field's buffer (``<field>_buf=``) is left to the map.
        keyword = param.kind is inspect.Parameter.KEYWORD_ONLY
        if keyword and param.name != "debug" and not param.name.endswith("_buf"):
            if param.name not in DIM_SIZES:
                raise DriverError(
                    f"{cls.__name__}(..., {param.name}=?): no size for this constructor dim; "
                    f"add {param.name!r}: <small int> to DIM_SIZES in tests/gpu/gpu_maps.py"
                )
            dims[param.name] = DIM_SIZES[param.name]
    forward = {f.payload_name for f in schema.fields if f.lane is Lane.FORWARD}
    if payload_cls is not None:
        carried = {a.name for a in attrs.fields(payload_cls)}
        if carried != forward:
            raise DriverError(
                f"{payload_cls.__name__} carries {sorted(carried)}, but schemas/{stem}.py's "
                f"forward fields come from {sorted(forward)}; the driver matches them by "
                "Field.payload_name"
            )
    elif forward:
        raise DriverError(
            f"relay/maps/{stem}.py has forward fields but no *Payload class"
        )
    schedule = {f.payload_name for f in schema.fields if f.lane is Lane.SCHEDULE}
    if schedule:
        params = list(inspect.signature(cls.publish).parameters)[2:]  # self, indices
        if set(params) != schedule:
            raise DriverError(
                f"{cls.__name__}.publish takes {params}, but schemas/{stem}.py's schedule "
                f"fields come from {sorted(schedule)}"
            )
    # Without a schedule lane there is nothing to resolve on the scheduler's side.
    resolves = tuple(
        sorted(
            name
            for name, _ in inspect.getmembers(cls, inspect.isfunction)
            if schedule
            and name.startswith("resolve_")
            # resolve_tails reads a mixed batch's tails again, not a schedule resolve.
            and name not in ("resolve_future", "resolve_tails")
        )
    )
    if schedule and not resolves:
        raise DriverError(
            f"{cls.__name__} has schedule fields but no resolve_* method for them"
        )
    return BundledMap(stem, cls, payload_cls, schema, dims, rows, resolves)


# -- CUDA helpers ----------------------------------------------------------------------------

# torch.cuda's Stream and Event are untyped: the typed wrappers below are the one
# place that calls them through Any.
_cuda: Any = torch.cuda


def new_stream(device: torch.device) -> torch.cuda.Stream:
    """A fresh CUDA stream on ``device`` (torch's pool streams do not sync with stream 0)."""
    stream: torch.cuda.Stream = _cuda.Stream(device)
    return stream


def record(stream: torch.cuda.Stream) -> torch.cuda.Event:
    """A fresh event recorded on ``stream`` now."""
    event: torch.cuda.Event = _cuda.Event()
    event.record(stream)
    return event


def is_done(event: torch.cuda.Event) -> bool:
    """Whether the work before ``event`` has finished (``Event.query``), without waiting."""
    return bool(_cuda.Event.query(event))


@contextmanager
def no_host_sync() -> Iterator[None]:
    """Any host synchronization inside raises (``torch.cuda.set_sync_debug_mode``);
    the previous mode is restored on exit."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def slots_on(device: torch.device, *values: int) -> torch.Tensor:
    """An int64 index tensor of request-pool slots on ``device``."""
    return torch.tensor(values, dtype=torch.int64, device=device)


def random_slots(n: int, pool_size: int, seed: int) -> list[int]:
    """``n`` distinct slots in ``1 .. pool_size - 1`` (row 0 is scratch), in random order."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randperm(pool_size - 1, generator=generator)[:n] + 1).tolist()
