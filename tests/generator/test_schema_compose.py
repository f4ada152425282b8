"""Schemas compose: Schema.load imports a sibling schema module by path and Schema.derive
builds a variant from its fields; errors stay located at the line that declared each field."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from codegen_support import REPO, Project, Run, line_of

from relay.codegen import configured_job, explicit_job, plan
from relay.codegen.files import schema_hash
from relay.codegen.loader import load, load_schema
from relay.errors import CompositionError, SchemaError, SchemaImportError
from relay.schema import Field, Lane, Layout, Schema

BASE = """\
import torch

from relay.schema import Field, Guard, Lane, Schema

SCHEMA = Schema(
    name="BaseFutureMap",
    doc="The base relay.",
    fields=[
        Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),
        Field("probs", lane=Lane.FORWARD, dtype=torch.float32, shape=("topk",), target="spec.probs"),
        Field("lens", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens", guard=Guard.POSITIVE),
    ],
)
"""

VARIANT = """\
import torch

from relay.schema import Field, Lane, Schema

BASE = Schema.load("base.py")

SCHEMA = BASE.derive(
    name="VariantFutureMap",
    doc="The base relay, and the draft's scores.",
    before="lens",
    add=[
        Field("scores", lane=Lane.FORWARD, dtype=torch.float32, target="spec.scores"),
    ],
)
"""


def _write(project: Project, base: str = BASE, variant: str = VARIANT) -> None:
    project.write_schema("base", base)
    project.write_schema("variant", variant)


def _issues(project: Project, *stems: str) -> list[str]:
    job = explicit_job([project.schemas / f"{s}.py" for s in stems], project.maps)
    with pytest.raises(SchemaError) as excinfo:
        plan(job)
    return [str(issue) for issue in excinfo.value.issues]


# --- the bundled schemas ----------------------------------------------------------------------

VARIANTS = {
    "eagle_confidence": "add",
    "eagle_draft_probs": "add",
    "eagle_dsa": "add",
    "eagle_multilayer": "drop",
    "eagle_packed": "layout",
}


def test_bundled_variants_generate_the_committed_maps_byte_for_byte() -> None:
    """The EAGLE variants, built on schemas/eagle.py, render exactly the maps in relay/maps/."""
    planned = plan(configured_job(REPO))
    by_name = {item.path.name: item for item in planned}
    for stem in ("eagle", *VARIANTS):
        committed = (REPO / "relay" / "maps" / f"{stem}.py").read_text(encoding="utf-8")
        assert by_name[f"{stem}.py"].content == committed, stem
        if stem != "eagle":
            assert by_name[f"{stem}.py"].bases == ("relay/schemas/eagle.py",)


@pytest.mark.parametrize("stem", sorted(VARIANTS))
def test_bundled_variants_state_only_their_difference(stem: str) -> None:
    """Each variant declares no field the base declares: the shared fields are eagle.py's
    own objects, located at eagle.py's lines."""
    eagle = load_schema(
        REPO / "relay" / "schemas" / "eagle.py", "relay/schemas/eagle.py"
    )
    variant = load_schema(
        REPO / "relay" / "schemas" / f"{stem}.py", f"relay/schemas/{stem}.py"
    )
    text = (REPO / "relay" / "schemas" / f"{stem}.py").read_text()
    for field in variant.fields:
        declared = Path(field.declared_at.file).name
        if field.name in {f.name for f in eagle.fields}:
            assert declared == "eagle.py"
            assert not re.search(rf'Field\(\s*"{field.name}"', text)
        else:
            assert declared == f"{stem}.py"
    assert Path(variant.declared_at.file).name == f"{stem}.py"


