"""Naming: every identifier and literal the generated code spells, in one place.

Schema name -> class names, field -> buffer, attribute and local names, dtypes ->
source spellings, row shapes -> tuple literals, strings -> source literals. Views
and the template ask here; nothing else invents a name.

``RESERVED`` lists every fixed name a generated module binds or calls (imports,
method names and parameters, attributes, locals); ``bound_names`` adds the ones
minted from a schema. ``identifier_problem`` says why a schema name cannot be used
as Python sees it (after NFKC normalization).
"""

from __future__ import annotations

import keyword
import unicodedata

import attrs
import torch

from relay.codegen import literals
from relay.codegen.literals import doc_text, dtype, shape_literal, string_literal
from relay.schema import (
    BatchRows,
    Dim,
    Field,
    Lane,
    Members,
    Schema,
    Switch,
    resolve_method,
)

#: Every fixed name a generated module binds or uses: module imports and aliases,
#: method names and parameters, ``self`` attributes and locals. A field, source, dim or schema name equal to one of these (as Python sees
#: it, after NFKC) would shadow or clash with generated code. A test keeps this list
#: equal to what the template emits.
RESERVED = frozenset(
    {
        # module level
        "annotations",
        "Final",
        "Protocol",
        "attrs",
        "torch",
        "_rt",
        "_TABLE",
        literals.TENSOR,  # and the dtypes' constants: see identifier_problem
        "_INT64",
        "__all__",
        # methods
        "__init__",
        "stash",
        "publish",
        "invalidate",
        "release",
        "resolve_future",
        "seed",
        "graph_wrote",
        "stash_partial",
        "resolve_tails",
        # parameters and locals
        "self",
        "device",
        "pool_size",
        "debug",
        "indices",
        "payload",
        "batch",
        "index_shape",
        "count",
        "owners",
        "host",
        "host_copy",
        "tail_lengths",
        "tail_locations",
        "tail_host",
        "tail_prefix",
        "state",
        "stream_ordered",
        "partial",
        "handle",
        # attributes of the map
        "_state",
    }
)

#: Methods every generated map may define besides the schedule resolves.
METHODS = frozenset(
    {
        "stash",
        "publish",
        "invalidate",
        "release",
        "resolve_future",
        "seed",
        "graph_wrote",
        "stash_partial",
        "resolve_tails",
    }
)

_MAP_SUFFIX = "FutureMap"


def python_name(name: str) -> str:
    """``name`` as the Python parser sees it: identifiers are NFKC-normalized."""
    return unicodedata.normalize("NFKC", name)


def is_identifier(name: object) -> bool:
    """A Python identifier that is not a keyword (after NFKC, as Python reads it)."""
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not keyword.iskeyword(python_name(name))
    )


def identifier_problem(name: object, *, reserved: bool = True) -> str | None:
    """Why ``name`` cannot name a field, source, dim or path part; ``None`` if it can.

    Python normalizes identifiers with NFKC, so ``ﬁeld`` and ``field`` are one
    name: the checks (keyword, mangling, dunder, reserved) look at that form, and a
    name whose normalized form differs is refused outright so the schema, the
    generated code and the error messages all spell it the same way. With
    ``reserved=False`` (attribute names on the batch) ``RESERVED`` is not checked.
    """
    if not isinstance(name, str) or not name.isidentifier():
        return "is not a Python identifier"
    seen = python_name(name)
    if seen != name:
        return f"is read by Python as {seen!r} (NFKC normalization); spell it that way"
    if keyword.iskeyword(seen) or keyword.issoftkeyword(seen):
        return "is a Python keyword"
    if seen.startswith("__") and seen.endswith("__"):
        return "is a dunder name, reserved for Python"
    if seen.startswith("__"):
        return "starts with '__', which Python mangles inside the generated classes"
    if reserved and seen in RESERVED:
        return "is a name the generated module binds itself"
    if reserved and seen in GATE_NAMES:  # bound only where a gate tests that dtype
        return "is a name the generated module binds itself (Note [Gate constants])"
    return None


