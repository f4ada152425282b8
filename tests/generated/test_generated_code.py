"""The generated code itself: every bound name is in naming.py's list, every string
reaches the module faithfully, and formatters and linters leave it alone."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import itertools
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from relay.codegen import literals, naming
from relay.codegen.loader import load_schema
from relay.codegen.render import render
from relay.codegen.validate import validate
from relay.errors import RelayError
from relay.opcount import count_ops
from relay.schema import (
    FROM_PAYLOAD,
    Alloc,
    Field,
    Guard,
    HostCopy,
    Lane,
    Layout,
    Resolve,
    Schema,
)

REPO = Path(__file__).resolve().parents[2]
BUNDLED = sorted((REPO / "relay" / "schemas").glob("*.py"))

#: Every branch of the template: placeholders on both lanes, a required lazy field, an
#: optional eager field, a host sum without a mirror, deep targets, long names that wrap.
CORPUS = Schema(
    name="CorpusWithRatherLongNamesThatWrapFutureMap",
    doc="Every branch of the template.",
    indices="sched.req_pool_indices",
    fields=[
        Field(
            "tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
            guard=Guard.NON_NEGATIVE,
        ),
        Field(
            "a_rather_long_field_name_for_wrapping",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=(2, "width"),
            target="spec_info.deeper.still_deeper.a_rather_long_target",
        ),
        Field(
            "required_lazy",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            shape=("vocab",),
            alloc=Alloc.LAZY,
            target="spec_info.required_lazy",
        ),
        Field(
            "optional_eager",
            lane=Lane.FORWARD,
            dtype=torch.int32,
            shape=(3,),
            optional=True,
            target="spec_info.optional_eager",
            guard=Guard.POSITIVE,
        ),
        Field(
            "lengths",
            lane=Lane.SCHEDULE,
            dtype=torch.int64,
            target="seq_lens",
            resolve=Resolve.PLACEHOLDER,
            host=HostCopy(sum="seq_lens_sum"),
        ),
        Field(
            "scores",
            lane=Lane.SCHEDULE,
            dtype=torch.float32,
            shape=("width",),
            optional=True,
            target="spec_info.scores",
            host=HostCopy(mirror="scores_cpu"),
        ),
    ],
)


#: The packed layout's branches: two dtype groups, scalar, 1-D, multi-dim and fixed rows,
#: long names that wrap, next to fields that stay unpacked (lazy, optional, placeholder).
PACKED_CORPUS = Schema(
    name="PackedCorpusWithRatherLongNamesThatWrapFutureMap",
    doc="Every branch of the packed layout.",
    layout=Layout.PACKED,
    fields=[
        Field(
            "tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
        ),
        Field("bonus", lane=Lane.FORWARD, dtype=torch.int64, target="spec_info.bonus"),
        Field(
            "a_rather_long_packed_field_name_for_wrapping",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=("width", 2),
            target="spec_info.deeper.still_deeper.a_rather_long_target",
        ),
        Field(
            "index",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            shape=("width",),
            target="spec_info.index",
        ),
        Field(
            "probs",
            lane=Lane.FORWARD,
            dtype=torch.float32,
            shape=(3,),
            target="spec_info.probs",
        ),
        Field(
            "hidden",
            lane=Lane.FORWARD,
            dtype=FROM_PAYLOAD,
            shape=("hidden",),
            alloc=Alloc.LAZY,
            optional=True,
            target="spec_info.hidden",
        ),
        Field("lengths", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens"),
    ],
)


def _schemas() -> list[Schema]:
    handover = REPO / "tests" / "golden" / "schemas" / "handover.py"
    lanes = REPO / "tests" / "golden" / "schemas" / "lanes.py"
    return [
        *(load_schema(p, f"relay/schemas/{p.name}") for p in BUNDLED),
        CORPUS,
        PACKED_CORPUS,
        load_schema(handover, "tests/golden/schemas/handover.py"),
        load_schema(lanes, "tests/golden/schemas/lanes.py"),
    ]


def _bound(tree: ast.Module) -> set[str]:
    """Every name a module binds: imports, classes, functions, parameters, locals, self.X."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


def _used(tree: ast.Module) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | _bound(tree)