def test_schema_module_runs_on_its_own_from_any_folder(tmp_path: Path) -> None:
    """`python schemas/eagle_dsa.py` finds its base beside it whatever the working folder."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = (
        "import runpy, sys; g = runpy.run_path(sys.argv[1]); "
        "print([f.name for f in g['SCHEMA'].fields]); "
        "print(sorted(m for m in sys.modules if m.startswith('_relay_schema_')))"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(REPO / "relay" / "schemas" / "eagle_dsa.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        (
            "['output_tokens', 'topk_p', 'topk_index', 'hidden_states', "
            "'dsa_topk_indices', 'new_seq_lens']"
        ),
        "[]",
    ]


# --- derive -----------------------------------------------------------------------------------


def test_derive_orders_and_inherits(project: Project) -> None:
    """add goes before `before` (else last), drop and replace act in place, and indices
    and layout are the base's unless given."""
    _write(project)
    base = load_schema(project.schemas / "base.py", "schemas/base.py")
    scores = Field("scores", lane=Lane.FORWARD, dtype=torch.float32, target="spec.s")
    probs = Field("probs", lane=Lane.FORWARD, dtype=torch.float16, target="spec.probs")
    one = base.derive(name="OneFutureMap", doc="one", add=[scores], before="probs")
    assert [f.name for f in one.fields] == ["tokens", "scores", "probs", "lens"]
    assert one.fields[0] is base.fields[0]
    two = base.derive(
        name="TwoFutureMap",
        doc="two",
        add=[scores],
        drop=["tokens"],
        replace=[probs],
        indices="slots_",
        layout=Layout.PACKED,
    )
    assert [f.name for f in two.fields] == ["probs", "lens", "scores"]
    assert two.fields[0] is probs
    assert (two.indices, two.layout) == ("slots_", Layout.PACKED)
    assert (one.indices, one.layout) == (base.indices, base.layout)
    assert one.declared_at.file == __file__
    assert base.field("lens") is base.fields[2]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            'drop=["hiden"]',
            "derive(drop=...) names 'hiden', but BaseFutureMap has no such field",
        ),
        (
            'before="len"',
            "derive(before=...) names 'len', but BaseFutureMap has no such field",
        ),
        ('drop="tokens"', "derive(add=, drop=, replace=) each take a list"),
        (
            'drop=["lens"], before="lens"',
            "derive(before='lens') names a field that drop=... removes",
        ),
    ],
)
def test_derive_with_a_name_the_base_lacks_is_located(
    project: Project, relay_cli: Callable[..., Run], call: str, message: str
) -> None:
    """A derive argument naming no base field: exit 3 at the derive line, with the base's
    field names and the fix; nothing is written."""
    _write(
        project,
        variant=f'from relay.schema import Schema\n\nSCHEMA = Schema.load("base.py").derive(\n    name="VFutureMap", doc="v", {call}\n)\n',
    )
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 3
    first, fix = run.err.splitlines()[:2]
    assert first.startswith(f"schemas/variant.py:3: error: {message}"), first
    if "no such field" in message:
        assert first.endswith("(it has 'tokens', 'probs', 'lens')")
        assert fix == "    fix: name one of its fields"
    assert not project.maps.exists()


def test_field_lookup_of_a_missing_name_is_located(project: Project) -> None:
    """Schema.field("x") of a name the schema lacks points at the line that asked."""
    _write(
        project,
        variant='from relay.schema import Schema\n\nBASE = Schema.load("base.py")\nX = BASE.field("tokenz")\n',
    )
    assert _issues(project, "variant") == [
        (
            "schemas/variant.py:4: error: field(...) names 'tokenz', but BaseFutureMap has "
            "no such field (it has 'tokens', 'probs', 'lens')\n    fix: name one of its fields"
        )
    ]


# --- errors stay where they were declared -----------------------------------------------------


def test_error_in_a_base_field_reports_the_base_line(project: Project) -> None:
    """A bad field the variant takes from its base is reported at the base module's line,
    under the variant's name; generating both reports it once."""
    _write(project, base=BASE.replace('shape=("topk",)', "shape=(0,)"))
    line = line_of(project.schemas / "base.py", 'Field("probs"')
    expected = (
        f"schemas/base.py:{line}: error: VariantFutureMap.probs: shape dims must be "
        "positive (got 0)"
    )
    (only,) = _issues(project, "variant")
    assert only.startswith(expected + "\n    fix: ")
    both = _issues(project, "base", "variant")
    assert [i.split("\n")[0] for i in both] == [expected.replace("Variant", "Base")]