GATE_NAMES = frozenset(map(literals.gate_dtype, literals.GATE_DTYPES))


def prefix(schema: Schema) -> str:
    """``EagleFutureMap`` -> ``Eagle``: the stem of the payload and protocol names."""
    name = schema.name
    if name.endswith(_MAP_SUFFIX) and len(name) > len(_MAP_SUFFIX):
        return name[: -len(_MAP_SUFFIX)]
    return name


def payload_class(schema: Schema) -> str:
    return f"{prefix(schema)}Payload"


def batch_protocol(schema: Schema) -> str:
    return f"{prefix(schema)}Batch"


def schedule_protocol(schema: Schema) -> str:
    """The schedule lane's batch Protocol, where the schema names that lane's slots or
    owners (Note [Slots per lane] in relay/schema.py)."""
    return f"{prefix(schema)}ScheduleBatch"


def _camel(part: str) -> str:
    return "".join(word[:1].upper() + word[1:] for word in part.split("_"))


def nested_protocol(
    schema: Schema, path: tuple[str, ...], *, schedule: bool = False
) -> str:
    """``("spec_info",)`` -> ``EagleSpecInfo``: the protocol of ``batch.spec_info``
    (``EagleScheduleSpecInfo`` on the schedule lane's batch, ``schedule=True``).

    The stem is not repeated when the path starts with it (``SpecFutureMap`` and
    ``spec_info`` give ``SpecInfo``, not ``SpecSpecInfo``).
    """
    camel = "".join(_camel(part) for part in path)
    stem = prefix(schema)
    if schedule:
        camel = f"Schedule{camel}"
    if camel.startswith(stem) and camel != stem:
        return camel
    return f"{stem}{camel}"


def buffer(field: Field) -> str:
    return f"{field.name}_buf"


def _dtype_stem(value: torch.dtype) -> str:
    return str(value).removeprefix("torch.")


def packed_buffer(value: torch.dtype) -> str:
    """The private buffer a packed layout shares among the fields of dtype ``value``."""
    return f"_{_dtype_stem(value)}_packed"


def packed_widths(value: torch.dtype) -> str:
    """The private tuple of a packed buffer's column counts, field by field."""
    return f"_{_dtype_stem(value)}_widths"


def packed_rows(value: torch.dtype) -> str:
    """The local holding a packed buffer's gathered rows in ``resolve_future``."""
    return f"_{_dtype_stem(value)}_rows"


def host_mirror(field: Field) -> str:
    """The private ``HostMirror`` attribute of a schedule field."""
    return f"_{field.name}_host"


def value_local(field: Field) -> str:
    """The local holding a schedule field's gathered rows (fields never shadow locals:
    ``indices``, ``slots``, ``batch`` and ``self`` are reserved)."""
    return field.name


def placeholder_locals(field: Field) -> tuple[str, str, str]:
    """Locals of a placeholder resolve: the target, its pending mask, the rows read."""
    return f"{field.name}_at", f"{field.name}_pending", f"{field.name}_rows"


def _path_names(schema: Schema, path: str) -> set[str]:
    parts = tuple(path.split("."))
    names = set(parts)
    for schedule in (False, True) if schema.lanes_apart else (False,):
        names.update(
            nested_protocol(schema, parts[:depth], schedule=schedule)
            for depth in range(1, len(parts))
        )
    return names


def field_paths(f: Field) -> list[str]:
    """Every batch attribute path field ``f`` names, in declaration order."""
    paths: list[object] = [f.target, f.gate]
    if f.scatter is not None:
        paths += [f.scatter.offsets, f.scatter.lengths, f.scatter.when]
        rows = f.scatter.rows
        if isinstance(rows, BatchRows):
            paths += [rows.starts, rows.index]
    if f.host is not None:
        paths += [f.host.mirror, f.host.sum]
    if f.tails is not None:
        kv = f.tails.kv
        paths += [
            f.tails.rows,
            *((kv.locations, kv.table) if kv else ()),
            f.tails.prefix,
        ]
    return [p for p in paths if isinstance(p, str)]


