"""Validation: every problem of a schema, each with its place, expectation and fix.

All checks run and all issues are returned together, so one ``relay generate``
run shows a user everything to mend. Later stages may assume a schema that passed
is well-formed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relay.codegen import naming
from relay.errors import SchemaIssue
from relay.schema import Alloc, Field, FromPayload, Guard, Lane, Resolve, Schema, SourceLocation

_DTYPE_HINT = "torch.int64, torch.float32, torch.bfloat16"


def _got(value: object) -> str:
    """``'fp8' that is a str``: the value and its type, as attrs' messages say it."""
    return f"{value!r} that is a {type(value).__name__}"


def _is_int_dtype(dtype: object) -> bool:
    return isinstance(dtype, torch.dtype) and not (
        dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    )


def _valid_path(path: object) -> bool:
    return isinstance(path, str) and all(
        naming.identifier_problem(part, reserved=False) is None for part in path.split(".")
    )


class _Collector:
    def __init__(self, schema: Schema, where: Callable[[SourceLocation], str]) -> None:
        self.schema = schema
        self.where = where
        self.schema_name = schema.name if isinstance(schema.name, str) else repr(schema.name)
        self.issues: list[SchemaIssue] = []

    def add(self, field: Field | None, problem: str, fix: str) -> None:
        loc = field.declared_at if field is not None else self.schema.declared_at
        name = field.name if field is not None and isinstance(field.name, str) else None
        self.issues.append(SchemaIssue(self.where(loc), self.schema_name, name, problem, fix))


def validate(schema: Schema, where: Callable[[SourceLocation], str]) -> list[SchemaIssue]:
    """Every issue of ``schema``; ``where`` spells a declaration's location."""
    c = _Collector(schema, where)
    if not naming.is_identifier(schema.name):
        c.add(None, f"schema name must be a Python identifier (got {_got(schema.name)})",
              "name the schema like a class, e.g. name=\"DecodeFutureMap\"")
    if not _valid_path(schema.indices):
        c.add(None, f"indices must be a dotted attribute path such as 'req_pool_indices' "
              f"(got {_got(schema.indices)})", "write indices=\"req_pool_indices\"")
    if not schema.fields:
        c.add(None, "a schema needs at least one field (got none)",
              "add a Field(...) to fields=[...], or delete the schema module")
        return c.issues
    for field in schema.fields:
        if not isinstance(field, Field):
            c.add(None, f"fields must hold Field declarations (got {_got(field)})",
                  "declare each field as Field(\"name\", lane=..., dtype=...)")
            continue
        _check_field(c, field)
    fields = [f for f in schema.fields if isinstance(f, Field)]
    _check_unique(c, fields)
    return c.issues


