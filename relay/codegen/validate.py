"""Validation: every problem of a schema, each with its place, expectation and fix.

All checks run and all issues are returned together, so one ``relay generate``
run shows a user everything to mend. Later stages may assume a schema that passed
is well-formed.
"""

from __future__ import annotations

import builtins
import functools
import unicodedata
import warnings
from collections.abc import Callable, Iterator

import torch

from relay.codegen import naming
from relay.codegen.layout import packed_groups
from relay.codegen.roles import Role, clash, role_table
from relay.errors import SchemaIssue
from relay.schema import (
    Alloc,
    Field,
    FromPayload,
    Guard,
    HostCopy,
    IfNone,
    Lane,
    Layout,
    Resolve,
    Scatter,
    ScheduleSlots,
    Schema,
    SourceLocation,
    Tails,
    TailsKv,
    TargetShape,
    Unwritten,
    resolve_method,
)

_DTYPE_HINT = "torch.int64, torch.float32, torch.bfloat16"


def _got(value: object) -> str:
    """``'fp8' that is a str``: the value and its type, as attrs' messages say it."""
    return f"{value!r} that is a {type(value).__name__}"


def _is_int_dtype(dtype: object) -> bool:
    return isinstance(dtype, torch.dtype) and not (
        dtype.is_floating_point or dtype.is_complex or dtype == torch.bool
    )


@functools.cache
def _unusable(dtype: torch.dtype) -> str | None:
    """Why torch cannot hold ``dtype`` in a relay buffer (allocate, write rows, read rows)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            buf = torch.zeros((2,), dtype=dtype)
            rows = torch.ones((1,), dtype=torch.int64)
            buf[rows] = rows.to(dtype)
            buf[rows]
    # torch says why (NotImplementedError, RuntimeError, ...): its reason is the message.
    except Exception as error:  # noqa: BLE001
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {first}"
    return None


def _valid_path(path: object) -> bool:
    return isinstance(path, str) and all(
        naming.identifier_problem(part, reserved=False) is None
        for part in path.split(".")
    )


class _Collector:
    def __init__(self, schema: Schema, display: Callable[[str], str]) -> None:
        self.schema = schema
        self.display = display
        self.schema_name = (
            schema.name if isinstance(schema.name, str) else repr(schema.name)
        )
        self.issues: list[SchemaIssue] = []

    def where(self, loc: SourceLocation) -> str:
        """``schemas/eagle.py:42``, for messages that point at another declaration."""
        return f"{self.display(loc.file)}:{loc.line}"

    def add(
        self,
        field: Field | None,
        problem: str,
        fix: str,
        at: SourceLocation | None = None,
    ) -> None:
        """An issue of ``field`` (the schema's, ``None``), at ``at`` where a grouped
        declaration inside it is at fault, else at the field's (the schema's) line."""
        if at is None:
            at = field.declared_at if field is not None else self.schema.declared_at
        loc = at
        name = field.name if field is not None and isinstance(field.name, str) else None
        self.issues.append(
            SchemaIssue(
                self.display(loc.file), loc.line, self.schema_name, name, problem, fix
            )
        )


def validate(schema: Schema, display: Callable[[str], str]) -> list[SchemaIssue]:
    """Every issue of ``schema``; ``display`` spells a declaration's file as messages show it."""
    c = _Collector(schema, display)
    if not naming.is_identifier(schema.name):
        c.add(
            None,
            f"schema name must be a Python identifier (got {_got(schema.name)})",
            'name the schema like a class, e.g. name="DecodeFutureMap"',
        )
    for option, path in (("indices", schema.indices), ("owners", schema.owners)):
        if (path is not None or option == "indices") and not _valid_path(path):
            c.add(
                None,
                f"{option} must be a dotted attribute path of the batch such as "
                f"{_EXAMPLE[option]!r} (got {_got(path)})",
                f'write {option}="{_EXAMPLE[option]}"'
                + (", or leave it out" if option == "owners" else ""),
            )
    for owner, problem, fix in _name_and_doc_problems(schema):
        c.add(owner, problem, fix)
    if not schema.fields:
        c.add(
            None,
            "a schema needs at least one field (got none)",
            "add a Field(...) to fields=[...], or delete the schema module",
        )
        return c.issues
    for field in schema.fields:
        if not isinstance(field, Field):
            c.add(
                None,
                f"fields must hold Field declarations (got {_got(field)})",
                'declare each field as Field("name", lane=..., dtype=...)',
            )
            continue
        _check_field(c, field)
    fields = [f for f in schema.fields if isinstance(f, Field)]
    _check_unique(c, fields)
    _check_layout(c)
    _check_docs(c, fields)
    _check_parents(c, fields)
    _check_seeded(c, fields)
    _check_counted_scatters(c, fields)
    _check_partial_and_tails(c, fields)
    _check_schedule_slots(c, fields)
    table = role_table(schema)
    _check_roles(c, table)
    _check_protocols(c, table)
    return c.issues


#: Example paths, as the fixes spell them.
_EXAMPLE = {
    "indices": "req_pool_indices",
    "owners": "rids",
    "ScheduleSlots(indices=...)": "req_pool_indices",
    "ScheduleSlots(owners=...)": "rids",
    "Scatter(offsets=...)": "query_start_loc",
    "Scatter(lengths=...)": "num_draft_tokens",
    "Scatter(when=...)": "sampled_ready",
    "HostCopy(mirror=...)": "seq_lens_cpu",
    "HostCopy(sum=...)": "seq_lens_sum",
    "Tails(rows=...)": "mix_running_indices",
    "Tails(prefix=...)": "prefix_lens",
    "TailsKv(locations=...)": "out_cache_loc",
    "TailsKv(table=...)": "req_to_token",
}