def test_added_field_that_repeats_a_base_field_points_at_both(project: Project) -> None:
    """A variant adding a field the base already has: located at the variant's line,
    naming the base's line."""
    _write(
        project,
        variant=VARIANT.replace('Field("scores"', 'Field("probs"').replace(
            '"spec.scores"', '"spec.p2"'
        ),
    )
    added = line_of(project.schemas / "variant.py", 'Field("probs"')
    declared = line_of(project.schemas / "base.py", 'Field("probs"')
    (issue,) = _issues(project, "variant")
    assert issue.startswith(
        f"schemas/variant.py:{added}: error: VariantFutureMap.probs: duplicate field name "
        f"'probs'; it is first declared at schemas/base.py:{declared}"
    )


def test_missing_base_module_is_located_at_the_load_line(project: Project) -> None:
    """Schema.load of a file that is not there: the load line, the path it looked for, the fix."""
    _write(project, variant=VARIANT.replace('"base.py"', '"bsae.py"'))
    assert _issues(project, "variant") == [
        (
            "schemas/variant.py:5: error: Schema.load('bsae.py'): no such schema module "
            "schemas/bsae.py\n    fix: the path is relative to the folder of the module "
            "that calls Schema.load; check its spelling"
        )
    ]


def test_base_that_fails_to_import_is_reported_at_its_own_line(
    project: Project,
) -> None:
    """A broken base: its own failing line, then the variant's load line saying it builds on it."""
    _write(project, base=BASE.replace("Lane.SCHEDULE", "Lane.SCHEDUEL"))
    line = line_of(project.schemas / "base.py", "Lane.SCHEDUEL")
    issues = _issues(project, "variant")
    assert len(issues) == 2
    assert issues[0].startswith(
        f"schemas/base.py:{line}: error: the schema module failed to import: "
        "AttributeError: SCHEDUEL"
    )
    assert issues[1] == (
        "schemas/variant.py:5: error: builds on schemas/base.py, which cannot be loaded\n"
        "    fix: mend schemas/base.py (its problems are listed with it)"
    )


def test_cycle_is_refused_at_the_load_line(project: Project) -> None:
    """Two modules that load each other: a located error naming the cycle, not a recursion."""
    project.write_schema(
        "a", 'from relay.schema import Schema\n\nSCHEMA = Schema.load("b.py")\n'
    )
    project.write_schema(
        "b", 'from relay.schema import Schema\n\nSCHEMA = Schema.load("a.py")\n'
    )
    issues = _issues(project, "a")
    assert issues[0] == (
        "schemas/b.py:3: error: Schema.load('a.py') makes a cycle: schemas/a.py -> "
        "schemas/b.py -> schemas/a.py\n    fix: let both modules build on a third one "
        "that holds the fields they share"
    )
    assert issues[1].startswith(
        "schemas/a.py:3: error: builds on schemas/b.py, which cannot be loaded"
    )


def test_base_in_another_folder(project: Project) -> None:
    """A relative path is taken from the loading module's folder, `..` included."""
    (project.root / "shared").mkdir()
    (project.root / "shared" / "base.py").write_text(BASE)
    project.write_schema("variant", VARIANT.replace('"base.py"', '"../shared/base.py"'))
    loaded = load(project.schemas / "variant.py", "schemas/variant.py")
    assert [f.name for f in loaded.schema.fields] == [
        "tokens",
        "probs",
        "scores",
        "lens",
    ]
    assert loaded.bases == ((project.root / "shared" / "base.py").resolve(),)


def test_load_outside_a_file_is_located() -> None:
    """Schema.load with a relative path from code that has no file says so."""
    with pytest.raises(CompositionError, match="which has none"):
        exec(compile('Schema.load("base.py")', "<string>", "exec"), {"Schema": Schema})