def test_every_bound_name_is_reserved_or_minted_by_naming() -> None:
    """A name the template binds that naming.py does not know would be a clash validation
    cannot see: each rendered module binds only names from naming.bound_names."""
    for schema in _schemas():
        tree = ast.parse(
            render(schema, source="schemas/x.py", command="relay generate")
        )
        extra = _bound(tree) - naming.bound_names(schema)
        assert extra == set(), (
            f"{schema.name}: add these to naming.RESERVED or mint them there"
        )


def test_every_reserved_name_is_emitted_by_the_template() -> None:
    """naming.RESERVED holds no stale entry: each one appears in some rendered module."""
    seen: set[str] = set()
    for schema in _schemas():
        seen |= _used(
            ast.parse(render(schema, source="s.py", command="relay generate"))
        )
    assert naming.RESERVED - seen == set()


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("ﬁeld", "NFKC"),
        ("__hidden", "mangles"),
        ("__init__", "dunder"),
        ("match", "keyword"),
        ("_rt", "binds itself"),
        ("index_shape", "binds itself"),
        ("count", "binds itself"),  # a resolve's slots counted for its host sum
        ("_FLOAT32", "binds itself"),  # a dtype a gate tests (Note [Gate constants])
        ("2x", "identifier"),
    ],
)
def test_identifier_problems_are_named(name: str, problem: str) -> None:
    """identifier_problem refuses what Python would read differently or clash on."""
    found = naming.identifier_problem(name)
    assert found is not None and problem in found
    assert naming.identifier_problem("topk_p") is None


HOSTILE = [
    '"""',
    "'''",
    'ends with a quote"',
    "ends with a backslash\\",
    "back\\slash \\n not a newline",
    "nul \x00 byte",
    "line one\nline two\n\n  indented three",
    "carriage\rreturn and form\x0cfeed and \x1b escape",
    "{{ m.cls }} {% if true %}jinja{% endif %} {# comment #}",
    "unicode line\u2028separator and \u00a0 no-break",
]


def _import(text: str, tmp_path: Path, stem: str) -> ModuleType:
    path = tmp_path / f"{stem}.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _attribute_docs(tree: ast.Module, cls: str) -> dict[str, str]:
    """The string statement after each annotated attribute of class ``cls``."""
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    docs = {}
    for first, second in zip(node.body, node.body[1:]):
        if (
            isinstance(first, ast.AnnAssign)
            and isinstance(first.target, ast.Name)
            and isinstance(second, ast.Expr)
            and isinstance(second.value, ast.Constant)
        ):
            docs[first.target.id] = second.value.value
    return docs


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_strings_reach_the_module_faithfully(text: str, tmp_path: Path) -> None:
    """Doc strings, the source file name and the command are rendered so the module
    compiles and reads each back exactly (doc strings as inspect.cleandoc sees them)."""
    schema = Schema(
        name="HostileFutureMap",
        doc=f"First line {text}\n\nMore: {text}",
        fields=[
            Field(
                "tokens",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                target="input_ids",
                doc=text,
            ),
            Field(
                "lens",
                lane=Lane.SCHEDULE,
                dtype=torch.int64,
                target="seq_lens",
                doc=text,
            ),
        ],
    )
    # A file name with a line break or control character is refused (the next test).
    name = text if text.isprintable() else "hostile"
    source = f"schemas/{name}.py"
    rendered = render(schema, source=source, command=f"relay generate {name}")
    module = _import(rendered, tmp_path, "hostile_map")
    want = inspect.cleandoc(schema.doc)
    assert inspect.getdoc(module.HostileFutureMap).startswith(want.rstrip())
    assert inspect.cleandoc(
        _attribute_docs(ast.parse(rendered), "HostilePayload")["tokens"]
    ) == (inspect.cleandoc(text).rstrip() or "tokens")
    assert "\n".join(source.splitlines()) in "\n".join(module.__doc__.splitlines())
    header = list(
        itertools.takewhile(lambda s: s.startswith("#"), rendered.splitlines())
    )
    assert len(header) == 4, "nothing can end a header comment early"
    assert ("\n" + rendered).count("\n#") == 4 + 4, (
        "the constants' and the table's comments only"
    )


