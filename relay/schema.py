"""The schema vocabulary: one ``Field`` declaration per relay field, grouped in a ``Schema``.

Declarations are plain attrs objects that accept what they are given and remember
where they were written. Nothing is checked here: ``codegen`` validates a whole
schema at once so that a user sees every mistake in one run, each naming the file
and line below. ``Schema.load`` and ``Schema.derive`` build a schema from another
module's fields (Note [Schema composition]); only what they cannot build at all
(a missing file, a field name the base lacks) is refused on the spot.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import attrs
import torch

from relay.errors import CompositionError
from relay.schema_import import load_base

#: Where the bundled schema modules are installed (``relay/schemas/``).
_BUNDLED = Path(__file__).parent / "schemas"


def bundled_names() -> list[str]:
    """The names ``Schema.bundled`` takes: the schema modules relay ships."""
    return sorted(p.stem for p in _BUNDLED.glob("*.py") if not p.stem.startswith("_"))


__all__ = [
    "FROM_PAYLOAD",
    "Alloc",
    "BatchRows",
    "Dim",
    "Field",
    "FromPayload",
    "Guard",
    "HostCopy",
    "IfNone",
    "Lane",
    "Layout",
    "Members",
    "Resolve",
    "Scatter",
    "ScheduleSlots",
    "Schema",
    "SourceLocation",
    "Staged",
    "Switch",
    "Tails",
    "TailsKv",
    "TargetShape",
    "Unwritten",
    "bundled_names",
    "extra",
    "resolve_method",
]


class Lane(enum.Enum):
    """Who reads a field, and so how its hand-over is ordered."""

    #: Stashed at the end of forward N, read at the start of forward N+1 on the same
    #: stream. Stream order is the only ordering; there is no fence.
    FORWARD = "forward"
    #: Published from the forward stream and read by the scheduler behind a fence,
    #: optionally mirrored to the host.
    SCHEDULE = "schedule"


class Alloc(enum.Enum):
    """When a field's buffer is allocated."""

    #: At construction; symbolic dims become constructor keywords.
    EAGER = "eager"
    #: On the first non-empty stash or publish that carries the field, with the row
    #: shape (and, for ``FROM_PAYLOAD``, the dtype) of that payload.
    LAZY = "lazy"


class Resolve(enum.Enum):
    """How a field's value reaches the batch; a scatter is ``Scatter(...)``, which
    names what only a scatter has (its offsets, counts and place in a span)."""

    #: ``target = buf[batch.<indices>]``.
    GATHER = "gather"
    #: The sentinel protocol: ``invalidate`` writes ``-slot`` into the target and the
    #: resolve replaces every negative ``x`` there by ``buf[-x]``, leaving the rest.
    PLACEHOLDER = "placeholder"


class Guard(enum.Enum):
    """A value check of every stash or publish, in debug mode only: with
    ``torch._assert_async`` (no host sync), naming the field. A map built with debug off
    runs no guard (Note [Guards in debug mode] in ``relay/runtime.py``)."""

    NONE = "none"
    #: Every value >= 0 (integer or floating fields).
    NON_NEGATIVE = "non_negative"
    #: Every value > 0 (integer or floating fields).
    POSITIVE = "positive"
    #: No NaN and no infinity (floating fields).
    FINITE = "finite"


class Layout(enum.Enum):
    """How a schema lays out its buffers."""

    #: One buffer per field.
    SEPARATE = "separate"
    #: Forward-lane fields of one dtype that are eager, required and gathered share one
    #: buffer, so ``resolve_future`` gathers each dtype with one op (Note [Packed layout]
    #: in ``relay/codegen/layout.py``; ``docs/schema.md`` says when to pick it).
    PACKED = "packed"


class Unwritten(enum.Enum):
    """What a row holds before its first write."""

    #: Nothing a resolve may take: debug mode reports reading it (with debug off it
    #: reads zeros, but an engine must not rely on that).
    REFUSED = "refused"
    #: Zeros, on every device and in debug mode too, where reading them is legal (for
    #: sglang's n-gram accept lengths, an unstashed row reads length 0).
    ZEROS = "zeros"


