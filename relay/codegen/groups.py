"""The grouped declarations' rules: a scatter's offsets, counts and span, a host copy,
a mixed batch's tails, the schedule lane's own slots, owners with member rows, a map's
switches and its staged draft inputs (Note [Grouped declarations] in
relay/schema.py). A group's options cannot contradict each other; what is checked here
is each value (a path, an int) and how the group fits the field or schema declaring it.
"""

from __future__ import annotations

import torch

from relay.codegen import naming
from relay.codegen.report import (
    EXAMPLE,
    Collector,
    got,
    is_int_dtype,
    unusable_dtype,
    valid_path,
)
from relay.schema import (
    BatchRows,
    Field,
    FromPayload,
    HostCopy,
    Lane,
    Members,
    Resolve,
    Scatter,
    ScheduleSlots,
    Schema,
    SourceLocation,
    Staged,
    Switch,
    Tails,
    TailsKv,
    resolve_method,
)

__all__ = [
    "check_counted_scatters",
    "check_groups",
    "check_members",
    "check_scatter",
    "check_schedule_slots",
    "check_staged",
    "check_switches",
]


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
        rows = scatter.rows
        if isinstance(rows, BatchRows):
            found.append(("BatchRows(starts=...)", rows.starts, rows.declared_at))
            found.append(("BatchRows(index=...)", rows.index, rows.declared_at))
        elif rows is not None:
            found.append(("Scatter(rows=...)", rows, scatter.declared_at))
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
    optional.update(("HostCopy(sum=...)", "Tails(prefix=...)", "BatchRows(index=...)"))
    return [(o, v, at) for o, v, at in found if v is not None or o not in optional]


def check_groups(c: Collector, f: Field) -> None:
    """``host`` and ``tails`` hold their group or ``None``, and every path a group
    names is one."""
    for option, kind, example in _GROUPS:
        value = getattr(f, option)
        if value is not None and not isinstance(value, kind):
            c.add(
                f,
                f"{option} must be a {kind.__name__}(...) or None (got {got(value)})",
                f"write {example}, or leave it out",
            )
    for option, value, at in _group_paths(f):
        if option == "Tails(kv=...)":
            c.add(
                f,
                f"Tails(kv=...) must be a TailsKv(locations=..., table=...) (got "
                f"{got(value)})",
                'write kv=TailsKv(locations="out_cache_loc", table="req_to_token")',
                at,
            )
        elif option == "Scatter(rows=...)":
            c.add(
                f,
                f"Scatter(rows=...) must be a BatchRows(starts=..., index=...) or None "
                f"(got {got(value)})",
                'write rows=BatchRows(starts="query_start_loc"), or leave it out',
                at,
            )
        elif not valid_path(value):
            c.add(
                f,
                f"{option} must be a dotted attribute path of the batch such as "
                f"{EXAMPLE[option]!r} (got {got(value)})",
                "write " + option.replace("...", f'"{EXAMPLE[option]}"'),
                at,
            )
    if isinstance(f.host, HostCopy):
        _check_host(c, f, f.host, f.host.declared_at)
    if isinstance(f.tails, Tails):
        _check_tails(c, c.schema, f, f.tails, f.tails.declared_at)


