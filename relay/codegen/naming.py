"""Naming: every identifier and literal the generated code spells, in one place.

Schema name -> class names, field -> buffer and local names, dtypes -> source
spellings, row shapes -> tuple literals. Views and templates ask here; nothing
else invents a name.
"""

from __future__ import annotations

import keyword

import torch

from relay.schema import Dim, Field, Lane, Schema

#: Names a generated map defines or its methods use as locals; a field, source or
#: dim with one of these names would shadow or clash with generated code.
RESERVED = frozenset(
    {
        "self", "batch", "indices", "payload", "torch", "attrs", "annotations", "Protocol",
        "device", "pool_size", "debug", "stash", "publish", "invalidate", "resolve_future",
        "release",
        # builtins the generated code calls
        "int",
    }
)

#: Methods every generated map may define besides the schedule resolves.
METHODS = frozenset({"stash", "publish", "invalidate", "release", "resolve_future"})

_MAP_SUFFIX = "FutureMap"


def is_identifier(name: object) -> bool:
    """A Python identifier that is not a keyword."""
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


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


def nested_protocol(schema: Schema, path: tuple[str, ...]) -> str:
    """``("spec_info",)`` -> ``EagleSpecInfo``: the protocol of ``batch.spec_info``."""
    camel = "".join(part.title().replace("_", "") for part in path)
    return f"{prefix(schema)}{camel}"


def buffer(field: Field) -> str:
    return f"{field.name}_buf"


def host_mirror(field: Field) -> str:
    """The private ``HostMirror`` attribute of a schedule field."""
    return f"_{field.name}_host"


def resolve_method(field: Field) -> str:
    """The schedule-side resolve: named after the host mirror, else the target's leaf."""
    if field.lane is not Lane.SCHEDULE:
        raise ValueError(f"{field.name} is not a schedule field")
    leaf = field.host_mirror or field.target or field.name
    return f"resolve_{leaf.rsplit('.', 1)[-1]}"


def dtype(value: torch.dtype) -> str:
    """``torch.int64`` spelled as source."""
    return str(value)


def shape_literal(dims: tuple[str, ...]) -> str:
    """A tuple literal from already-spelled dims: ``("pool_size", "topk")`` -> ``(pool_size, topk)``."""
    if len(dims) == 1:
        return f"({dims[0]},)"
    return "(" + ", ".join(dims) + ")"


def eager_shape(field: Field) -> str:
    """The allocation shape of an eager field: the pool dim, then the row dims."""
    return shape_literal(("pool_size", *(str(d) for d in field.shape)))


def declared_row(field: Field) -> str:
    """The row of a lazy field for ``_rt.lazy_buffer``: fixed dims, ``None`` for symbolic."""
    return shape_literal(tuple("None" if isinstance(d, str) else str(d) for d in field.shape)) if field.shape else "()"


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