class TargetShape(enum.Enum):
    """The shape a gather hands its target."""

    #: ``(n, *row)``: one row per slot.
    ROWS = "rows"
    #: ``(n * prod(row),)``: the row dims flattened into the batch dim (a view).
    FLAT = "flat"


class IfNone(enum.Enum):
    """What a resolve does when an optional parent of its targets is ``None``."""

    #: Leave the fields under it alone (prefill batches with ``spec_info=None``).
    SKIP = "skip"
    #: Refuse the resolve with relay's message, naming the parent.
    REFUSE = "refuse"


class FromPayload(enum.Enum):
    """Marker type of ``FROM_PAYLOAD``: the dtype is taken from the first payload."""

    FROM_PAYLOAD = "from_payload"

    def __repr__(self) -> str:
        return "FROM_PAYLOAD"


FROM_PAYLOAD = FromPayload.FROM_PAYLOAD

#: One entry of a row shape: a fixed size or a symbolic name such as ``"topk"``.
Dim = int | str


@attrs.frozen
class SourceLocation:
    """Where a declaration was written."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


_THIS_FILE = os.path.normcase(os.path.abspath(__file__))


def _declaration_site() -> SourceLocation:
    """The first frame outside this module and attrs' generated ``__init__``."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<attrs generated") and (
            os.path.normcase(os.path.abspath(filename)) != _THIS_FILE
        ):
            return SourceLocation(filename, frame.f_lineno)
        frame = frame.f_back
    return SourceLocation("<unknown>", 0)


def _to_shape(value: Sequence[Dim] | Dim) -> Any:
    # A bare string would otherwise become one dim per character. Anything else that is
    # not a tuple or list (None, a set) is kept as given, so validation reports it with
    # its field instead of this converter failing while the schema module is imported.
    if isinstance(value, (str, int)):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return value


# Note [Grouped declarations]
# An option that only means something together with others is one frozen value
# naming what it declares (``Scatter``, ``HostCopy``, ``Tails``, ``ScheduleSlots``),
# ``None`` on its owner when absent: a half-declared scatter or a KV table without
# its locations cannot be written, so no rule has to refuse it. Each value
# remembers the line that wrote it, so a problem inside one (a path already taken
# by another role, say) is reported there. docs/design.md says why this split.