def _check_host(
    c: Collector, f: Field, host: HostCopy, at: SourceLocation | None = None
) -> None:
    """A host copy is the schedule lane's, and a sum an int of one value per slot."""
    if f.lane is not Lane.SCHEDULE:
        c.add(
            f,
            "host=HostCopy(...) hands the scheduler's host a copy behind the "
            f"publish's fence, so it needs lane=Lane.SCHEDULE (got lane={f.lane})",
            "remove host=..., or move the field to Lane.SCHEDULE",
            at,
        )
    if not isinstance(host.stream_ordered, bool):
        c.add(
            f,
            f"HostCopy(stream_ordered=...) must be True or False (got "
            f"{got(host.stream_ordered)})",
            "write stream_ordered=True, or leave it out",
            at,
        )
    elif host.mirror is None and host.sum is None and not host.stream_ordered:
        c.add(
            f,
            "HostCopy() declares no host copy: no mirror, no sum, no stream order",
            'write HostCopy(mirror="seq_lens_cpu"), or remove host=...',
            at,
        )
    if host.sum is None:
        return
    if isinstance(f.shape, tuple) and f.shape:
        c.add(
            f,
            f"HostCopy(sum=...) sums one value per slot, so it needs shape=() (got "
            f"{f.shape!r})",
            "remove sum=..., or use HostCopy(mirror=...) for rows",
            at,
        )
    if isinstance(f.dtype, FromPayload) or (
        isinstance(f.dtype, torch.dtype)
        and (f.dtype.is_floating_point or f.dtype.is_complex)
    ):
        spelled = "FROM_PAYLOAD" if isinstance(f.dtype, FromPayload) else str(f.dtype)
        c.add(
            f,
            "HostCopy(sum=...) hands the batch an int, so it needs a fixed integer "
            f"dtype; a float sum would be truncated (got dtype={spelled})",
            "give dtype=torch.int64, or remove sum=... and sum the mirror yourself",
            at,
        )


def check_scatter(c: Collector, f: Field, at: SourceLocation | None = None) -> None:
    """``Scatter``: rows into a flat forward target at per-request offsets."""
    if f.scatter is None:
        return
    # An optional scatter field must keep its rows when left out: nothing would say
    # what to lay in for a row a stash left out (vLLM V2's token while in prefill).
    left_out = f.optional is True and f.kept is not True
    if f.lane is not Lane.FORWARD or f.target is None or left_out:
        c.add(
            f,
            "resolve=Scatter(...) writes a forward-lane field into its target, "
            f"required or kept when left out (got lane={f.lane}, "
            f"target={f.target!r}, optional={f.optional}, kept={f.kept})",
            "make the field a forward-lane field with a target, required or "
            "optional=True with kept=True",
            at,
        )
    scatter = f.scatter
    if scatter.when is not None and scatter.lengths is not None:
        c.add(
            f,
            "Scatter(when=...) lays a request's whole row or none of it, and "
            "Scatter(lengths=...) lays its first values: a field takes one of them",
            "count the values with lengths=... (0 where none are laid), or keep "
            "when=... and remove lengths=...",
            scatter.declared_at,
        )
    if scatter.rows is not None and scatter.after is not None:
        c.add(
            f,
            "Scatter(rows=...) bounds each request's whole span, which starts at the "
            f"field the chain starts with; this field lays its values after "
            f"{scatter.after!r}'s",
            "declare rows=BatchRows(...) once, on the scatter field without after=...",
            scatter.declared_at,
        )
    if isinstance(f.shape, tuple) and len(f.shape) > 1:
        c.add(
            f,
            "resolve=Scatter(...) lays one value or one row of values per request "
            f"into a flat target (got shape={f.shape!r})",
            "give the field shape=() or one row dim such as (1 + drafts,)",
            at,
        )
    if isinstance(f.dtype, FromPayload):
        c.add(
            f,
            "resolve=Scatter(...) writes into the target's own tensor, so the field "
            "needs a fixed dtype (got dtype=FROM_PAYLOAD)",
            "give the target's dtype, e.g. dtype=torch.int64",
            at,
        )
    if scatter.cast is not None:
        _check_cast(c, f, scatter)


def _laid_dtype(f: Field) -> object:
    """The dtype ``f``'s scatter lays into its target: its ``cast``, else its own."""
    cast = f.scatter.cast if f.scatter is not None else None
    return f.dtype if cast is None else cast