def _check_handover(c: _Collector, f: Field) -> None:
    """``unwritten`` and ``target_shape``: what a row holds first, what a target gets."""
    if not isinstance(f.unwritten, Unwritten):
        c.add(
            f,
            f"unwritten must be Unwritten.REFUSED or Unwritten.ZEROS (got {_got(f.unwritten)})",
            "write unwritten=Unwritten.ZEROS where a row never written reads as zeros",
        )
    if not isinstance(f.target_shape, TargetShape):
        c.add(
            f,
            "target_shape must be TargetShape.ROWS or TargetShape.FLAT "
            f"(got {_got(f.target_shape)})",
            "write target_shape=TargetShape.FLAT to hand the target (n * row,)",
        )
    elif f.target_shape is TargetShape.FLAT:
        if f.resolve is not Resolve.GATHER or f.target is None:
            c.add(
                f,
                "target_shape=TargetShape.FLAT flattens gathered rows, so it needs "
                f"resolve=Resolve.GATHER and a target (got resolve={f.resolve}, "
                f"target={f.target!r})",
                "leave target_shape out, or gather the field into a target",
            )
        elif isinstance(f.shape, tuple) and not f.shape:
            c.add(
                f,
                "target_shape=TargetShape.FLAT flattens the row dims into the batch "
                "dim, but the field's rows have none (shape=())",
                "leave target_shape out: one value per slot is already flat",
            )


def _check_parents(c: _Collector, fields: list[Field]) -> None:
    """``optional_parents``: attributes of the batch that hold resolve targets (what
    may go through one is the role table's rule, ``_check_roles``)."""
    parents = c.schema.optional_parents
    fix = 'write optional_parents={"spec_info": IfNone.SKIP}'
    if not isinstance(parents, tuple) or not all(
        isinstance(p, tuple) and len(p) == 2 for p in parents
    ):
        c.add(None, f"optional_parents must be a dict (got {_got(parents)})", fix)
        return
    firsts = {_first(f.target) for f in fields if _nested(f.target)}
    slots = [c.schema.indices]
    if isinstance(c.schema.schedule, ScheduleSlots):
        slots.append(c.schema.schedule.indices)
    for name, how in parents:
        if not isinstance(how, IfNone):
            c.add(
                None,
                f"optional_parents[{name!r}] must be an IfNone (got {_got(how)})",
                fix,
            )
        if not isinstance(name, str) or (
            name not in firsts
            and not any(name in (_first(p), p) for p in slots if isinstance(p, str))
        ):
            c.add(
                None,
                f"optional_parents names {name!r}, which is the first part of no "
                "target path, nor of the slots (indices, ScheduleSlots(indices=...)), "
                "nor the slots path itself",
                'name the batch attribute a target goes through, e.g. "spec_info", '
                'or the slots path, e.g. "spec_info.future_indices"',
            )


def _nested(path: object) -> bool:
    return isinstance(path, str) and "." in path


def _first(path: str | None) -> str:
    return (path or "").split(".")[0]


def _check_seeded(c: _Collector, fields: list[Field]) -> None:
    if not isinstance(c.schema.seeded, bool):
        c.add(
            None,
            f"seeded must be True or False (got {_got(c.schema.seeded)})",
            "write seeded=True",
        )
    elif c.schema.seeded and not any(
        f.lane is Lane.FORWARD and f.target is not None for f in fields
    ):
        c.add(
            None,
            "seeded=True makes seed(indices, payload) hand rows to the next "
            "resolve_future, but the schema resolves no forward-lane field",
            "leave seeded out, or give a forward-lane field a target",
        )


def _check_docs(c: _Collector, fields: list[Field]) -> None:
    """Doc strings reach the module as doc strings: refuse what Python cannot hold."""
    owners: list[tuple[Field | None, object]] = [(None, c.schema.doc)]
    owners += [(f, f.doc) for f in fields]
    for owner, doc in owners:
        if isinstance(doc, str) and (problem := naming.doc_problem(doc)) is not None:
            c.add(owner, f"doc {problem}", "keep doc strings to text UTF-8 can encode")


def _check_layout(c: _Collector) -> None:
    layout = c.schema.layout
    if not isinstance(layout, Layout):
        c.add(
            None,
            f"layout must be Layout.SEPARATE or Layout.PACKED (got {_got(layout)})",
            "write layout=Layout.PACKED (fields of one dtype share a buffer) or leave it out",
        )
    elif layout is Layout.PACKED and not c.issues and not packed_groups(c.schema):
        c.add(
            None,
            "layout=Layout.PACKED packs the eager, required, gathered forward-lane "
            "fields of one dtype into one buffer, but no two such fields share a dtype, so "
            "nothing would be packed",
            "leave layout out (Layout.SEPARATE), or give two such fields one dtype",
        )


def _check_field(c: _Collector, f: Field) -> None:
    _check_name(c, f)
    _check_options(c, f)
    _check_shape(c, f)
    _check_target(c, f)
    _check_handover(c, f)
    _check_groups(c, f)
    _check_left(c, f)


def _check_name(c: _Collector, f: Field) -> None:
    name = f.name
    if not isinstance(name, str) or not name.isidentifier():
        c.add(
            f,
            f"field name must be a Python identifier (got {_got(name)})",
            'use letters, digits and underscores, not starting with a digit, e.g. "topk_p"',
        )
    elif not naming.is_identifier(name):
        c.add(
            f, f"field name {name!r} is a Python keyword", f'rename it, e.g. "{name}_"'
        )
    elif name in naming.RESERVED or name.startswith(("resolve_", "_")):
        c.add(
            f,
            f"field name {name!r} clashes with a name the generated map defines or uses",
            f'rename the field, e.g. "{name.lstrip("_")}_value"',
        )
    elif (problem := naming.identifier_problem(name)) is not None:
        c.add(f, f"field name {name!r} {problem}", "rename the field")