@attrs.frozen
class BatchRows:
    """``Scatter(rows=BatchRows(...))``: where every row of the batch lies in a scatter's
    flat target, so that each request's span is checked to stay inside its own row,
    also where the next row is one the scatter does not write (a prefill row)."""

    #: Batch tensor of every row's start in the target, then the end of the last row:
    #: one more value than the batch has rows (vLLM's ``query_start_loc``).
    starts: str
    #: Batch tensor of each request's row, in the order of the map's slots (vLLM V1's
    #: current row of each request it hands over); ``None`` where request ``i`` is row
    #: ``i``, every row of the batch handed over in order (vLLM V2).
    index: str | None = None
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class Scatter:
    """``Field(resolve=Scatter(...))``: each request's row laid into a flat target at
    the request's start offset, ``target[offsets[i] + j] = buf[indices[i], j]`` (vLLM's
    input ids: each request's token, then its drafts)."""

    #: Batch tensor of each request's start offset in the target (``"query_starts"``).
    offsets: str
    #: Batch tensor of each request's count of values to lay in (0 to the row's width),
    #: e.g. ``"num_draft_tokens"``: only that many are written. The stash payload
    #: carries the producer's count under the path's last name; debug mode reports a
    #: request that reads more than its stash wrote.
    lengths: str | None = None
    #: Another scatter field into the same target from the same offsets; this field's
    #: values start right after that field's in each request's span (the drafts after
    #: the sampled token).
    after: str | None = None
    #: Whether the target's positions outside the handed-over spans are the map's to
    #: check: with a non-negative guard, debug mode reports a negative value left
    #: anywhere in the target after the scatter (a placeholder no request covered).
    #: ``False`` where the engine fills them and leaves placeholders there on purpose
    #: (vLLM V1 keeps the host's -1 drafts of requests it does not hand over, and
    #: clamps them later): only the handed-over values are checked.
    rest_checked: bool = True
    #: Batch tensor of one flag per request (bool, or 0/1 ints): where it is false the
    #: field's row is not laid in (and not read), its positions keep what the engine
    #: wrote, and the fields after it in the span start where they would anyway (vLLM
    #: V2 writes a request's sampled token only once its prefill is done, and its
    #: drafts after that position either way). For a field without ``lengths``.
    when: str | None = None
    #: Every batch row's bounds in the target (``BatchRows``), on the first field of a
    #: request's span: each request's span must lie inside its own row, refused before
    #: the target changes where it would run onto a neighbouring row.
    rows: BatchRows | None = None
    #: The target's dtype, where it is not the field's: each value is cast to it as it
    #: is laid in (vLLM samples int64 tokens and its ``input_ids`` are int32:
    #: ``cast=torch.int32``). An integer field into an integer target, or a floating
    #: one into a wider floating one; debug mode reports a stashed value the target's
    #: dtype cannot hold. Without it the target must have the field's dtype.
    cast: torch.dtype | None = None
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class HostCopy:
    """``Field(host=HostCopy(...))``: a schedule field's resolve also hands the scheduler
    a host copy of the value, or its sum, or both."""

    #: Batch attribute that receives a host copy (``"seq_lens_cpu"``).
    mirror: str | None = None
    #: Batch attribute that receives the host sum as an int (``"seq_lens_sum"``).
    sum: str | None = None
    #: The resolve takes ``stream_ordered=True`` to order its fence wait on the stream
    #: (a device-side wait) instead of blocking the host before the copy.
    stream_ordered: bool = False
    #: The resolve takes ``host=False`` from an engine that needs no host copy this
    #: time (sglang's ``needs_cpu_seq_lens=False``): the mirror and the sum are set to
    #: ``None``, no copy is made and the host waits for none; the device read stays.
    optional: bool = False
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class TailsKv:
    """``Tails(kv=TailsKv(...))``: the KV write locations a mixed batch's decode rows
    get, read from the request-to-token table."""

    #: Batch tensor of the KV write locations to rebuild (``"out_cache_loc"``).
    locations: str
    #: Batch tensor of the request-to-token table they are read from (``"req_to_token"``).
    table: str
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class Tails:
    """``Field(tails=Tails(...))``: ``resolve_tails`` late-binds a mixed batch's decode
    rows (its last rows) from a schedule field's published lengths."""

    #: Batch tensor of the decode rows' slots (``"mix_running_indices"``).
    rows: str
    #: The KV write locations to rebuild as well, ``table[slot, published + add - 1]``.
    kv: TailsKv | None = None
    #: What a decode row's length adds to its published one: 1 where the published
    #: length is the committed one and the row decodes a token now (sglang), 0 where the
    #: published length counts that token already.
    add: int = 1
    #: Batch attribute of a host list of ints whose last entries become each decode
    #: row's prefix length, ``published + add - 1`` (sglang's ``prefix_lens``); built
    #: from the field's host copy, so it needs ``host=HostCopy(mirror=...)``.
    prefix: str | None = None
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class Carried:
    """``extra(..., gate=Carried("topk_p"))``: the field is read only where the map
    carries another optional field, ``field`` (sglang hands its draft probabilities only
    beside the top-k candidates, and ``None`` where a run stashes them alone)."""

    #: The other optional forward field's name.
    field: str
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class Switch:
    """``extra(..., gate=Switch("need_topk"))``: the field is relayed only by a map
    built with that constructor keyword true (its default). Built with it false, the
    map allocates no buffer for the field, a payload's value for it is dropped
    unread, and every resolve hands ``None`` (sglang relays the top-k candidates only
    for algorithms that draft with them, and the hidden state only where the draft
    model reads it, whatever the payload carries). Fields may share a keyword."""

    #: The constructor keyword (a bool, default ``True``).
    keyword: str
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class Staged:
    """``Schema(staged=Staged(...))``: a method that fills a fresh draft input for
    requests whose rows the map already holds (sglang's requests leaving a staging
    area, ``make_staged_spec_input``): the parent of the schema's ``indices`` path
    gets the slots, and each per-batch gate under it says whether the map carries
    that field now. The next ``resolve_future`` reads the rows as for any batch."""

    #: The generated method's name.
    method: str
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class ScheduleSlots:
    """``Schema(schedule=ScheduleSlots(...))``: where the schedule lane's resolves read
    their slots and requests, when the scheduler's object names them its own way
    (Note [Slots per lane]). Declared, the module has a second Protocol, the schedule
    lane's batch, with only what the schedule resolves read and write."""

    #: Batch attribute of the slots (the schema's ``indices`` when ``None``).
    indices: str | None = None
    #: Batch attribute naming each row's request, for debug mode (the schema's
    #: ``owners`` when ``None``).
    owners: str | None = None
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )


@attrs.frozen
class Members:
    """``Schema(owners=Members(...))``: a batch whose rows past its requests are member
    rows of those requests, listed by a tail object (sglang's beam search appends each
    beam group's member slots to a decode batch after the rows of its ``reqs``, and
    lists them in ``batch.beam_tail``). Debug mode names a leading row's request from
    ``requests`` and a member row's by its leader there; with debug off neither is
    read. A member row belongs to its leader's request: a write of it names that
    request (``owners=``)."""

    #: Batch attribute naming the leading rows' requests, one per row (``"reqs"``).
    requests: str
    #: Batch attribute of the member rows' tail, ``None`` on a batch without one: an
    #: object whose ``entries`` each give a leading row (``leader_idx``) and its
    #: member rows ``[start, end)`` counted from the first row past the requests, in
    #: row order, as sglang's ``BeamTail`` does (``"beam_tail"``).
    tail: str
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )

    @property
    def paths(self) -> tuple[str, str]:
        """The batch attributes it names: the requests, then the tail."""
        return (self.requests, self.tail)


@attrs.frozen
class Field:
    """One relay field: a device buffer of ``pool_size`` rows and how it is handed over.

    Only ``name``, ``lane`` and ``dtype`` are required; see ``docs/schema.md`` for
    every option with an example.
    """

    #: Identifier of the field; the buffer is ``<name>_buf``.
    name: str
    #: ``Lane.FORWARD`` or ``Lane.SCHEDULE``.
    lane: Lane
    #: A ``torch.dtype``, or ``FROM_PAYLOAD`` (lazy fields only).
    dtype: torch.dtype | FromPayload
    #: Shape of one row: ints and symbolic dims. ``()`` is one scalar per slot.
    shape: tuple[Dim, ...] = attrs.field(default=(), converter=_to_shape)
    #: ``Alloc.EAGER`` or ``Alloc.LAZY``.
    alloc: Alloc = Alloc.EAGER
    #: The payload may omit the field (``None``); its buffer is allocated when it appears.
    optional: bool = False
    #: Attribute of the stash payload (or keyword of ``publish``) holding the value;
    #: defaults to ``name``.
    source: str | None = None
    #: Dotted attribute path on the batch the value resolves to, e.g. ``spec_info.topk_p``.
    target: str | None = None
    #: ``Resolve.GATHER``, ``Resolve.PLACEHOLDER`` or a ``Scatter(...)``.
    resolve: Resolve | Scatter = Resolve.GATHER
    #: Schedule lane: a ``HostCopy(...)`` of the value for the scheduler's host.
    host: HostCopy | None = None
    #: Value check on every stash or publish, in debug mode.
    guard: Guard = Guard.NONE
    #: What a row holds before its first write: ``Unwritten.ZEROS`` makes it zeros
    #: everywhere, a legal read in debug mode too.
    unwritten: Unwritten = Unwritten.REFUSED
    #: The shape a gather hands the target: ``TargetShape.FLAT`` flattens the rows.
    target_shape: TargetShape = TargetShape.ROWS
    #: Doc string carried into the generated code.
    doc: str = ""
    #: The engine allocates the buffer (the constructor's ``<name>_buf=``) and a captured
    #: graph writes its rows: a write may pass ``None`` (no scatter), ``graph_wrote``
    #: declares the graph's write.
    graph_written: bool = False
    #: Forward lane: ``stash_partial`` keeps this field's rows, and an optional kept
    #: field left out of ``stash`` keeps them too.
    kept: bool = False
    #: Schedule lane: a ``Tails(...)``, a mixed batch's decode rows whose lengths (and
    #: KV locations, prefix lengths) ``resolve_tails`` rebuilds from the published ones.
    tails: Tails | None = None
    #: Forward lane, an optional gathered field: a batch attribute (a bool) saying
    #: whether this batch's rows hold the field (sglang's per-draft-input
    #: ``future_dsa_topk_indices_available``). Where it is false the resolve hands
    #: ``None`` and reads nothing, so a request seeded into a reused slot never gets
    #: the slot's previous request's rows. A ``Carried(...)`` reads it only where the
    #: map carries that other field; a ``Switch(...)`` relays it only where the map
    #: was built with that keyword true.
    gate: str | Carried | Switch | None = None
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )

    @property
    def payload_name(self) -> str:
        """The payload attribute (or publish keyword) the value comes from."""
        return self.source if self.source is not None else self.name

    @property
    def scatter(self) -> Scatter | None:
        """The field's ``Scatter``, if it resolves by one."""
        return self.resolve if isinstance(self.resolve, Scatter) else None