def _check_field(c: _Collector, f: Field) -> None:
    name = f.name
    if not isinstance(name, str) or not name.isidentifier():
        c.add(f, f"field name must be a Python identifier (got {_got(name)})",
              "use letters, digits and underscores, not starting with a digit, e.g. \"topk_p\"")
    elif not naming.is_identifier(name):
        c.add(f, f"field name {name!r} is a Python keyword", f"rename it, e.g. \"{name}_\"")
    elif name in naming.RESERVED or name.startswith("resolve_") or name.startswith("_"):
        c.add(f, f"field name {name!r} clashes with a name the generated map defines or uses",
              f"rename the field, e.g. \"{name.lstrip('_')}_value\"")
    elif (problem := naming.identifier_problem(name)) is not None:
        c.add(f, f"field name {name!r} {problem}", "rename the field")

    if not isinstance(f.lane, Lane):
        c.add(f, f"lane must be Lane.FORWARD or Lane.SCHEDULE (got {_got(f.lane)})",
              "write lane=Lane.FORWARD (stashed for the next forward) or lane=Lane.SCHEDULE "
              "(published for the scheduler)")
    if not isinstance(f.alloc, Alloc):
        c.add(f, f"alloc must be Alloc.EAGER or Alloc.LAZY (got {_got(f.alloc)})",
              "write alloc=Alloc.EAGER (at construction) or alloc=Alloc.LAZY (first payload)")
    if isinstance(f.dtype, FromPayload):
        if f.alloc is Alloc.EAGER:
            c.add(f, "dtype=FROM_PAYLOAD needs a lazily allocated field, but alloc is Alloc.EAGER",
                  "add alloc=Alloc.LAZY, or give a fixed dtype such as torch.bfloat16")
    elif not isinstance(f.dtype, torch.dtype):
        c.add(f, f"dtype must be a torch.dtype such as {_DTYPE_HINT}, or FROM_PAYLOAD "
              f"(got {_got(f.dtype)})", "write dtype=torch.<name>, e.g. dtype=torch.int64")

    _check_shape(c, f)

    if not isinstance(f.optional, bool):
        c.add(f, f"optional must be True or False (got {_got(f.optional)})",
              "write optional=True if payloads may omit the field")
    if f.source is not None and (
        not naming.is_identifier(f.source) or naming.identifier_problem(f.source) is not None
    ):
        c.add(f, f"source must be an identifier naming the payload attribute, not a keyword "
              f"or a reserved name (got {_got(f.source)})",
              "write source=\"next_token_ids\", or leave it out to use the field name")
    if not isinstance(f.resolve, Resolve):
        c.add(f, f"resolve must be Resolve.GATHER or Resolve.PLACEHOLDER (got {_got(f.resolve)})",
              "write resolve=Resolve.GATHER or resolve=Resolve.PLACEHOLDER")
    if not isinstance(f.guard, Guard):
        c.add(f, f"guard must be a Guard such as Guard.POSITIVE (got {_got(f.guard)})",
              "write guard=Guard.NONE, Guard.NON_NEGATIVE or Guard.POSITIVE")
    if not isinstance(f.doc, str):
        c.add(f, f"doc must be a str (got {_got(f.doc)})", "write doc=\"...\"")

    _check_target(c, f)


def _check_shape(c: _Collector, f: Field) -> None:
    for dim in f.shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, str)):
            c.add(f, f"shape dims must be positive ints or symbolic names (got {_got(dim)})",
                  "write shape=(\"topk\",) or shape=(8,)")
        elif isinstance(dim, int) and dim <= 0:
            c.add(f, f"shape dims must be positive (got {dim})",
                  "use a size >= 1, or a symbolic name such as \"topk\" given at construction")
        elif isinstance(dim, str) and naming.identifier_problem(dim) is not None:
            c.add(f, f"symbolic dim must be an identifier that is not reserved (got {dim!r})",
                  "name the dim like a keyword argument, e.g. \"topk\" or \"hidden\"")


def _check_target(c: _Collector, f: Field) -> None:
    if f.target is not None and not _valid_path(f.target):
        c.add(f, f"target must be a dotted attribute path such as 'spec_info.topk_p' "
              f"(got {_got(f.target)})",
              "write target=\"seq_lens\" or target=\"spec_info.topk_p\": identifiers joined by dots")
    if f.lane is Lane.SCHEDULE and f.target is None:
        c.add(f, "a schedule field needs a target on the batch to resolve into (got target=None)",
              "add target=\"<batch attribute>\", e.g. target=\"seq_lens\"")
    if f.resolve is Resolve.PLACEHOLDER:
        if isinstance(f.dtype, FromPayload):
            c.add(f, "resolve=Resolve.PLACEHOLDER needs a fixed integer dtype, since "
                  "placeholders are negative slots (got dtype=FROM_PAYLOAD)",
                  "give dtype=torch.int64, or use resolve=Resolve.GATHER")
        elif isinstance(f.dtype, torch.dtype) and not _is_int_dtype(f.dtype):
            c.add(f, f"resolve=Resolve.PLACEHOLDER needs an integer dtype, since placeholders "
                  f"are negative slots (got {f.dtype})",
                  "use resolve=Resolve.GATHER for this field")
        if f.shape:
            c.add(f, f"resolve=Resolve.PLACEHOLDER needs one value per slot, shape=() "
                  f"(got shape={f.shape!r})", "use resolve=Resolve.GATHER for rows")
        if f.target is None:
            c.add(f, "resolve=Resolve.PLACEHOLDER needs a target holding the placeholders "
                  "(got target=None)", "add target=\"input_ids\" (or another batch tensor)")
    for option in ("host_mirror", "host_sum"):
        value = getattr(f, option)
        if value is None:
            continue
        if f.lane is not Lane.SCHEDULE:
            c.add(f, f"{option} mirrors a value to the scheduler's host, so it needs "
                  f"lane=Lane.SCHEDULE (got lane={f.lane})",
                  f"remove {option}=..., or move the field to Lane.SCHEDULE")
        if not _valid_path(value):
            c.add(f, f"{option} must be a dotted attribute path such as 'seq_lens_cpu' "
                  f"(got {_got(value)})", f"write {option}=\"<batch attribute>\"")
        elif option == "host_sum" and f.shape:
            c.add(f, f"host_sum sums one value per slot, so it needs shape=() (got {f.shape!r})",
                  "remove host_sum=..., or use host_mirror=... for rows")