def _check_options(c: _Collector, f: Field) -> None:
    """Lane, alloc, dtype, optional, source, resolve, guard and doc."""
    if not isinstance(f.lane, Lane):
        c.add(
            f,
            f"lane must be Lane.FORWARD or Lane.SCHEDULE (got {_got(f.lane)})",
            "write lane=Lane.FORWARD (stashed for the next forward) or lane=Lane.SCHEDULE "
            "(published for the scheduler)",
        )
    if not isinstance(f.alloc, Alloc):
        c.add(
            f,
            f"alloc must be Alloc.EAGER or Alloc.LAZY (got {_got(f.alloc)})",
            "write alloc=Alloc.EAGER (at construction) or alloc=Alloc.LAZY (first payload)",
        )
    else:
        _add_all(c, f, _alloc_problems(f))
    if not isinstance(f.dtype, (torch.dtype, FromPayload)):
        c.add(
            f,
            f"dtype must be a torch.dtype such as {_DTYPE_HINT}, or FROM_PAYLOAD "
            f"(got {_got(f.dtype)})",
            "write dtype=torch.<name>, e.g. dtype=torch.int64",
        )
    elif isinstance(f.dtype, torch.dtype):
        unusable = _unusable(f.dtype)
        if unusable is not None:
            c.add(
                f,
                f"dtype {f.dtype} cannot hold a relay buffer: torch cannot allocate it or "
                f"index its rows ({unusable})",
                f"use a dtype torch indexes, such as {_DTYPE_HINT}",
            )

    if not isinstance(f.optional, bool):
        c.add(
            f,
            f"optional must be True or False (got {_got(f.optional)})",
            "write optional=True if payloads may omit the field",
        )
    if f.source is not None and (
        not naming.is_identifier(f.source)
        or naming.identifier_problem(f.source) is not None
    ):
        c.add(
            f,
            f"source must be an identifier naming the payload attribute, not a keyword "
            f"or a reserved name (got {_got(f.source)})",
            'write source="next_token_ids", or leave it out to use the field name',
        )
    if not isinstance(f.resolve, (Resolve, Scatter)):
        c.add(
            f,
            "resolve must be Resolve.GATHER, Resolve.PLACEHOLDER or a Scatter(...) "
            f"(got {_got(f.resolve)})",
            'write resolve=Resolve.GATHER, or resolve=Scatter(offsets="query_starts")',
        )
    if not isinstance(f.guard, Guard):
        c.add(
            f,
            f"guard must be a Guard such as Guard.POSITIVE (got {_got(f.guard)})",
            "write guard=Guard.NONE, Guard.NON_NEGATIVE, Guard.POSITIVE or Guard.FINITE",
        )
    elif isinstance(f.dtype, (torch.dtype, FromPayload)):
        _add_all(c, f, _guard_problems(f))
    if not isinstance(f.doc, str):
        c.add(f, f"doc must be a str (got {_got(f.doc)})", 'write doc="..."')


def _add_all(
    c: _Collector, f: Field, problems: list[Problem], at: SourceLocation | None = None
) -> None:
    """The problems one rule found with ``f`` (with a group of it, declared ``at``)."""
    for problem, fix in problems:
        c.add(f, problem, fix, at)


def _check_shape(c: _Collector, f: Field) -> None:
    if not isinstance(f.shape, tuple):
        c.add(
            f,
            f'shape must be a tuple of dims such as ("topk",) or (8,) '
            f"(got {_got(f.shape)})",
            'write shape=("topk",), shape=(8,) or shape=()',
        )
        return
    for dim in f.shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, str)):
            c.add(
                f,
                f"shape dims must be positive ints or symbolic names (got {_got(dim)})",
                'write shape=("topk",) or shape=(8,)',
            )
        elif isinstance(dim, int) and dim <= 0:
            c.add(
                f,
                f"shape dims must be positive (got {dim})",
                'use a size >= 1, or a symbolic name such as "topk" given at construction',
            )
        elif isinstance(dim, str) and naming.identifier_problem(dim) is not None:
            c.add(
                f,
                f"symbolic dim must be an identifier that is not reserved (got {dim!r})",
                'name the dim like a keyword argument, e.g. "topk" or "hidden"',
            )


def _check_target(c: _Collector, f: Field) -> None:
    if f.target is not None and not _valid_path(f.target):
        c.add(
            f,
            f"target must be a dotted attribute path such as 'spec_info.topk_p' "
            f"(got {_got(f.target)})",
            'write target="seq_lens" or target="spec_info.topk_p": identifiers joined by dots',
        )
    if f.lane is Lane.SCHEDULE and f.target is None:
        c.add(
            f,
            "a schedule field needs a target on the batch to resolve into (got target=None)",
            'add target="<batch attribute>", e.g. target="seq_lens"',
        )
    if isinstance(f.resolve, (Resolve, Scatter)):
        _add_all(c, f, _placeholder_problems(f))
        _add_all(c, f, _scatter_problems(f))
    gathered = f.resolve is Resolve.GATHER and f.target is not None
    if f.gate is not None and not (
        isinstance(f.gate, str) and f.lane is Lane.FORWARD and f.optional and gathered
    ):
        c.add(
            f,
            "gate=... says whether a batch's rows hold an optional gathered "
            f"forward-lane field (got gate={f.gate!r}, lane={f.lane}, "
            f"optional={f.optional}, resolve={f.resolve}, target={f.target!r})",
            "declare it on an optional forward field with a target (extra(..., "
            'gate="spec_info.future_dsa_topk_indices_available")), or remove gate=...',
        )


def _check_unique(c: _Collector, fields: list[Field]) -> None:
    """Names, payload attributes and schedule resolves, each once (paths: the role
    table)."""
    first_name: dict[str, Field] = {}
    first_source: dict[tuple[Lane, str], Field] = {}
    first_method: dict[str, Field] = {}
    for f in fields:
        if not isinstance(f.name, str):
            continue
        if f.name in first_name:
            other = first_name[f.name]
            c.add(
                f,
                f"duplicate field name {f.name!r}; it is first declared at "
                f"{c.where(other.declared_at)}",
                "rename one of them, or delete the repeated declaration",
            )
            continue  # one mistake, one message: its source and targets repeat too
        first_name[f.name] = f
        if isinstance(f.lane, Lane) and naming.is_identifier(f.payload_name):
            key = (f.lane, f.payload_name)
            if key in first_source and first_source[key] is not f:
                other = first_source[key]
                c.add(
                    f,
                    f"payload attribute {f.payload_name!r} is also the source of "
                    f"field {other.name!r} ({c.where(other.declared_at)})",
                    'give each field its own source="..."',
                )
            else:
                first_source[key] = f
        mirror = f.host.mirror if isinstance(f.host, HostCopy) else None
        if f.lane is not Lane.SCHEDULE or not _valid_path(mirror or f.target or ""):
            continue
        method = resolve_method(f)
        if method in naming.METHODS:
            c.add(
                f,
                f"its schedule resolve would be named {method}(), which every map "
                "defines for another purpose",
                "give it another target or HostCopy(mirror=...)",
            )
        elif method in first_method:
            other = first_method[method]
            c.add(
                f,
                f"its schedule resolve would be named {method}(), like that of "
                f"field {other.name!r} ({c.where(other.declared_at)})",
                "give one of them a different target or HostCopy(mirror=...)",
            )
        else:
            first_method[method] = f