def extra(
    name: str,
    *,
    shape: Sequence[Dim] | Dim = (),
    target: str | None = None,
    source: str | None = None,
    doc: str = "",
    gate: str | Carried | Switch | None = None,
) -> Field:
    """A forward field the producer may or may not make (sglang's draft extras): its
    buffer is allocated by the first payload that carries it, with that payload's dtype
    and row; a payload may leave it out, and a partial stash or a stash that leaves it
    out keeps its rows. One declaration of what would otherwise be four options
    (``dtype=FROM_PAYLOAD, alloc=Alloc.LAZY, optional=True, kept=True``)."""
    return Field(
        name,
        lane=Lane.FORWARD,
        dtype=FROM_PAYLOAD,
        shape=shape,
        alloc=Alloc.LAZY,
        optional=True,
        source=source,
        target=target,
        doc=doc,
        kept=True,
        gate=gate,
    )


def resolve_method(field: Field) -> str:
    """A schedule field's resolve: named after its host mirror, else its target's leaf
    (``resolve_seq_lens_cpu``)."""
    if field.lane is not Lane.SCHEDULE:
        raise ValueError(f"{field.name} is not a schedule field")
    mirror = field.host.mirror if isinstance(field.host, HostCopy) else None
    leaf = mirror or field.target or field.name
    return f"resolve_{leaf.rsplit('.', 1)[-1]}"


def _to_fields(value: Sequence[Field]) -> tuple[Field, ...]:
    return tuple(value)


def _to_pairs(value: Any) -> Any:
    # A mapping becomes sorted pairs (hashable, and spelled once however it was
    # ordered); anything else is kept for validation to report with the schema.
    if isinstance(value, dict):
        return tuple(sorted(value.items(), key=lambda kv: str(kv[0])))
    return value


