"""Property: every valid schema gives a module that compiles, imports, runs, and that
ruff (format and check, at its defaults) and ``mypy --strict`` leave alone.

Hypothesis draws schemas across every lane, alloc, resolve, guard, optional and layout
combination, with nested targets and names from one character to far past a line's
width. The draw is derandomized, so CI runs the same examples every time.
"""

from __future__ import annotations

import inspect
import itertools
import subprocess
import tempfile
import types
from pathlib import Path

import pytest
import torch
from codegen_support import mypy_strict
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from relay.codegen import formatting, literals, naming
from relay.codegen.render import render
from relay.codegen.validate import validate
from relay.schema import (
    FROM_PAYLOAD,
    Alloc,
    Field,
    Guard,
    HostCopy,
    IfNone,
    Lane,
    Layout,
    Resolve,
    Scatter,
    ScheduleSlots,
    Schema,
    Tails,
    TailsKv,
    TargetShape,
    Unwritten,
)

SOURCE = "schemas/prop.py"
_TAIL = "abcdefghijklmnopqrstuvwxyz0123456789_"

#: Name tails: empty, a word, and long ones (a 120-character field name gives lines far
#: past 88 columns at every indentation).
tails = st.one_of(
    st.just(""),
    st.text(_TAIL, max_size=12),
    st.sampled_from([40, 70, 120]).flatmap(
        lambda n: st.text(_TAIL, min_size=n, max_size=n)
    ),
)
#: Doc strings with what must be escaped to round-trip: backslashes, quotes, tabs.
docs = st.text(st.sampled_from(list("ab \\\"'\n\t{}")), max_size=24)
owners = st.lists(st.sampled_from(["spec_info", "draft", "extra"]), max_size=2)


@st.composite
def paths(draw: st.DrawFn, leaf: str) -> str:
    """``leaf`` on the batch, or nested below up to two owner objects."""
    return ".".join([*draw(owners), leaf])


@st.composite
def fields(draw: st.DrawFn, i: int) -> Field:
    """Field ``i``: a random valid combination (validation filters the rest)."""
    tail = draw(tails)
    name = f"f{i}_{tail}"
    lane = draw(st.sampled_from(Lane))
    resolve = draw(st.sampled_from(Resolve))
    alloc = draw(st.sampled_from(Alloc))
    if resolve is Resolve.PLACEHOLDER:
        dtype: torch.dtype | object = draw(st.sampled_from([torch.int64, torch.int32]))
        optional, shape = False, ()
    else:
        lazy = [FROM_PAYLOAD] if alloc is Alloc.LAZY else []
        dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.float32, *lazy]))
        optional = draw(st.booleans())
        shape = draw(st.sampled_from([(), (3,), ("topk",), ("hidden", 2)]))
    needs_target = lane is Lane.SCHEDULE or resolve is Resolve.PLACEHOLDER
    target = (
        draw(paths(f"t{i}_{tail}")) if needs_target or draw(st.booleans()) else None
    )
    host_mirror = host_sum = None
    late: dict[str, object] = {}
    if lane is Lane.SCHEDULE:
        if draw(st.booleans()):
            host_mirror = draw(paths(f"m{i}_{tail}"))
        if shape == () and dtype in (torch.int64, torch.int32) and draw(st.booleans()):
            host_sum = f"h{i}_{tail}"
        ordered = draw(st.booleans())
        lengths = shape == () and dtype in (torch.int64, torch.int32) and not optional
        if lengths and resolve is Resolve.GATHER and draw(st.booleans()):
            kv = None
            if draw(st.booleans()):
                kv = TailsKv(locations=f"kv{i}_{tail}", table=f"kt{i}_{tail}")
            prefix = f"p{i}_{tail}" if draw(st.booleans()) else None
            late["tails"] = Tails(  # late-bound tails
                rows=f"x{i}_{tail}",
                kv=kv,
                add=draw(st.sampled_from([0, 1, 2])),
                prefix=prefix,
            )
            if (host_sum is not None or prefix is not None) and host_mirror is None:
                host_mirror = f"hm{i}_{tail}"
        if host_mirror or host_sum or ordered:
            late["host"] = HostCopy(
                mirror=host_mirror, sum=host_sum, stream_ordered=ordered
            )
    else:
        late["kept"] = draw(st.booleans())
    return Field(
        name,
        lane=lane,
        dtype=dtype,  # type: ignore[arg-type]
        shape=shape,
        alloc=alloc,
        optional=optional,
        source=f"s{i}_{tail}" if draw(st.booleans()) else None,
        target=target,
        resolve=resolve,
        guard=draw(st.sampled_from(Guard)),
        unwritten=draw(st.sampled_from(Unwritten)),
        target_shape=TargetShape.FLAT
        if shape and target is not None and draw(st.booleans())
        else TargetShape.ROWS,
        doc=draw(docs),
        # Eager, required fields of a fixed dtype only: validation refuses the rest.
        graph_written=alloc is Alloc.EAGER
        and not optional
        and isinstance(dtype, torch.dtype)
        and draw(st.booleans()),
        **late,  # type: ignore[arg-type]
    )