#: A field's problem: (what is wrong, with the value given; the fix).
Problem = tuple[str, str]


def _alloc_problems(f: Field) -> list[Problem]:
    if f.alloc is Alloc.EAGER and isinstance(f.dtype, FromPayload):
        return [
            (
                (
                    "dtype=FROM_PAYLOAD needs a lazily allocated field, but alloc is "
                    "Alloc.EAGER"
                ),
                "add alloc=Alloc.LAZY, or give a fixed dtype such as torch.bfloat16",
            )
        ]
    return []


def _guard_problems(f: Field) -> list[Problem]:
    if not isinstance(f.dtype, torch.dtype):
        return []  # a payload dtype: checked when the first payload arrives
    if f.guard is Guard.FINITE and not f.dtype.is_floating_point:
        return [
            (
                (
                    "guard=Guard.FINITE refuses NaN and infinities, which only floating "
                    f"values hold (got dtype={f.dtype})"
                ),
                (
                    "remove the guard, or give the field a floating dtype such as "
                    "torch.bfloat16"
                ),
            )
        ]
    comparison = f.guard in (Guard.POSITIVE, Guard.NON_NEGATIVE)
    if comparison and (f.dtype == torch.bool or f.dtype.is_complex):
        return [
            (
                (
                    f"guard={f.guard} compares values with 0, which {f.dtype} values "
                    f"cannot be checked by (got guard={f.guard} with dtype={f.dtype})"
                ),
                "remove the guard, or give the field a real integer or float dtype",
            )
        ]
    return []


# --- grouped declarations (Note [Grouped declarations] in relay/schema.py) ----------------
# A group's options cannot contradict each other: what is checked here is each value
# (a path, an int) and how the group fits the field that declares it.

_GROUPS: tuple[tuple[str, type, str], ...] = (
    ("host", HostCopy, 'host=HostCopy(mirror="seq_lens_cpu")'),
    ("tails", Tails, 'tails=Tails(rows="mix_running_indices")'),
)


def _group_paths(f: Field) -> list[tuple[str, object, SourceLocation]]:
    """Each path option of ``f``'s groups that is declared: option, value, site."""
    found: list[tuple[str, object, SourceLocation]] = []
    scatter, host, tails = f.scatter, f.host, f.tails
    if scatter is not None:
        found.append(("Scatter(offsets=...)", scatter.offsets, scatter.declared_at))
        found.append(("Scatter(lengths=...)", scatter.lengths, scatter.declared_at))
        found.append(("Scatter(when=...)", scatter.when, scatter.declared_at))
    if isinstance(host, HostCopy):
        found.append(("HostCopy(mirror=...)", host.mirror, host.declared_at))
        found.append(("HostCopy(sum=...)", host.sum, host.declared_at))
    if isinstance(tails, Tails):
        found.append(("Tails(rows=...)", tails.rows, tails.declared_at))
        found.append(("Tails(prefix=...)", tails.prefix, tails.declared_at))
        kv = tails.kv
        if isinstance(kv, TailsKv):
            found.append(("TailsKv(locations=...)", kv.locations, kv.declared_at))
            found.append(("TailsKv(table=...)", kv.table, kv.declared_at))
        elif kv is not None:
            found.append(("Tails(kv=...)", kv, tails.declared_at))
    optional = {"Scatter(lengths=...)", "Scatter(when=...)", "HostCopy(mirror=...)"}
    optional.add("HostCopy(sum=...)")
    optional.add("Tails(prefix=...)")
    return [(o, v, at) for o, v, at in found if v is not None or o not in optional]


def _check_groups(c: _Collector, f: Field) -> None:
    """``host`` and ``tails`` hold their group or ``None``, and every path a group
    names is one."""
    for option, kind, example in _GROUPS:
        value = getattr(f, option)
        if value is not None and not isinstance(value, kind):
            c.add(
                f,
                f"{option} must be a {kind.__name__}(...) or None (got {_got(value)})",
                f"write {example}, or leave it out",
            )
    for option, value, at in _group_paths(f):
        if option == "Tails(kv=...)":
            c.add(
                f,
                f"Tails(kv=...) must be a TailsKv(locations=..., table=...) (got "
                f"{_got(value)})",
                'write kv=TailsKv(locations="out_cache_loc", table="req_to_token")',
                at,
            )
        elif not _valid_path(value):
            c.add(
                f,
                f"{option} must be a dotted attribute path of the batch such as "
                f"{_EXAMPLE[option]!r} (got {_got(value)})",
                "write " + option.replace("...", f'"{_EXAMPLE[option]}"'),
                at,
            )
    if isinstance(f.host, HostCopy):
        _add_all(c, f, _host_problems(f, f.host), f.host.declared_at)
    if isinstance(f.tails, Tails):
        _add_all(c, f, _tails_problems(c.schema, f, f.tails), f.tails.declared_at)


def _host_problems(f: Field, host: HostCopy) -> list[Problem]:
    """A host copy is the schedule lane's, and a sum an int of one value per slot."""
    found: list[Problem] = []
    if f.lane is not Lane.SCHEDULE:
        found.append(
            (
                (
                    "host=HostCopy(...) hands the scheduler's host a copy behind the "
                    f"publish's fence, so it needs lane=Lane.SCHEDULE (got lane={f.lane})"
                ),
                "remove host=..., or move the field to Lane.SCHEDULE",
            )
        )
    if not isinstance(host.stream_ordered, bool):
        found.append(
            (
                (
                    f"HostCopy(stream_ordered=...) must be True or False (got "
                    f"{_got(host.stream_ordered)})"
                ),
                "write stream_ordered=True, or leave it out",
            )
        )
    elif host.mirror is None and host.sum is None and not host.stream_ordered:
        found.append(
            (
                "HostCopy() declares no host copy: no mirror, no sum, no stream order",
                'write HostCopy(mirror="seq_lens_cpu"), or remove host=...',
            )
        )
    if host.sum is None:
        return found
    if isinstance(f.shape, tuple) and f.shape:
        found.append(
            (
                (
                    f"HostCopy(sum=...) sums one value per slot, so it needs shape=() (got "
                    f"{f.shape!r})"
                ),
                "remove sum=..., or use HostCopy(mirror=...) for rows",
            )
        )
    if isinstance(f.dtype, FromPayload) or (
        isinstance(f.dtype, torch.dtype)
        and (f.dtype.is_floating_point or f.dtype.is_complex)
    ):
        got = "FROM_PAYLOAD" if isinstance(f.dtype, FromPayload) else str(f.dtype)
        found.append(
            (
                (
                    "HostCopy(sum=...) hands the batch an int, so it needs a fixed integer "
                    f"dtype; a float sum would be truncated (got dtype={got})"
                ),
                "give dtype=torch.int64, or remove sum=... and sum the mirror yourself",
            )
        )
    return found