@attrs.frozen
class Schema:
    """A relay: the generated class name, its doc string and its fields in order."""

    #: Name of the generated FutureMap class, e.g. ``"DecodeFutureMap"``.
    name: str
    #: Fields in declaration order; the generated code follows this order.
    fields: tuple[Field, ...] = attrs.field(converter=_to_fields)
    #: Doc string of the generated class.
    doc: str = ""
    #: Batch attribute holding the request-pool slots for gather resolves.
    indices: str = "req_pool_indices"
    #: ``Layout.SEPARATE`` (one buffer per field) or ``Layout.PACKED``.
    layout: Layout = Layout.SEPARATE
    #: Batch attributes that may be ``None`` (``{"spec_info": IfNone.SKIP}``), and what
    #: a resolve does then; the generated Protocol types them as optional.
    optional_parents: tuple[tuple[str, IfNone], ...] = attrs.field(
        default=(), converter=_to_pairs
    )
    #: Generate ``seed(indices, payload)``: forward-lane rows for requests that start
    #: without a forward of their own (prebuilt, disaggregated), written by the next
    #: ``resolve_future`` so they land after any forward still in flight.
    seeded: bool = False
    #: Batch attribute naming each row's request (ids), for debug mode: a value read by
    #: another request than the one whose forward stashed it is reported. A
    #: ``Members(...)`` where rows past the batch's requests are member rows of them.
    owners: str | Members | None = None
    #: Where the schedule lane's resolves read their slots and requests, when the
    #: scheduler's object names them its own way: a ``ScheduleSlots(...)``.
    schedule: ScheduleSlots | None = None
    #: A method filling a fresh draft input for staged requests: a ``Staged(...)``.
    staged: Staged | None = None
    declared_at: SourceLocation = attrs.field(
        factory=_declaration_site, kw_only=True, eq=False, repr=False
    )

    # Note [Schema composition]
    # A variant builds on another schema module's SCHEMA: ``Schema.load`` imports
    # that module by path (relay/schema_import.py: never through sys.path, never left
    # in sys.modules, a cycle refused at the load line), and ``derive`` keeps every
    # base Field object as it is, so each still carries the file and line that
    # declared it and validation points there. Generated modules need no record of
    # the base: the schema hash covers every field a schema ends up with, so an edit
    # of the base makes each variant's module stale (relay.codegen.files).

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Schema:
        """The ``SCHEMA`` of another schema module, to build on with ``derive``.

        ``path`` is relative to the folder of the module that calls ``load`` (an
        absolute path is taken as it is): ``Schema.load("eagle.py")`` beside
        ``relay/schemas/eagle_dsa.py`` loads ``relay/schemas/eagle.py``. Raises
        ``CompositionError`` (no such file, a cycle) or ``SchemaError`` (the base
        module itself is broken).
        """
        site = _declaration_site()
        return load_base(Path(path), site.file, site.line, Schema)

    @classmethod
    def bundled(cls, name: str) -> Schema:
        """The ``SCHEMA`` of a relay shipped with relay, to build on with ``derive``:
        ``Schema.bundled("eagle")`` (one of ``bundled_names()``). Raises
        ``CompositionError`` for a name relay does not ship."""
        site = _declaration_site()
        path = _BUNDLED / f"{name}.py"
        if not isinstance(name, str) or not name.isidentifier() or not path.is_file():
            names = ", ".join(bundled_names())
            raise CompositionError(
                site.file,
                site.line,
                f"Schema.bundled({name!r}): relay ships no such schema (it ships {names})",
                "name one of them, or load your own with Schema.load(path)",
            )
        return load_base(path, site.file, site.line, Schema)

    # Note [Slots per lane]
    # A schedule resolve is called by the scheduler, whose object may not be the
    # forward's batch: ``schedule=ScheduleSlots(indices=..., owners=...)`` names where
    # that lane's resolves read their slots and (in debug mode) their requests, each
    # falling back to the schema's ``indices`` and ``owners``. Declaring it splits the
    # batch Protocol in two, so a scheduler-side object with only the schedule lane's
    # attributes type-checks. ``resolve_tails`` reads its own slots (``Tails.rows``)
    # and stays with the forward batch it late-binds.

    @property
    def lanes_apart(self) -> bool:
        """Whether the schedule lane names its own slots or owners (Note [Slots per lane])."""
        return self.schedule is not None

    def slots_of(self, lane: Lane) -> str:
        """The batch attribute ``lane``'s resolves read their slots from."""
        own = self.schedule.indices if lane is Lane.SCHEDULE and self.schedule else None
        return own if own is not None else self.indices

    def owners_of(self, lane: Lane) -> str | Members | None:
        """Where ``lane``'s resolves read their requests from, if anywhere."""
        own = self.schedule.owners if lane is Lane.SCHEDULE and self.schedule else None
        return own if own is not None else self.owners

    def field(self, name: str) -> Field:
        """The field called ``name``; ``CompositionError`` (at the caller's line) if none is."""
        for f in self.fields:
            if _named(f) and f.name == name:
                return f
        site = _declaration_site()
        raise CompositionError(
            site.file, site.line, *_no_such_field(self, name, "field(...)")
        )

    def derive(
        self,
        *,
        name: str,
        doc: str,
        add: Sequence[Field] = (),
        before: str | None = None,
        drop: Sequence[str] = (),
        replace: Sequence[Field] = (),
        indices: str | None = None,
        layout: Layout | None = None,
        optional_parents: dict[str, IfNone] | None = None,
        seeded: bool | None = None,
        owners: str | Members | None = None,
        schedule: ScheduleSlots | None = None,
        staged: Staged | None = None,
    ) -> Schema:
        """A new schema made of this one's fields and the differences given.

        ``drop`` removes fields by name; ``replace`` puts each given field where the
        base field of the same name was; ``add`` inserts new fields before the field
        named ``before`` (at the end without it). The schema options left out
        (``indices``, ``owners``, ...) are this schema's. Base fields are the same
        objects, so a problem in one is reported at the base module's line; the new
        schema is declared where ``derive`` is called. Raises ``CompositionError`` when
        a name given is not a field of the schema.
        """
        site = _declaration_site()
        fields = _arranged(self, site, add, before, drop, replace)
        given: dict[str, Any] = {
            "indices": indices,
            "layout": layout,
            "optional_parents": optional_parents,
            "seeded": seeded,
            "owners": owners,
            "schedule": schedule,
            "staged": staged,
        }
        return attrs.evolve(  # the options not given stay the base's
            self,
            name=name,
            fields=fields,
            doc=doc,
            declared_at=site,
            **{k: v for k, v in given.items() if v is not None},
        )