def _check_cast(c: Collector, f: Field, scatter: Scatter) -> None:
    """``Scatter(cast=...)``: a target dtype every value of the field's can become
    without losing what it is (Note [Casting scatters] in relay/runtime.py)."""
    cast, at = scatter.cast, scatter.declared_at
    if not isinstance(cast, torch.dtype):
        c.add(
            f,
            f"Scatter(cast=...) must be a torch.dtype, the target's (got {got(cast)})",
            "write cast=torch.int32, or leave it out where the target has the "
            "field's dtype",
            at,
        )
        return
    if not isinstance(f.dtype, torch.dtype):
        return  # FROM_PAYLOAD: refused above
    if cast == f.dtype:
        c.add(
            f,
            f"Scatter(cast={cast}) names the field's own dtype: nothing would be cast",
            "leave cast out",
            at,
        )
        return
    unusable = unusable_dtype(cast)
    if unusable is not None:
        c.add(
            f,
            f"Scatter(cast={cast}): torch cannot write {cast} values into a target "
            f"({unusable})",
            "cast to a dtype torch indexes, such as torch.int32",
            at,
        )
        return
    integers = (is_int_dtype(f.dtype) or f.dtype == torch.bool) and is_int_dtype(cast)
    widened = (
        f.dtype.is_floating_point
        and cast.is_floating_point
        and torch.promote_types(f.dtype, cast) == cast
    )
    if not (integers or widened):
        c.add(
            f,
            f"Scatter(cast={cast}) would turn the field's {f.dtype} values into "
            f"{cast}, which loses values (fractions, signs or range) whatever they "
            "are: relay casts an integer field into an integer target, or a floating "
            "one into a wider floating one",
            f"give the field the target's dtype ({cast}), or cast the values "
            "yourself before the stash",
            at,
        )


# --- counted scatters (Note [Counted scatters] in relay/runtime.py) ---------------------


