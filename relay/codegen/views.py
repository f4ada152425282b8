"""Views: exactly what the template needs, computed once from a validated schema.

Templates only fill holes and loop; every decision (which methods exist, what a
line says, which protocol owns an attribute) is made here, in Python, where it
can be read and tested.
"""

from __future__ import annotations

import inspect

import attrs

from relay.codegen import naming
from relay.schema import Alloc, Field, FromPayload, Guard, Lane, Resolve, Schema

_GUARDS = {Guard.POSITIVE: "guard_positive", Guard.NON_NEGATIVE: "guard_non_negative"}


def doc_text(text: str) -> str:
    """A doc string body safe inside triple quotes, with normalized indentation."""
    lines = [line.rstrip() for line in inspect.cleandoc(text).splitlines()]
    cleaned = "\n".join(lines).rstrip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if cleaned.endswith('"'):
        cleaned = cleaned[:-1] + '\\"'  # else it would merge with the closing quotes
    return cleaned


@attrs.frozen
class FieldView:
    name: str
    what: str  # "EagleFutureMap.topk_p", used in runtime messages
    buf: str
    lane: str
    eager: bool
    optional: bool
    #: Source spelling of the declared dtype, or None for FROM_PAYLOAD.
    dtype: str | None
    alloc_shape: str  # eager: "(pool_size, topk)"
    declared_row: str  # lazy: "(None,)"
    payload_name: str
    target: str | None  # "batch.spec_info.topk_p"
    placeholder: bool
    host_mirror: str | None  # "batch.seq_lens_cpu"
    host_sum: str | None
    host_attr: str  # "_new_seq_lens_host"
    resolve_method: str | None
    fence_consumer: str | None
    guard: str | None
    doc: str
    summary: str  # one line for the class doc: lane, shape, dtype, target

    @property
    def value_type(self) -> str:
        return "torch.Tensor | None" if self.optional else "torch.Tensor"

    @property
    def buf_type(self) -> str:
        return "torch.Tensor" if self.eager else "torch.Tensor | None"


@attrs.frozen
class Attribute:
    """One member of a generated Protocol."""

    name: str
    type: str
    writable: bool


@attrs.frozen
class ProtocolView:
    name: str
    doc: str
    attributes: tuple[Attribute, ...]


@attrs.frozen
class MapView:
    module_doc: str
    cls: str
    doc: str
    payload_cls: str
    batch_cls: str
    indices: str  # "batch.req_pool_indices"
    dims: tuple[str, ...]
    fields: tuple[FieldView, ...]
    protocols: tuple[ProtocolView, ...]  # nested first, the batch protocol last
    fence_consumers: tuple[str, ...]

    @property
    def fence_consumers_literal(self) -> str:
        return naming.shape_literal(tuple(f'"{c}"' for c in self.fence_consumers))

    @property
    def exports(self) -> list[str]:
        names = [self.cls, self.batch_cls]
        if self.forward:
            names.append(self.payload_cls)
        names.extend(p.name for p in self.protocols if p.name != self.batch_cls)
        return sorted(names)

    @property
    def forward(self) -> list[FieldView]:
        return [f for f in self.fields if f.lane == "forward"]

    @property
    def schedule(self) -> list[FieldView]:
        return [f for f in self.fields if f.lane == "schedule"]

    @property
    def forward_resolved(self) -> list[FieldView]:
        return [f for f in self.forward if f.target is not None]

    @property
    def placeholders(self) -> list[FieldView]:
        return [f for f in self.fields if f.placeholder]

    @property
    def publish_params(self) -> list[FieldView]:
        """Required schedule fields first (positional), then optional ones (default None)."""
        return [f for f in self.schedule if not f.optional] + [
            f for f in self.schedule if f.optional
        ]


def _summary(f: Field) -> str:
    dtype = "dtype from payload" if isinstance(f.dtype, FromPayload) else naming.dtype(f.dtype)
    parts = [f"{f.lane.value} lane", f"{naming.describe_shape(f.shape)} {dtype}", f.alloc.value]
    if f.optional:
        parts.append("optional")
    line = f"``{f.name}``: " + ", ".join(parts)
    if f.target is not None:
        # Continued on its own line of the class doc string (see the template).
        line += f";\n      -> ``batch.{f.target}`` ({f.resolve.value})"
    return line