def _check_unique(c: _Collector, fields: list[Field]) -> None:
    first_name: dict[str, Field] = {}
    first_source: dict[tuple[Lane, str], Field] = {}
    first_path: dict[str, tuple[Field, str]] = {}
    first_method: dict[str, Field] = {}
    for f in fields:
        if not isinstance(f.name, str):
            continue
        if f.name in first_name:
            other = first_name[f.name]
            c.add(f, f"duplicate field name {f.name!r}; it is first declared at "
                  f"{c.where(other.declared_at)}",
                  "rename one of them, or delete the repeated declaration")
            continue  # one mistake, one message: its source and targets repeat too
        first_name[f.name] = f
        if isinstance(f.lane, Lane) and naming.is_identifier(f.payload_name):
            key = (f.lane, f.payload_name)
            if key in first_source and first_source[key] is not f:
                other = first_source[key]
                c.add(f, f"payload attribute {f.payload_name!r} is also the source of "
                      f"field {other.name!r} ({c.where(other.declared_at)})",
                      "give each field its own source=\"...\"")
            else:
                first_source[key] = f
        if f.lane is Lane.SCHEDULE and _valid_path(f.host_mirror or f.target or ""):
            method = naming.resolve_method(f)
            if method in naming.METHODS:
                c.add(f, f"its schedule resolve would be named {method}(), which every map "
                      "defines for another purpose", "give it another target or host_mirror")
            elif method in first_method:
                other = first_method[method]
                c.add(f, f"its schedule resolve would be named {method}(), like that of "
                      f"field {other.name!r} ({c.where(other.declared_at)})",
                      "give one of them a different target or host_mirror")
            else:
                first_method[method] = f
        for role in ("target", "host_mirror", "host_sum"):
            path = getattr(f, role)
            if not _valid_path(path):
                continue
            if path in first_path:
                other, other_role = first_path[path]
                c.add(f, f"{role} {path!r} is also the {other_role} of field {other.name!r} "
                      f"({c.where(other.declared_at)}); two fields cannot resolve into one "
                      "attribute", f"give field {f.name!r} another {role}")
                continue
            first_path[path] = (f, role)
    # A path cannot be both an attribute and the owner of nested attributes, and the
    # indices attribute is read, never written.
    taken = {naming.payload_class(c.schema), naming.batch_protocol(c.schema), c.schema.name}
    for path, (f, role) in first_path.items():
        parts = tuple(path.split("."))
        for depth in range(1, len(parts)):
            protocol = naming.nested_protocol(c.schema, parts[:depth])
            if protocol in taken:
                c.add(f, f"{role} {path!r} goes through {'.'.join(parts[:depth])!r}, whose "
                      f"generated Protocol would be named {protocol}, a name the module "
                      "already defines", f"rename the attribute {parts[depth - 1]!r} on the batch")
                break
        for other_path in first_path:
            if other_path.startswith(path + "."):
                c.add(f, f"{role} {path!r} is written as a tensor but also holds "
                      f"{other_path!r}", f"resolve into {path}.<name> instead, or rename")
                break
        if path == c.schema.indices:
            c.add(f, f"{role} {path!r} is the attribute the map reads its slots from",
                  f"choose another {role}, or set Schema(indices=...) to another attribute")