def _arranged(
    base: Schema,
    site: SourceLocation,
    add: Sequence[Field],
    before: str | None,
    drop: Sequence[str],
    replace: Sequence[Field],
) -> list[Field]:
    """``base``'s fields less ``drop``, with ``replace`` in place and ``add`` inserted
    before ``before`` (at the end without it); refused at ``site`` where a name given
    is not a field of ``base``."""

    def refuse(problem: str, fix: str) -> CompositionError:
        return CompositionError(site.file, site.line, problem, fix)

    if isinstance(drop, str) or isinstance(add, Field) or isinstance(replace, Field):
        raise refuse(
            "derive(add=, drop=, replace=) each take a list",
            'write drop=["hidden_states"] or add=[Field(...)]',
        )
    known = [f.name for f in base.fields if _named(f)]
    for option, wanted in (
        ("drop", list(drop)),
        ("replace", [f.name for f in replace if _named(f)]),
        ("before", [] if before is None else [before]),
    ):
        for missing in (n for n in wanted if n not in known):
            raise refuse(*_no_such_field(base, missing, f"derive({option}=...)"))
    swaps = {f.name: f for f in replace if _named(f)}
    for both in (n for n in drop if n in swaps):
        raise refuse(
            f"derive() both drops and replaces {both!r}",
            "keep it in one of drop=... or replace=...",
        )
    if before is not None and before in drop:
        raise refuse(
            f"derive(before={before!r}) names a field that drop=... removes",
            "insert before another field, or keep it",
        )
    kept = [
        swaps.get(f.name, f) if _named(f) else f
        for f in base.fields
        if not (_named(f) and f.name in drop)
    ]
    at = len(kept)
    if before is not None:
        at = next(i for i, f in enumerate(kept) if _named(f) and f.name == before)
    return [*kept[:at], *add, *kept[at:]]


def _named(f: object) -> bool:
    """A ``Field`` whose name can be looked up (validation reports any other)."""
    return isinstance(f, Field) and isinstance(f.name, str)


def _no_such_field(schema: Schema, name: object, call: str) -> tuple[str, str]:
    names = ", ".join(repr(f.name) for f in schema.fields if _named(f))
    return (
        f"{call} names {name!r}, but {schema.name} has no such field (it has {names})",
        "name one of its fields",
    )