def _span(tail: str, target: str, guard: Guard) -> list[Field]:
    """A token and its counted drafts laid one after the other into one flat target
    (``lengths`` and ``after``)."""
    starts, count = f"starts_{tail}", f"n_{tail}"
    return [
        Field(
            f"tok_{tail}",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target=target,
            resolve=Scatter(offsets=starts),
            guard=guard,
        ),
        Field(
            f"drafts_{tail}",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("drafts",),
            target=target,
            resolve=Scatter(offsets=starts, lengths=count, after=f"tok_{tail}"),
        ),
    ]


def _packable(i: int, dtype: torch.dtype) -> Field:
    return Field(
        f"p{i}", lane=Lane.FORWARD, dtype=dtype, shape=("topk",), target=f"pk.p{i}"
    )


@st.composite
def schemas(draw: st.DrawFn) -> Schema:
    """A valid schema of one to five fields (two more that pack, for Layout.PACKED)."""
    count = draw(st.integers(1, 5))
    declared = [draw(fields(i)) for i in range(count)]
    layout = draw(st.sampled_from(Layout))
    if layout is Layout.PACKED:
        declared += [_packable(0, torch.float32), _packable(1, torch.float32)]
    if draw(st.booleans()):
        tail = draw(tails)
        declared += _span(
            tail, draw(paths(f"ids_{tail}")), draw(st.sampled_from(Guard))
        )
    # The schedule lane's own slots and owners (Note [Slots per lane]), where it has
    # fields and no placeholder (validation refuses those with it): slots that share
    # prefixes with targets or go through optional parents, owners of its own or not.
    apart = any(f.lane is Lane.SCHEDULE for f in declared) and not any(
        f.lane is Lane.SCHEDULE and f.resolve is Resolve.PLACEHOLDER for f in declared
    )
    schedule_indices = schedule_owners = None
    if apart and draw(st.booleans()):
        schedule_indices = draw(
            st.one_of(st.sampled_from([None, "req_pool_indices"]), paths("sched_slots"))
        )
        schedule_owners = draw(st.sampled_from([None, "rids", "sched_rids"]))
    schema = Schema(
        name=f"M{draw(tails)}FutureMap",
        fields=declared,
        doc=draw(docs),
        # Slots paths that share prefixes with targets, nest below them, or coincide
        # with their parents: every name still bound before use.
        indices=draw(st.one_of(st.sampled_from(["req_pool_indices"]), paths("slots"))),
        layout=layout,
        optional_parents={
            p: draw(st.sampled_from(IfNone))
            for p in draw(owners)
            if draw(st.booleans())
        },
        seeded=draw(st.booleans()),
        owners=draw(st.sampled_from([None, "rids", "spec_info.rids"])),
        schedule=ScheduleSlots(indices=schedule_indices, owners=schedule_owners)
        if schedule_indices or schedule_owners
        else None,
    )
    assume(validate(schema, str) == [])
    return schema


#: Where ruff runs: a folder with no ``relay`` package, so relay's imports read as a
#: user's project sees them (third-party), whatever folder pytest runs in.
NEUTRAL = Path(tempfile.gettempdir())