def check_counted_scatters(c: Collector, fields: list[Field]) -> None:
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
        if valid_path(scatter.lengths):
            _check_lengths(c, f, scatter, payload, leaves)
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
    c: Collector,
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
    c: Collector,
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
            f"{got(scatter.after)})",
            "name the field whose values come first in each request's span",
            at,
        )
        return
    other = first.scatter
    if other is None or first.target != f.target or other.offsets != scatter.offsets:
        spelled = f"Scatter(offsets={other.offsets!r})" if other else f"{first.resolve}"
        c.add(
            f,
            f"after={first.name!r} lays this field's values after that field's in each "
            f"request's span, so both scatter into one target from one offsets (got "
            f"{first.name!r}: resolve={spelled}, target={first.target!r}; this field: "
            f"offsets={scatter.offsets!r}, target={f.target!r})",
            f"give both resolve=Scatter(offsets={other.offsets if other else 'starts'!r})"
            f" and target={first.target!r}",
            at,
        )
    elif _laid_dtype(first) != _laid_dtype(f) and all(
        isinstance(_laid_dtype(g), torch.dtype) for g in (first, f)
    ):
        c.add(
            f,
            f"this field lays {_laid_dtype(f)} values into {f.target!r} after "
            f"{first.name!r}'s {_laid_dtype(first)} ones: one target holds one dtype",
            "give both fields the target's dtype, or Scatter(cast=<the target's "
            "dtype>) to the one whose values are another",
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


def _check_tails(
    c: Collector,
    schema: Schema,
    f: Field,
    tails: Tails,
    at: SourceLocation | None = None,
) -> None:
    """What ``resolve_tails`` needs of the field that declares ``tails``."""
    add = tails.add
    if isinstance(add, bool) or not isinstance(add, int) or add < 0:
        c.add(
            f,
            f"Tails(add=...) must be 0 or a positive int (got {got(add)})",
            "write add=1 where the published lengths are committed ones (a row "
            "decodes one token more), add=0 where they count it",
            at,
        )
    if f.lane is not Lane.SCHEDULE:
        c.add(
            f,
            "tails=Tails(...) rebuilds decode rows' lengths from published values, "
            "so it needs lane=Lane.SCHEDULE",
            "move the field to lane=Lane.SCHEDULE, or remove tails",
            at,
        )
    if f.optional is True:
        c.add(
            f,
            "tails=Tails(...) reads the published rows of every mixed batch, so the "
            "field cannot be optional (a publish may leave it out)",
            "remove optional=True, or remove tails",
            at,
        )
    if f.shape != () or not is_int_dtype(f.dtype):
        c.add(
            f,
            "tails=Tails(...) rebuilds one length per decode row, so it needs "
            f"shape=() and an integer dtype (got shape={f.shape!r}, "
            f"dtype={f.dtype!r})",
            "declare the lengths field with shape=() and dtype=torch.int64, or "
            "remove tails",
            at,
        )
    if f.resolve is not Resolve.GATHER or f.target is None:
        c.add(
            f,
            "tails=Tails(...) rebuilds the last rows of the field's gathered "
            "target, so it needs resolve=Resolve.GATHER and a target (got "
            f"resolve={f.resolve}, target={f.target!r})",
            "gather the field into a target, or remove tails",
            at,
        )
    mirror = f.host.mirror if isinstance(f.host, HostCopy) else None
    if mirror is None and isinstance(f.host, HostCopy) and f.host.sum is not None:
        c.add(
            f,
            "tails=Tails(...) recomputes the host sum from the whole host copy of "
            "the lengths, so it needs HostCopy(mirror=...) as well",
            'add mirror="seq_lens_cpu" to the HostCopy, or remove its sum',
            at,
        )
    if mirror is None and tails.prefix is not None:
        c.add(
            f,
            "Tails(prefix=...) rebuilds a host list from the host copy of the "
            "published lengths, so it needs host=HostCopy(mirror=...) as well",
            'add host=HostCopy(mirror="seq_lens_cpu"), or remove prefix',
            at,
        )


# --- the schedule lane's own slots and owners (Note [Slots per lane] in relay/schema.py) ---


def check_schedule_slots(c: Collector, fields: list[Field]) -> None:
    """``Schema(schedule=ScheduleSlots(...))``: where the schedule lane's resolves read
    their slots and requests, apart from the forward batch's."""
    lanes = c.schema.schedule
    if lanes is None:
        return
    if not isinstance(lanes, ScheduleSlots):
        c.add(
            None,
            f"schedule must be a ScheduleSlots(...) or None (got {got(lanes)})",
            'write schedule=ScheduleSlots(indices="slots", owners="req_ids")',
        )
        return
    at = lanes.declared_at
    for option, path in (("indices", lanes.indices), ("owners", lanes.owners)):
        spelled = f"ScheduleSlots({option}=...)"
        if path is not None and not valid_path(path):
            c.add(
                None,
                f"{spelled} must be a dotted attribute path of the batch such as "
                f"{EXAMPLE[spelled]!r} (got {got(path)})",
                f'write {option}="{EXAMPLE[spelled]}", or leave it out',
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


# --- owners with member rows (Note [Member rows] in relay/debug/owners.py) ---------------


def check_members(c: Collector, fields: list[Field]) -> None:
    """``Schema(owners=Members(...))``: the batch's requests and the tail of member rows
    after them, each a path, on a batch whose last rows are no mixed batch's tails."""
    members = c.schema.owners
    if not isinstance(members, Members):
        return
    at = members.declared_at
    for option, path in (("requests", members.requests), ("tail", members.tail)):
        spelled = f"Members({option}=...)"
        if not valid_path(path):
            c.add(
                None,
                f"{spelled} must be a dotted attribute path of the batch such as "
                f"{EXAMPLE[spelled]!r} (got {got(path)})",
                f'write {option}="{EXAMPLE[spelled]}"',
                at,
            )
    for f in fields:
        if isinstance(f.resolve, Scatter):
            c.add(
                None,
                f"owners=Members(...) names member rows in debug mode only, but field "
                f"{f.name!r} resolves by a Scatter(...), whose refusals name each "
                "request with debug off too (the map would read the tail every step)",
                'name the owners by a path (owners="req_ids") on a map with a scatter',
                at,
            )
        if isinstance(f.tails, Tails):
            c.add(
                None,
                "owners=Members(...) puts member rows after the batch's requests, but "
                f"field {f.name!r} binds tails=Tails(...), whose decode rows are the "
                "batch's last requests: those would be member rows",
                'name the owners by a path (owners="reqs") on a map with decode '
                "tails; a batch with member rows binds none (sglang's beam rows ride "
                "plain decode batches)",
                at,
            )


def check_switches(c: Collector, fields: list[Field]) -> None:
    """``gate=Switch(keyword)``: a constructor keyword of its own (the rule that a gate
    sits on an optional gathered forward field is the gate's, in validate.py)."""
    if not any(isinstance(f.gate, Switch) for f in fields):
        return
    shaped = tuple(f for f in fields if isinstance(f.shape, tuple))
    dims = set(naming.symbolic_dims(shaped))
    # The map's attributes and methods besides the reserved names: the keyword
    # becomes an attribute too.
    taken = {naming.buffer(f) for f in fields} | {naming.host_mirror(f) for f in fields}
    taken |= {resolve_method(f) for f in fields if f.lane is Lane.SCHEDULE}
    for f in fields:
        if not isinstance(f.gate, Switch):
            continue
        keyword = f.gate.keyword
        problem = naming.identifier_problem(keyword)
        if problem is None and keyword in dims:
            problem = "is already a keyword of the constructor (a dim)"
        elif problem is None and keyword in taken:
            problem = "is already an attribute or method of the map"
        if problem is not None:
            c.add(
                f,
                "Switch(keyword=...) names the constructor keyword that turns the "
                f"field on or off; {keyword!r} {problem}",
                'name it after what the map relays, e.g. gate=Switch("need_topk")',
                f.gate.declared_at,
            )


def check_staged(c: Collector, fields: list[Field]) -> None:
    """``Schema(staged=Staged(method))``: a method of its own name that fills the parent
    of the slots path, which holds every per-batch gate it sets."""
    staged = c.schema.staged
    if staged is None:
        return
    if not isinstance(staged, Staged):
        c.add(
            None,
            f"staged must be a Staged(...) or None (got {got(staged)})",
            'write staged=Staged("make_staged_spec_input")',
        )
        return
    at = staged.declared_at
    taken = {
        *naming.METHODS,
        *(resolve_method(f) for f in fields if f.lane is Lane.SCHEDULE),
        *(naming.buffer(f) for f in fields),
        *(naming.host_mirror(f) for f in fields),
        *(f.gate.keyword for f in fields if isinstance(f.gate, Switch)),
    }
    problem = naming.identifier_problem(staged.method)
    if problem is None and staged.method in taken:
        problem = "is a method or attribute the generated map has already"
    if problem is not None:
        c.add(
            None,
            "Staged(method=...) names the method that fills a staged draft input; "
            f"{staged.method!r} {problem}",
            'name it after what it builds, e.g. Staged("make_staged_spec_input")',
            at,
        )
    slots = c.schema.indices
    parent = (
        slots.rsplit(".", 1)[0] if isinstance(slots, str) and "." in slots else None
    )
    if parent is None:
        c.add(
            None,
            "Staged(...) fills the object that holds the slots, but indices="
            f"{slots!r} is an attribute of the batch itself",
            'read the slots through the draft input, e.g. indices="spec_info.future_'
            'indices", or remove staged=...',
            at,
        )
        return
    for f in fields:
        gate = f.gate
        if isinstance(gate, str) and gate.rsplit(".", 1)[0] != parent:
            c.add(
                f,
                f"Staged(...) fills batch.{parent}, so each gate must be a flag of it "
                f"(got gate={gate!r})",
                f'keep the flag on the draft input, e.g. gate="{parent}.<flag>"',
            )