def bound_names(schema: Schema) -> frozenset[str]:
    """Every name a module generated from ``schema`` binds: ``RESERVED`` plus the
    class, method, attribute, parameter and local names minted from the schema."""
    names = set(RESERVED)
    names.update({schema.name, payload_class(schema), batch_protocol(schema)})
    names.update(literals.gate_dtype(f.dtype) for f in schema.fields if isinstance(f.dtype, torch.dtype))  # fmt: skip
    names.update(_path_names(schema, schema.indices))
    if schema.lanes_apart:  # Note [Slots per lane] in relay/schema.py
        names.add(schedule_protocol(schema))
    lanes = schema.schedule
    owners = schema.owners
    paths = owners.paths if isinstance(owners, Members) else (owners,)
    for path in (*paths, *((lanes.indices, lanes.owners) if lanes else ())):
        if isinstance(path, str):
            names.update(_path_names(schema, path))
    for f in schema.fields:
        names.update({buffer(f), host_mirror(f), f.payload_name})
        names.add(value_local(f))
        names.update(placeholder_locals(f))
        # a count's last name is a payload attribute too
        for path in field_paths(f):
            names.update(_path_names(schema, path))
        if f.lane is Lane.SCHEDULE:
            names.add(resolve_method(f))
        names.update(d for d in f.shape if isinstance(d, str))
        if schema.layout.value == "packed" and isinstance(f.dtype, torch.dtype):
            names.update(
                {packed_buffer(f.dtype), packed_widths(f.dtype), packed_rows(f.dtype)}
            )
    names.update(switch_keywords(schema.fields))
    if schema.staged is not None:
        names.update({schema.staged.method, staged_protocol(schema)})
    return frozenset(names)


def switch_keywords(fields: tuple[Field, ...]) -> list[str]:
    """The ``Switch`` keywords in first-use order: the constructor's bool keywords."""
    seen: list[str] = []
    for f in fields:
        if isinstance(f.gate, Switch) and f.gate.keyword not in seen:
            seen.append(f.gate.keyword)
    return seen


def staged_protocol(schema: Schema) -> str:
    """The Protocol of the draft input a ``Staged`` method fills (``EagleStagedSpecInfo``)."""
    parent = schema.indices.rsplit(".", 1)[0]
    return f"{prefix(schema)}Staged{''.join(_camel(p) for p in parent.split('.'))}"


def eager_shape(field: Field) -> str:
    """The allocation shape of an eager field: the pool dim, then the row dims."""
    return shape_literal(("pool_size", *(str(d) for d in field.shape)))


def symbolic_dims(fields: tuple[Field, ...]) -> list[str]:
    """Symbolic dims of eager fields in first-use order: the constructor keywords."""
    seen: list[str] = []
    for field in fields:
        if field.alloc.value != "eager":
            continue
        for dim in field.shape:
            if isinstance(dim, str) and dim not in seen:
                seen.append(dim)
    return seen


def describe_shape(shape: tuple[Dim, ...]) -> str:
    """Human spelling of a row shape for doc strings: ``(pool_size, topk)``."""
    return shape_literal(("pool_size", *(str(d) for d in shape)))


# --- the names of one schema, spelled once ---------------------------------------------------