def every_combination(layout: Layout) -> Schema:
    """One schema holding a field of every valid lane, alloc, resolve, guard and optional
    combination (nested targets, 60-character names), in ``layout``."""
    declared = []
    for lane, alloc, kind, guard, optional in itertools.product(
        Lane, Alloc, [*Resolve, "scatter"], Guard, [False, True]
    ):
        if kind is Resolve.PLACEHOLDER and (optional or guard is Guard.FINITE):
            continue  # placeholders: required integer fields (validation refuses it)
        if kind == "scatter" and (optional or lane is Lane.SCHEDULE):
            continue  # scatters: required forward-lane fields
        i = len(declared)
        spelled = kind.value if isinstance(kind, Resolve) else kind
        stem = f"c{i}_{lane.value}_{alloc.value}_{spelled}_{guard.value}"
        stem = (stem + "_" * 60)[:60]
        placeholder = kind is Resolve.PLACEHOLDER
        resolve = kind if isinstance(kind, Resolve) else Scatter(offsets=f"{stem}_at")
        declared.append(
            Field(
                stem,
                lane=lane,
                dtype=torch.int64
                if placeholder or (i % 2 and guard is not Guard.FINITE)
                else torch.float32,
                shape=() if placeholder else ("topk",),
                alloc=alloc,
                optional=optional,
                target=f"spec_info.draft.{stem}" if i % 3 else stem,
                resolve=resolve,
                host=HostCopy(
                    mirror=f"{stem}_cpu", sum=f"{stem}_sum" if placeholder else None
                )
                if lane is Lane.SCHEDULE
                else None,
                guard=guard,
                doc=f'{stem} \\ "quoted"',
            )
        )
    if layout is Layout.PACKED:
        declared += [_packable(0, torch.float32), _packable(1, torch.float32)]
    declared += _span("every", "spec_info.ids", Guard.NON_NEGATIVE)
    schema = Schema(f"Every{layout.value.title()}FutureMap", declared, layout=layout)
    assert validate(schema, str) == []
    return schema


@pytest.mark.parametrize("layout", list(Layout))
def test_every_combination_gives_a_clean_module(layout: Layout) -> None:
    """A schema with every combination at once: its module compiles, imports and builds
    its map, and ruff format and check at their defaults leave it alone."""
    _clean(every_combination(layout))


def _ruff(*args: str, text: str) -> subprocess.CompletedProcess[str]:
    """The pinned ruff at its defaults over ``text`` given on stdin."""
    return subprocess.run(
        [
            str(formatting.ruff_binary()),
            *args,
            "--isolated",
            "--stdin-filename",
            "m.py",
        ],
        cwd=NEUTRAL,
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )


def _import(schema: Schema, content: str) -> types.ModuleType:
    module = types.ModuleType("relay_prop_map")
    exec(compile(content, "prop.py", "exec"), module.__dict__)
    cls_doc = inspect.getdoc(getattr(module, schema.name))
    assert cls_doc is not None
    # As inspect.getdoc shows it, less trailing blanks (formatters strip them).
    assert cls_doc.startswith(literals.clean_doc(schema.doc) or schema.name)
    dims = {dim: 2 for dim in naming.symbolic_dims(schema.fields)}
    relay_map = getattr(module, schema.name)("cpu", 4, **dims)
    assert relay_map.pool_size == 4
    return module


@settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(schemas())
def test_every_valid_schema_gives_a_clean_module(schema: Schema) -> None:
    """The module compiles, imports and builds its map; ruff format changes nothing and
    ruff check finds nothing, at ruff's defaults."""
    _clean(schema)


def _clean(schema: Schema) -> None:
    content = render(schema, source=SOURCE, command="relay generate")
    _import(schema, content)
    fmt = _ruff("format", "--check", "-", text=content)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    lint = _ruff("check", "-", text=content)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_sample_passes_mypy_strict(tmp_path: Path) -> None:
    """Four drawn schemas' modules and the every-combination ones type-check under
    `mypy --strict` (one run, with the repository's cache)."""
    written: list[Path] = []
    for layout in Layout:
        path = tmp_path / f"every_{layout.value}.py"
        content = render(
            every_combination(layout), source=SOURCE, command="relay generate"
        )
        path.write_text(content)

    @settings(max_examples=4, derandomize=True, database=None, deadline=None)
    @given(schemas())
    def write(schema: Schema) -> None:
        path = tmp_path / f"prop_{len(written)}.py"
        path.write_text(render(schema, source=SOURCE, command="relay generate"))
        written.append(path)

    write()
    assert len(written) == 4
    written += sorted(tmp_path.glob("every_*.py"))
    done = mypy_strict(written)
    assert (done.returncode, done.stdout) == (0, ""), done.stdout + done.stderr


@pytest.mark.parametrize("doc", ["\n \n\\", "\n \\\n\\", "\t\n  \n   a\n  b"])
def test_a_doc_with_blank_lines_first_reads_back_as_cleaned(doc: str) -> None:
    """A schema doc whose first lines are blanks (the draws that found it) reads back
    from the generated class as ``clean_doc`` says, whatever its indents."""
    schema = Schema(
        name="DocFutureMap",
        doc=doc,
        fields=[Field("f", lane=Lane.FORWARD, dtype=torch.int64, target="t")],
    )
    module = _import(schema, render(schema, source=SOURCE, command="relay generate"))
    shown = inspect.getdoc(module.DocFutureMap)
    assert shown is not None and shown.startswith(literals.clean_doc(doc))