def _scatter_problems(f: Field) -> list[Problem]:
    """``Scatter``: rows into a flat forward target at per-request offsets."""
    if f.scatter is None:
        return []
    found: list[Problem] = []
    # An optional scatter field must keep its rows when left out: nothing would say
    # what to lay in for a row a stash left out (vLLM V2's token while in prefill).
    left_out = f.optional is True and f.kept is not True
    if f.lane is not Lane.FORWARD or f.target is None or left_out:
        found.append(
            (
                (
                    "resolve=Scatter(...) writes a forward-lane field into its target, "
                    "required or kept when left out (got "
                    f"lane={f.lane}, target={f.target!r}, optional={f.optional}, "
                    f"kept={f.kept})"
                ),
                (
                    "make the field a forward-lane field with a target, required or "
                    "optional=True with kept=True"
                ),
            )
        )
    if isinstance(f.shape, tuple) and len(f.shape) > 1:
        found.append(
            (
                (
                    "resolve=Scatter(...) lays one value or one row of values per request "
                    f"into a flat target (got shape={f.shape!r})"
                ),
                "give the field shape=() or one row dim such as (1 + drafts,)",
            )
        )
    if isinstance(f.dtype, FromPayload):
        found.append(
            (
                (
                    "resolve=Scatter(...) writes into the target's own tensor, so the field "
                    "needs a fixed dtype (got dtype=FROM_PAYLOAD)"
                ),
                "give the target's dtype, e.g. dtype=torch.int64",
            )
        )
    return found


def _placeholder_problems(f: Field) -> list[Problem]:
    """``Resolve.PLACEHOLDER``: placeholders are negative slots, one per row."""
    if f.resolve is not Resolve.PLACEHOLDER:
        return []
    found: list[Problem] = []
    if isinstance(f.dtype, FromPayload):
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs a fixed integer dtype, since "
                    "placeholders are negative slots (got dtype=FROM_PAYLOAD)"
                ),
                "give dtype=torch.int64, or use resolve=Resolve.GATHER",
            )
        )
    elif isinstance(f.dtype, torch.dtype) and not _is_int_dtype(f.dtype):
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs an integer dtype, since "
                    f"placeholders are negative slots (got {f.dtype})"
                ),
                "use resolve=Resolve.GATHER for this field",
            )
        )
    elif isinstance(f.dtype, torch.dtype) and not f.dtype.is_signed:
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs a signed integer dtype, since "
                    f"placeholders are negative slots (got {f.dtype})"
                ),
                "give a signed dtype such as torch.int64, or use resolve=Resolve.GATHER",
            )
        )
    if f.optional is True:
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs the value on every step: a step "
                    "whose payload omits an optional field would leave the placeholders "
                    "(-slot) that invalidate wrote, or a previous step's value, for the "
                    "forward (got optional=True)"
                ),
                "make the field required (optional=False), or use resolve=Resolve.GATHER",
            )
        )
    if isinstance(f.shape, tuple) and f.shape:
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs one value per slot, shape=() "
                    f"(got shape={f.shape!r})"
                ),
                "use resolve=Resolve.GATHER for rows",
            )
        )
    if f.target is None:
        found.append(
            (
                (
                    "resolve=Resolve.PLACEHOLDER needs a target holding the placeholders "
                    "(got target=None)"
                ),
                'add target="input_ids" (or another batch tensor)',
            )
        )
    return found


# Note [Module-level names]
# A generated module binds these names at module level besides the classes it mints
# from the schema (the map, its payload and its Protocols), each as the top of
# relay/codegen/templates/map.py.jinja spells it. A schema whose class names take one
# of them would shadow an import the module's own code reads (``class torch``), or be
# shadowed by it. Keep this table equal to the template: tests/generator/
# test_codegen_unsafe.py parses rendered modules and checks that it covers every
# module-level binding that is not a class minted from the schema.
TEMPLATE_BINDS: dict[str, str] = {
    "annotations": "from __future__ import annotations",
    "Protocol": "from typing import Protocol",
    "attrs": "import attrs",
    "torch": "import torch",
    "_rt": "from relay import runtime as _rt",
    "_TABLE": "_TABLE = _rt.Table(...)",
    "__all__": "__all__ = [...]",
}

#: Builtins the generated code calls (``int``, ``isinstance``, ``ValueError``...): a
#: module-level class of the same name would shadow them for the whole module. All of
#: them are refused, so a template change that calls one more needs no change here.
_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))

#: Control characters a doc string may hold: they lay out text.
_LAYOUT = frozenset("\t\n")

_CONTROL_NAMES = {
    0x00: "NUL",
    0x07: "BEL",
    0x08: "BS",
    0x0B: "VT",
    0x0C: "FF",
    0x0D: "CR",
    0x1B: "ESC",
    0x7F: "DEL",
}

#: A schema-level problem: (the declaration, or None: the schema), what, fix.
Located = tuple[Field | None, str, str]


def _name_and_doc_problems(schema: Schema) -> list[Located]:
    """Every class-name clash and every control character of ``schema``."""
    return [*_class_names(schema), *_doc_controls(schema)]


def _taken(name: str) -> str | None:
    """How the generated module already binds ``name``, if it does."""
    if name in TEMPLATE_BINDS:
        return f"a name the generated module binds itself ({TEMPLATE_BINDS[name]})"
    if name in _BUILTINS:
        return "a Python builtin the generated module would shadow"
    return None