@attrs.frozen
class Names:
    """Every identifier and literal a module generated from one schema spells, computed
    in one pass (``names_of``) before any view is built: the views and the method
    bodies read these, and never call back here."""

    #: The map class, its payload class, its batch Protocols.
    cls: str
    payload_cls: str
    batch: str
    schedule_batch: str
    #: The schema's name as a string literal.
    literal: str
    #: Per field name: its buffer attribute, host-mirror attribute, value local, the
    #: placeholder read's three locals, its name as a literal, its allocation shape,
    #: its dtype spelled (fixed dtypes only) and its doc string's body.
    buffer: dict[str, str]
    host: dict[str, str]
    value: dict[str, str]
    placeholder: dict[str, tuple[str, str, str]]
    field_literal: dict[str, str]
    eager_shape: dict[str, str]
    dtype: dict[str, str]
    doc: dict[str, str]
    #: The constructor's symbolic dims, in first-use order.
    dims: tuple[str, ...]
    #: The constructor's ``Switch`` keywords, in first-use order.
    switches: tuple[str, ...]
    #: The Protocol of the draft input a ``Staged`` method fills (``""`` without one).
    staged: str
    #: The Protocol of each object a batch path goes through, by the path's parts and
    #: whether it is the schedule lane's batch.
    nested: dict[tuple[tuple[str, ...], bool], str]
    #: Per packed dtype: its shared buffer, its widths and its gathered rows.
    packed: dict[torch.dtype, tuple[str, str, str]]
    #: Names a resolve may not bind to a nested object it writes through: the
    #: reserved ones, the fields' and their placeholder locals.
    taken: frozenset[str]


def names_of(schema: Schema) -> Names:
    """The names of the module generated from validated ``schema``."""
    fields = schema.fields
    lanes = schema.schedule
    owners = schema.owners
    paths = [
        schema.indices,
        *(owners.paths if isinstance(owners, Members) else (owners,)),
        *(p for f in fields for p in field_paths(f)),
    ]
    paths += [lanes.indices, lanes.owners] if lanes is not None else []
    nested = {
        (parts[:depth], schedule): nested_protocol(
            schema, parts[:depth], schedule=schedule
        )
        for path in paths
        if path is not None
        for parts in [tuple(path.split("."))]
        for depth in range(1, len(parts))
        for schedule in ((False, True) if schema.lanes_apart else (False,))
    }
    dtypes = {f.dtype for f in fields if isinstance(f.dtype, torch.dtype)}
    packed = {
        d: (packed_buffer(d), packed_widths(d), packed_rows(d))
        for d in sorted(dtypes, key=str)
    }
    taken = {*RESERVED, *(f.name for f in fields)}
    taken |= {n for f in fields for n in placeholder_locals(f)}
    classes = (payload_class(schema), batch_protocol(schema), schedule_protocol(schema))
    buffers = {f.name: buffer(f) for f in fields}
    hosts = {f.name: host_mirror(f) for f in fields}
    values = {f.name: value_local(f) for f in fields}
    placeholders = {f.name: placeholder_locals(f) for f in fields}
    dims = tuple(symbolic_dims(fields))
    switches = tuple(switch_keywords(fields))
    staged = staged_protocol(schema) if schema.staged is not None else ""
    # Last, in one loop: what is spelled as a literal (Python source of a text).
    literal = string_literal(schema.name)
    literals: dict[str, str] = {}
    shapes: dict[str, str] = {}
    spelled: dict[str, str] = {}
    docs: dict[str, str] = {}
    for f in fields:
        literals[f.name] = string_literal(f.name)
        shapes[f.name] = shape_literal(("pool_size", *map(str, f.shape)))
        if isinstance(f.dtype, torch.dtype):
            spelled[f.name] = dtype(f.dtype)
        docs[f.name] = doc_text(f.doc) or f.name
    return Names(
        cls=schema.name,
        payload_cls=classes[0],
        batch=classes[1],
        schedule_batch=classes[2],
        literal=literal,
        buffer=buffers,
        host=hosts,
        value=values,
        placeholder=placeholders,
        field_literal=literals,
        eager_shape=shapes,
        dtype=spelled,
        doc=docs,
        dims=dims,
        switches=switches,
        staged=staged,
        nested=nested,
        packed=packed,
        taken=frozenset(taken),
    )