def test_each_cast_is_the_op_its_spelling_says() -> None:
    """A cast spelled as the dtype's own method (``.int()``) makes the same op and
    values as ``.to(dtype)``; a dtype without one is spelled ``.to(...)``."""
    values = torch.tensor([-2, 0, 3])
    for dtype in (torch.int32, torch.int16, torch.bool, torch.float32, torch.bfloat16):
        method = literals.cast_to(dtype)
        assert method.startswith(".") and method.endswith("()") and ".to(" not in method

        def spelled(method: str = method) -> torch.Tensor:
            cast: torch.Tensor = getattr(values, method[1:-2])()
            return cast

        def to(dtype: torch.dtype = dtype) -> torch.Tensor:
            return values.to(dtype)

        assert torch.equal(spelled(), to()) and spelled().dtype is dtype
        assert count_ops(spelled) == count_ops(to)
    assert literals.cast_to(torch.complex64) == ".to(torch.complex64)"


def test_lone_surrogates_in_docs_are_refused_with_the_owner() -> None:
    """A lone surrogate cannot live in a doc string: the problem names it (validation,
    next, locates it at its owner)."""
    assert literals.doc_problem("ok \U0001f600") is None
    problem = literals.doc_problem("bad \ud800")
    assert problem is not None and "U+D800" in problem


def test_lone_surrogates_in_docs_are_schema_errors_naming_the_field() -> None:
    """Validation refuses a lone surrogate in the schema's or a field's doc, located."""
    schema = Schema(
        name="SurrogateFutureMap",
        doc="bad \udc00",
        fields=[
            Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),
            Field(
                "lens",
                lane=Lane.SCHEDULE,
                dtype=torch.int64,
                target="seq_lens",
                doc="x \ud800",
            ),
        ],
    )
    issues = validate(schema, str)
    assert [(i.field, "lone surrogate (U+" in i.problem) for i in issues] == [
        (None, True),
        ("lens", True),
    ]


def test_file_names_with_line_breaks_or_control_characters_are_refused() -> None:
    """A source name with a newline, NUL or escape cannot reach the header comment: it is
    refused with an error that names it, instead of being rendered."""
    schema = Schema(
        name="NamedFutureMap",
        fields=[
            Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids")
        ],
    )
    for name in [
        "schemas/\ud800\nimport os.py",
        "schemas/nul \x00.py",
        "schemas/\x1b[2J.py",
    ]:
        with pytest.raises(
            RelayError, match="line break or control character; rename it"
        ):
            render(schema, source=name, command="relay generate")


def _ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which(
        "ruff"
    )
    if found is None:
        pytest.skip("ruff is not installed (it is in the dev extra)")
    return [found]


def test_generated_modules_are_left_alone_by_ruff(tmp_path: Path) -> None:
    """ruff format changes nothing and ruff check (defaults, and isort) finds nothing, with
    relay installed as a third-party package as in a user's project."""
    ruff = _ruff()
    for schema in _schemas():
        stem = naming.prefix(schema).lower()
        (tmp_path / f"{stem}.py").write_text(
            render(schema, source=f"schemas/{stem}.py", command="relay generate")
        )
    fmt = subprocess.run(
        [*ruff, "format", "--isolated", "--diff", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    for select in ([], ["--extend-select", "I"]):
        check = subprocess.run(
            [*ruff, "check", "--isolated", *select, "."],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    "field",
    [
        Field("ﬁeld", lane=Lane.FORWARD, dtype=torch.int64),
        Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, source="__mangled"),
        Field(
            "tokens", lane=Lane.FORWARD, dtype=torch.int64, target="spec_info.__hidden"
        ),
        Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, shape=("__width",)),
        Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, source="index_shape"),
    ],
    ids=[
        "nfkc-name",
        "mangled-source",
        "mangled-target",
        "mangled-dim",
        "reserved-source",
    ],
)
def test_validation_refuses_names_python_would_read_differently(field: Field) -> None:
    """validate asks naming.identifier_problem: NFKC, mangled and reserved names are refused."""
    from relay.codegen.validate import validate

    issues = validate(Schema(name="NamesFutureMap", fields=[field]), str)
    assert issues, "the schema must be refused"