def _class_names(schema: Schema) -> Iterator[Located]:
    name = schema.name
    if not naming.is_identifier(name):
        return  # validate reports it
    problem = naming.identifier_problem(name, reserved=False)
    if problem is not None:
        yield (None, f"schema name {name!r} {problem}", _rename_schema(name))
        return
    for minted, what in (
        (name, "the map class"),
        (naming.payload_class(schema), "its payload class"),
        (naming.batch_protocol(schema), "its batch Protocol"),
    ):
        taken = _taken(minted)
        if taken is not None:
            problem = (
                f"schema name {name!r} is {taken}"
                if minted == name
                else f"schema name {name!r} makes {what} {minted}, {taken}"
            )
            yield (None, problem, _rename_schema(name))
            return


def _rename_schema(name: str) -> str:
    stem = naming.python_name(name).strip("_") or "Relay"
    return f'name the schema like a class of its own, e.g. name="{stem[:1].upper()}{stem[1:]}FutureMap"'


def _doc_controls(schema: Schema) -> Iterator[Located]:
    owners: list[tuple[Field | None, object]] = [(None, schema.doc)]
    owners += [(f, f.doc) for f in schema.fields if isinstance(f, Field)]
    for owner, doc in owners:
        if not isinstance(doc, str):
            continue
        found = control_character(doc)
        if found is not None:
            yield (
                owner,
                f"doc holds the control character {found}",
                (
                    "delete it (or write what it stands for in words); doc strings may "
                    "hold tabs and line breaks, but no other control character"
                ),
            )


def control_character(text: str) -> str | None:
    """The first control character of ``text`` other than tab and newline, and where it
    is (``U+0000 (NUL) at line 2, column 5``); ``None`` if there is none."""
    for index, ch in enumerate(text):
        if ch in _LAYOUT or unicodedata.category(ch) != "Cc":
            continue
        line = text.count("\n", 0, index) + 1
        column = index - (text.rfind("\n", 0, index) + 1) + 1
        code = ord(ch)
        named = f" ({_CONTROL_NAMES[code]})" if code in _CONTROL_NAMES else ""
        return f"U+{code:04X}{named} at line {line}, column {column}"
    return None


# --- counted scatters (Note [Counted scatters] in relay/runtime.py) ---------------------


def _check_counted_scatters(c: _Collector, fields: list[Field]) -> None:
    """``Scatter(lengths=...)`` and ``Scatter(after=...)``: per-request counts, and
    several scatter fields laid one after another into each request's span of one
    target."""
    by_name = {f.name: f for f in fields if isinstance(f.name, str)}
    payload = {f.payload_name: f for f in fields if f.lane is Lane.FORWARD}
    leaves: dict[str, tuple[str, Field]] = {}
    followed: dict[str, Field] = {}
    alone: dict[object, Field] = {}  # each target's scatter without after
    for f in fields:
        scatter = f.scatter
        if scatter is None:
            continue
        if _valid_path(scatter.lengths):
            _check_lengths(c, f, scatter, payload, leaves)
        if scatter.when is not None and scatter.lengths is not None:
            c.add(
                f,
                "Scatter(when=...) lays a request's whole row or none of it, and "
                "Scatter(lengths=...) lays its first values: a field takes one of them",
                "count the values with lengths=... (0 where none are laid), or keep "
                "when=... and remove lengths=...",
                scatter.declared_at,
            )
        if scatter.after is not None:
            _check_after(c, f, scatter, by_name, followed)
        elif f.target in alone:
            other = alone[f.target]
            c.add(
                f,
                f"target {f.target!r} is also where scatter field {other.name!r} "
                f"({c.where(other.declared_at)}) starts each request's span: the two "
                "would overlap",
                f"lay it after the other with Scatter(after={other.name!r}), or give "
                "it another target",
                scatter.declared_at,
            )
        else:
            alone[f.target] = f
    # A target's scatter fields form one chain.
    for f in fields:
        seen = {f.name}
        after = _after(f) if _after(f) != f.name else None  # refused above
        while isinstance(after, str) and after in by_name:
            if after in seen:
                c.add(
                    f,
                    f"Scatter(after={_after(f)!r}) leads back to {f.name!r}: the fields' "
                    "places in the span depend on each other",
                    "start the chain at a field without after=...",
                )
                break
            seen.add(after)
            nxt = by_name[after].scatter
            after = nxt.after if nxt is not None else None


def _after(f: Field) -> object:
    return f.scatter.after if f.scatter is not None else None


def _check_lengths(
    c: _Collector,
    f: Field,
    scatter: Scatter,
    payload: dict[str, Field],
    leaves: dict[str, tuple[str, Field]],
) -> None:
    assert isinstance(scatter.lengths, str)
    lengths, at = scatter.lengths, scatter.declared_at
    if isinstance(f.shape, tuple) and not f.shape:
        c.add(
            f,
            "Scatter(lengths=...) counts the values of each row, but the row is one "
            "value (got shape=())",
            'give the row a width, e.g. shape=("drafts",), or remove lengths=...',
            at,
        )
    leaf = lengths.rsplit(".", 1)[-1]
    clash = payload.get(leaf)
    if naming.identifier_problem(leaf) is not None:
        c.add(
            f,
            f"the stash payload carries the producer's count as {leaf!r} (the last name "
            "of lengths), a name the generated module keeps for itself",
            "name the count attribute otherwise",
            at,
        )
    elif clash is not None:
        c.add(
            f,
            f"the stash payload carries the producer's count as {leaf!r} (the last "
            f"name of lengths), which is also the payload attribute of field "
            f"{clash.name!r} ({c.where(clash.declared_at)})",
            "name the count attribute otherwise, or give that field another source",
            at,
        )
    first = leaves.setdefault(leaf, (lengths, f))
    if first[0] != lengths:
        c.add(
            f,
            f"lengths={lengths!r} and {first[0]!r} (field {first[1].name!r}) both "
            f"end in {leaf!r}, the payload attribute of the producer's count",
            "give the counts different last names",
            at,
        )