def _field_view(schema: Schema, f: Field) -> FieldView:
    schedule = f.lane is Lane.SCHEDULE
    return FieldView(
        name=f.name,
        what=f"{schema.name}.{f.name}",
        buf=naming.buffer(f),
        lane=f.lane.value,
        eager=f.alloc is Alloc.EAGER,
        optional=f.optional,
        dtype=None if isinstance(f.dtype, FromPayload) else naming.dtype(f.dtype),
        alloc_shape=naming.eager_shape(f),
        declared_row=naming.declared_row(f),
        payload_name=f.payload_name,
        target=f"batch.{f.target}" if f.target is not None else None,
        placeholder=f.resolve is Resolve.PLACEHOLDER,
        host_mirror=f"batch.{f.host_mirror}" if f.host_mirror else None,
        host_sum=f"batch.{f.host_sum}" if f.host_sum else None,
        host_attr=naming.host_mirror(f),
        resolve_method=naming.resolve_method(f) if schedule else None,
        fence_consumer=naming.resolve_method(f) if schedule else None,
        guard=_GUARDS.get(f.guard),
        doc=doc_text(f.doc),
        summary=_summary(f),
    )


def _protocols(schema: Schema) -> tuple[ProtocolView, ...]:
    """Batch protocols: one per object on a dotted path, members in first-use order."""
    members: dict[tuple[str, ...], dict[str, Attribute]] = {(): {}}

    def add(path: str, type_: str, writable: bool) -> None:
        parts = tuple(path.split("."))
        for depth in range(1, len(parts)):
            owner, name = parts[: depth - 1], parts[depth - 1]
            nested = parts[:depth]
            members.setdefault(nested, {})
            members.setdefault(owner, {}).setdefault(
                name, Attribute(name, naming.nested_protocol(schema, nested), False)
            )
        owner, name = parts[:-1], parts[-1]
        current = members.setdefault(owner, {}).get(name)
        if current is None or (writable and not current.writable):
            members[owner][name] = Attribute(name, type_, writable)

    add(schema.indices, "torch.Tensor", False)
    for f in schema.fields:
        tensor = "torch.Tensor | None" if f.optional else "torch.Tensor"
        if f.target is not None:
            # Placeholder targets are assigned by invalidate; gather targets by resolve.
            add(f.target, tensor, True)
        if f.host_mirror is not None:
            add(f.host_mirror, tensor, True)
        if f.host_sum is not None:
            add(f.host_sum, "int | None" if f.optional else "int", True)

    views = []
    for path in sorted((p for p in members if p), key=lambda p: (-len(p), p)):
        views.append(
            ProtocolView(
                name=naming.nested_protocol(schema, path),
                doc=f"The attributes of ``batch.{'.'.join(path)}`` that {schema.name} "
                "reads and writes.",
                attributes=tuple(members[path].values()),
            )
        )
    views.append(
        ProtocolView(
            name=naming.batch_protocol(schema),
            doc=f"What {schema.name} reads and writes on a batch; any class with these fits.",
            attributes=tuple(members[()].values()),
        )
    )
    return tuple(views)


def map_view(schema: Schema, *, source: str) -> MapView:
    """The view of one validated schema."""
    fields = tuple(_field_view(schema, f) for f in schema.fields)
    first_line = doc_text(schema.doc).splitlines()[0] if schema.doc.strip() else schema.name
    return MapView(
        module_doc=f"{first_line}\n\nGenerated from {source} by relay; see docs/generated.md.",
        cls=schema.name,
        doc=doc_text(schema.doc) or schema.name,
        payload_cls=naming.payload_class(schema),
        batch_cls=naming.batch_protocol(schema),
        indices=f"batch.{schema.indices}",
        dims=tuple(naming.symbolic_dims(schema.fields)),
        fields=fields,
        protocols=_protocols(schema),
        fence_consumers=tuple(f.fence_consumer for f in fields if f.fence_consumer),
    )