# --- drift and module hygiene -----------------------------------------------------------------


def test_editing_a_base_field_makes_the_variant_stale(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """The variant's schema hash covers the fields it takes: a base edit makes its map stale,
    and --check's fix names the base."""
    _write(project)
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    hash_before = schema_hash(load_schema(project.schemas / "variant.py", "v"))
    base = project.schemas / "base.py"
    base.write_text(base.read_text().replace("Guard.POSITIVE", "Guard.NON_NEGATIVE"))
    assert schema_hash(load_schema(project.schemas / "variant.py", "v")) != hash_before
    run = relay_cli("generate", "--check", cwd=project.root)
    assert run.code == 1
    assert (
        "  maps/variant.py: stale (its schema changed)\n    fix: schemas/variant.py (or "
        "schemas/base.py, which it builds on) changed since maps/variant.py was generated"
    ) in run.err
    # A doc edit of the base's schema (not a field the variant takes) leaves it current.
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    base.write_text(
        base.read_text().replace("The base relay.", "The base relay, edited.")
    )
    run = relay_cli("generate", "--check", cwd=project.root)
    assert "maps/base.py: stale" in run.err and "maps/variant.py" not in run.err


def test_loading_leaves_no_module_behind_and_sees_each_edit(project: Project) -> None:
    """Loading a variant (and its base) registers nothing in sys.modules, and a second load
    in the same process reads the base afresh."""
    _write(project)
    first = load_schema(project.schemas / "variant.py", "v")
    assert [m for m in sys.modules if m.startswith("_relay_schema_")] == []
    base = project.schemas / "base.py"
    base.write_text(base.read_text().replace('target="input_ids"', 'target="ids"'))
    second = load_schema(project.schemas / "variant.py", "v")
    assert (first.fields[0].target, second.fields[0].target) == ("input_ids", "ids")
    with pytest.raises(SchemaImportError):
        load_schema(project.schemas / "missing.py", "m")
    assert [m for m in sys.modules if m.startswith("_relay_schema_")] == []


def test_composed_map_runs(project: Project, relay_cli: Callable[..., Run]) -> None:
    """The variant's generated module imports and relays its added field."""
    _write(project)
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    namespace: dict[str, object] = {}
    source = (project.maps / "variant.py").read_text()
    exec(compile(source, "variant.py", "exec"), namespace)
    cls = namespace["VariantFutureMap"]
    payload = namespace["VariantPayload"]
    relay_map = cls("cpu", 4, topk=2)  # type: ignore[operator]
    indices = torch.tensor([1, 3])
    relay_map.stash(
        indices,
        payload(  # type: ignore[operator]
            tokens=torch.tensor([5, 6]),
            probs=torch.ones(2, 2),
            scores=torch.tensor([0.5, 0.25]),
        ),
    )
    batch = types.SimpleNamespace(
        req_pool_indices=indices, spec=types.SimpleNamespace()
    )
    relay_map.resolve_future(batch)
    assert batch.spec.scores.tolist() == [0.5, 0.25]


def test_bundled_schemas_load_by_name_from_the_installed_package(
    tmp_path: Path,
) -> None:
    """``Schema.bundled`` loads a schema relay ships, from any folder (no checkout
    path), so a user's schema derives from it; an unknown name is refused, naming the
    ones relay ships."""
    from relay.schema import bundled_names

    assert {"decode", "eagle", "ngram"} <= set(bundled_names())
    eagle = Schema.bundled("eagle")
    assert eagle.name == "EagleFutureMap" and eagle.seeded
    derived = eagle.derive(name="MineFutureMap", doc="Mine.", drop=["hidden_states"])
    assert "hidden_states" not in [f.name for f in derived.fields]
    with pytest.raises(
        CompositionError, match="relay ships no such schema .it ships.* eagle,"
    ):
        Schema.bundled("eagel")
    script = "from relay.schema import Schema; print(Schema.bundled('ngram').name)"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "NgramFutureMap\n"), done.stderr