def _check_after(
    c: _Collector,
    f: Field,
    scatter: Scatter,
    by_name: dict[str, Field],
    followed: dict[str, Field],
) -> None:
    at = scatter.declared_at
    first = by_name.get(scatter.after) if isinstance(scatter.after, str) else None
    if first is None or first is f:
        c.add(
            f,
            "Scatter(after=...) must name another scatter field of the schema (got "
            f"{_got(scatter.after)})",
            "name the field whose values come first in each request's span",
            at,
        )
        return
    other = first.scatter
    if other is None or first.target != f.target or other.offsets != scatter.offsets:
        got = f"Scatter(offsets={other.offsets!r})" if other else f"{first.resolve}"
        c.add(
            f,
            f"after={first.name!r} lays this field's values after that field's in each "
            f"request's span, so both scatter into one target from one offsets (got "
            f"{first.name!r}: resolve={got}, target={first.target!r}; this field: "
            f"offsets={scatter.offsets!r}, target={f.target!r})",
            f"give both resolve=Scatter(offsets={other.offsets if other else 'starts'!r})"
            f" and target={first.target!r}",
            at,
        )
    taken = followed.setdefault(first.name, f)
    if taken is not f:
        c.add(
            f,
            f"after={first.name!r}, like field {taken.name!r} "
            f"({c.where(taken.declared_at)}): both would start at the same place",
            f"lay it after {taken.name!r} instead",
            at,
        )


# --- graph-written buffers, kept fields, late-bound tails ---------------------------------


def _check_left(c: _Collector, f: Field) -> None:
    """``graph_written`` and ``kept``."""
    for option in ("graph_written", "kept"):
        if not isinstance(getattr(f, option), bool):
            c.add(
                f,
                f"{option} must be True or False (got {_got(getattr(f, option))})",
                f"write {option}=True, or leave it out",
            )
    _add_all(c, f, _graph_problems(c.schema, f))
    if f.kept is True and f.lane is Lane.SCHEDULE:
        c.add(
            f,
            "kept=True keeps a forward field's rows through a partial stash, but this "
            "field is on the schedule lane, which no stash writes",
            "remove kept=True, or move the field to lane=Lane.FORWARD",
        )


def _graph_problems(schema: Schema, f: Field) -> list[Problem]:
    if f.graph_written is not True:
        return []
    problems = []
    if f.alloc is Alloc.LAZY or isinstance(f.dtype, FromPayload):
        problems.append(
            (
                (
                    "graph_written=True adopts a buffer the engine allocated before the map "
                    "(a captured graph writes it at a fixed address), so it needs "
                    f"alloc=Alloc.EAGER and a fixed dtype (got alloc={f.alloc}, "
                    f"dtype={f.dtype!r})"
                ),
                "remove alloc=Alloc.LAZY and give a torch dtype, or remove graph_written",
            )
        )
    if f.optional is True:
        problems.append(
            (
                (
                    "graph_written=True already lets a write pass None (the graph wrote the "
                    "rows), so the field cannot also be optional (None: left out)"
                ),
                "remove optional=True, or remove graph_written",
            )
        )
    packed = (
        schema.layout is Layout.PACKED
        and f.lane is Lane.FORWARD
        and f.target is not None
        and f.resolve is Resolve.GATHER
    )
    if packed:
        problems.append(
            (
                (
                    "graph_written=True adopts the engine's buffer, but layout=Layout.PACKED "
                    "makes this field's buffer a view of the map's own packed buffer"
                ),
                "declare the schema with Layout.SEPARATE, or remove graph_written",
            )
        )
    return problems


def _tails_problems(schema: Schema, f: Field, tails: Tails) -> list[Problem]:
    """What ``resolve_tails`` needs of the field that declares ``tails``."""
    add = tails.add
    problems: list[Problem] = []
    if isinstance(add, bool) or not isinstance(add, int) or add < 0:
        problems.append(
            (
                f"Tails(add=...) must be 0 or a positive int (got {_got(add)})",
                (
                    "write add=1 where the published lengths are committed ones (a row "
                    "decodes one token more), add=0 where they count it"
                ),
            )
        )
    if f.lane is not Lane.SCHEDULE:
        problems.append(
            (
                (
                    "tails=Tails(...) rebuilds decode rows' lengths from published values, "
                    "so it needs lane=Lane.SCHEDULE"
                ),
                "move the field to lane=Lane.SCHEDULE, or remove tails",
            )
        )
    if f.optional is True:
        problems.append(
            (
                (
                    "tails=Tails(...) reads the published rows of every mixed batch, so the "
                    "field cannot be optional (a publish may leave it out)"
                ),
                "remove optional=True, or remove tails",
            )
        )
    if f.shape != () or not _is_int_dtype(f.dtype):
        problems.append(
            (
                (
                    "tails=Tails(...) rebuilds one length per decode row, so it needs "
                    f"shape=() and an integer dtype (got shape={f.shape!r}, "
                    f"dtype={f.dtype!r})"
                ),
                (
                    "declare the lengths field with shape=() and dtype=torch.int64, or "
                    "remove tails"
                ),
            )
        )
    if f.resolve is not Resolve.GATHER or f.target is None:
        problems.append(
            (
                (
                    "tails=Tails(...) rebuilds the last rows of the field's gathered "
                    "target, so it needs resolve=Resolve.GATHER and a target (got "
                    f"resolve={f.resolve}, target={f.target!r})"
                ),
                "gather the field into a target, or remove tails",
            )
        )
    mirror = f.host.mirror if isinstance(f.host, HostCopy) else None
    if mirror is None and isinstance(f.host, HostCopy) and f.host.sum is not None:
        problems.append(
            (
                (
                    "tails=Tails(...) recomputes the host sum from the whole host copy of "
                    "the lengths, so it needs HostCopy(mirror=...) as well"
                ),
                'add mirror="seq_lens_cpu" to the HostCopy, or remove its sum',
            )
        )
    if mirror is None and tails.prefix is not None:
        problems.append(
            (
                (
                    "Tails(prefix=...) rebuilds a host list from the host copy of the "
                    "published lengths, so it needs host=HostCopy(mirror=...) as well"
                ),
                'add host=HostCopy(mirror="seq_lens_cpu"), or remove prefix',
            )
        )
    return problems


def _check_partial_and_tails(c: _Collector, fields: list[Field]) -> None:
    """A partial stash writes something, and one field binds the tails."""
    forward = [f for f in fields if f.lane is Lane.FORWARD]
    kept = [f for f in forward if f.kept is True]
    if kept and len(kept) == len(forward):
        c.add(
            kept[0],
            "every forward field is kept=True, so stash_partial would write nothing",
            "leave kept=True off the fields a partial stash refreshes (the bonus token)",
        )
    tails = [f for f in fields if f.tails is not None]
    for f in tails[1:]:
        c.add(
            f,
            f"tails=... is also declared on field {tails[0].name!r} "
            f"({c.where(tails[0].declared_at)}); a map has one resolve_tails",
            "declare tails on the lengths field alone",
        )


# --- the schedule lane's own slots and owners (Note [Slots per lane] in relay/schema.py) ---


def _check_schedule_slots(c: _Collector, fields: list[Field]) -> None:
    """``Schema(schedule=ScheduleSlots(...))``: where the schedule lane's resolves read
    their slots and requests, apart from the forward batch's."""
    lanes = c.schema.schedule
    if lanes is None:
        return
    if not isinstance(lanes, ScheduleSlots):
        c.add(
            None,
            f"schedule must be a ScheduleSlots(...) or None (got {_got(lanes)})",
            'write schedule=ScheduleSlots(indices="slots", owners="req_ids")',
        )
        return
    at = lanes.declared_at
    for option, path in (("indices", lanes.indices), ("owners", lanes.owners)):
        spelled = f"ScheduleSlots({option}=...)"
        if path is not None and not _valid_path(path):
            c.add(
                None,
                f"{spelled} must be a dotted attribute path of the batch such as "
                f"{_EXAMPLE[spelled]!r} (got {_got(path)})",
                f'write {option}="{_EXAMPLE[spelled]}", or leave it out',
                at,
            )
    if lanes.indices is None and lanes.owners is None:
        c.add(
            None,
            "ScheduleSlots() names neither the schedule lane's slots nor its owners",
            'write ScheduleSlots(indices="slots"), or remove schedule=...',
            at,
        )
    schedule = [f for f in fields if f.lane is Lane.SCHEDULE]
    if not schedule:
        c.add(
            None,
            "schedule=ScheduleSlots(...) names what the schedule lane's resolves read, "
            "but the schema has no schedule-lane field",
            "remove schedule=..., or add a Field(..., lane=Lane.SCHEDULE)",
            at,
        )
    for f in schedule:
        if f.resolve is Resolve.PLACEHOLDER:
            c.add(
                f,
                "a schedule-lane placeholder is written by invalidate on the forward "
                "batch, but with schedule=ScheduleSlots(...) the schedule resolve hands "
                "its value to the scheduler's own object, so the placeholders would "
                "stay where they were written",
                "resolve the field with Resolve.GATHER, or remove schedule=...",
            )


# --- one role per attribute path (Note [One role per path] in roles.py) -----------------


def _check_roles(c: _Collector, table: list[Role]) -> None:
    """Each path of the role table against every path declared before it: the same
    path, one inside it, or one it is inside. One pass over the table with two maps
    (the roles of each path, and of each object a path goes through), so 1,000-field
    schemas stay fast. A declaration is reported once, at its line."""
    named: dict[str, list[Role]] = {}
    holding: dict[str, list[Role]] = {}  # an object -> the roles of paths inside it
    for role in table:
        if not _valid_path(role.path):
            continue
        parts = role.path.split(".")
        outers = [".".join(parts[:depth]) for depth in range(1, len(parts))]
        earlier = [
            *named.get(role.path, ()),
            *(r for o in outers for r in named.get(o, ())),
            *holding.get(role.path, ()),
        ]
        for first in earlier:
            found = clash(first, role, _one_span(first, role), c.where)
            if found is not None:
                c.add(role.field, *found, role.at)
                break
        named.setdefault(role.path, []).append(role)
        for outer in outers:
            holding.setdefault(outer, []).append(role)


def _one_span(first: Role, second: Role) -> bool:
    """Both roles are the targets of scatter fields (one target's span)."""
    return (
        first.field is not None
        and second.field is not None
        and first.field.scatter is not None
        and second.field.scatter is not None
    )


def _check_protocols(c: _Collector, table: list[Role]) -> None:
    """The Protocol of each object a path goes through (``EagleSpecInfo``, and
    ``EagleScheduleSpecInfo`` on the schedule lane's batch where that is apart) takes
    no name the module already binds, nor another object's."""
    schema = c.schema
    taken = "a name the module already defines"
    bound = {
        schema.name: f"{taken} (the map class)",
        naming.payload_class(schema): f"{taken} (its payload class)",
        naming.batch_protocol(schema): f"{taken} (its batch Protocol)",
    }
    if schema.lanes_apart:
        bound[naming.schedule_protocol(schema)] = (
            f"{taken} (the schedule lane's batch Protocol)"
        )
    owners: dict[str, tuple[str, Role]] = {}
    for role in table:
        if not _valid_path(role.path):
            continue
        parts = tuple(role.path.split("."))
        for schedule in _batches(schema, role):
            for depth in range(1, len(parts)):
                through = ".".join(parts[:depth])
                name = naming.nested_protocol(schema, parts[:depth], schedule=schedule)
                key = ("schedule " if schedule else "") + through
                first = owners.setdefault(name, (key, role))
                if name in bound or _taken(name) is not None:
                    clash = bound.get(name) or _taken(name)
                elif first[0] != key:
                    other = first[1]
                    by = f"field {other.field.name!r}" if other.field else "the schema"
                    clash = f"like that of {first[0]!r} ({by}, {c.where(other.at)})"
                else:
                    continue
                c.add(
                    role.field,
                    f"{role.option} {role.path!r} goes through {through!r}, whose "
                    f"generated Protocol would be named {name}, {clash}",
                    f"rename the attribute {parts[depth - 1]!r} on the batch, or the "
                    "schema",
                    role.at,
                )
                return


def _batches(schema: Schema, role: Role) -> tuple[bool, ...]:
    """Which batch Protocols hold ``role``'s path: the forward batch's (False), the
    schedule lane's (True) where that lane's batch is apart (Note [Slots per lane])."""
    if not schema.lanes_apart:
        return (False,)
    f, lanes = role.field, schema.schedule
    if f is None and role.option.startswith("ScheduleSlots"):
        return (True,)
    if f is None:  # the forward batch's, and the schedule's where it falls back
        own = (
            getattr(lanes, role.option, None)
            if role.option != "optional_parents"
            else 0
        )
        return (False, True) if own is None else (False,)
    if f.lane is Lane.FORWARD or role.option.startswith(("Tails", "TailsKv")):
        return (False,)
    return (True, False) if f.tails is not None else (True,)
