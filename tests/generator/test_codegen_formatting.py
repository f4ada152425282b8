"""Layout by ruff's formatter: realistic names give modules that users' formatters
leave alone, and only a ruff in the declared range lays modules out."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types
from collections.abc import Callable, Iterator

import pytest
import torch
from codegen_support import Project, Run, line_of

from relay.codegen import files, formatting, naming
from relay.codegen.render import render
from relay.schema import Field, Lane, Schema

#: The issue's case: a 37-character optional lazy forward field, gathered into
#: ``spec_info.<same name>``, as real engines name their extras.
LONG = "draft_hidden_states_of_the_last_layer"
#: About 70 characters: once gave a module Python could not parse.
VERY_LONG = "hidden_states_of_the_last_verified_layer_for_the_draft_model_extension"

REALISTIC = [
    (
        f"Field({LONG!r}, lane=Lane.FORWARD, dtype=FROM_PAYLOAD, alloc=Alloc.LAZY, "
        f'optional=True, shape=("hidden",), target="spec_info.{LONG}"),'
    ),
    (
        f"Field({VERY_LONG!r}, lane=Lane.FORWARD, dtype=torch.bfloat16, "
        f'shape=("hidden",), target="spec_info.{VERY_LONG}"),'
    ),
    (
        f"Field({VERY_LONG[:-1] + 's'!r}, lane=Lane.SCHEDULE, dtype=torch.int64, "
        'target="seq_lens", host=HostCopy(mirror="seq_lens_cpu", sum="seq_lens_sum"), '
        "optional=True, guard=Guard.POSITIVE),"
    ),
]


def ruff(*args: str, cwd: Project) -> subprocess.CompletedProcess[str]:
    """The ruff relay uses, at its defaults (``--isolated``: no project settings)."""
    return subprocess.run(
        [str(formatting.ruff_binary()), *args, "--isolated", "."],
        cwd=cwd.maps,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def realistic(project: Project, relay_cli: Callable[..., Run]) -> Iterator[Project]:
    """A project whose one schema declares the realistic long names, generated."""
    project.schema_module("realistic", REALISTIC, name="RealisticFutureMap")
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 0, run.err
    yield project
    sys.modules.pop("realistic", None)


def test_long_names_survive_ruff_format_and_check(
    realistic: Project, relay_cli: Callable[..., Run]
) -> None:
    """ruff format at its defaults changes nothing and ruff check finds nothing, so a
    pre-commit formatter leaves the module as relay wrote it and --check stays green."""
    before = (realistic.maps / "realistic.py").read_bytes()
    fmt = ruff("format", cwd=realistic)
    assert fmt.returncode == 0, fmt.stderr
    assert "1 file left unchanged" in fmt.stdout
    assert (realistic.maps / "realistic.py").read_bytes() == before
    lint = ruff("check", cwd=realistic)
    assert lint.returncode == 0, lint.stdout
    assert relay_cli("generate", "--check", cwd=realistic.root).code == 0


def test_long_names_give_a_module_python_imports(
    realistic: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 70-character names give a module that imports and runs its field."""
    import torch

    monkeypatch.syspath_prepend(str(realistic.maps))
    module = __import__("realistic")
    relay = module.RealisticFutureMap("cpu", 5, hidden=3)
    slots = torch.tensor([2])
    relay.stash(
        slots,
        module.RealisticPayload(**{VERY_LONG: torch.ones(1, 3, dtype=torch.bfloat16)}),
    )

    class SpecInfo:
        pass

    class Batch:
        req_pool_indices = slots
        spec_info = SpecInfo()

    batch = Batch()
    relay.resolve_future(batch)
    assert getattr(batch.spec_info, VERY_LONG).tolist() == [[1.0, 1.0, 1.0]]
    assert getattr(batch.spec_info, LONG) is None


def test_module_from_another_formatter_version_is_stale(
    realistic: Project,
    relay_cli: Callable[..., Run],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same bytes under another formatter version's identity: --check calls the module
    stale (another relay version generated it), and generate rewrites it."""
    with monkeypatch.context() as m:
        m.setattr(files, "GENERATOR", "relay codegen; ruff format 0.0.1")
        assert relay_cli("generate", cwd=realistic.root).code == 0
    run = relay_cli("generate", "--check", cwd=realistic.root)
    assert run.code == 1
    assert "maps/realistic.py: stale (another relay version generated it)" in run.err
    assert relay_cli("generate", cwd=realistic.root).out.startswith(
        "wrote maps/realistic.py"
    )


def test_a_ruff_outside_the_range_is_refused_with_the_fix(
    project: Project,
    relay_cli: Callable[..., Run],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a ruff in the range nothing is generated and the error says what to
    install, or which variable names a binary."""
    project.schema_module("realistic", REALISTIC[:1], name="RealisticFutureMap")
    formatting.ruff_binary.cache_clear()
    monkeypatch.setattr(formatting, "RUFF_RANGE", ("0.0.1", "0.0.2"))
    monkeypatch.setattr(formatting, "RUFF_REQUIREMENT", "ruff>=0.0.1,<0.0.2")
    try:
        run = relay_cli("generate", cwd=project.root)
    finally:
        formatting.ruff_binary.cache_clear()
    assert run.code == 2
    assert "run `pip install 'ruff>=0.0.1,<0.0.2'` in this environment" in run.err
    assert "or set RELAY_RUFF to such a ruff binary" in run.err
    assert not project.maps.exists() or list(project.maps.iterdir()) == []


def test_relay_ruff_names_the_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RELAY_RUFF`` is the one binary tried, so a project whose own ruff lies
    outside the range can point relay at another."""
    binary = formatting.ruff_binary()
    formatting.ruff_binary.cache_clear()
    monkeypatch.setenv("RELAY_RUFF", str(binary))
    try:
        assert formatting.ruff_binary() == binary
        formatting.ruff_binary.cache_clear()
        monkeypatch.setenv("RELAY_RUFF", "/no/such/ruff")
        with pytest.raises(formatting.FormatError, match="no ruff found"):
            formatting.ruff_binary()
    finally:
        formatting.ruff_binary.cache_clear()


@pytest.mark.parametrize(
    "version,inside",
    [("0.9.0", True), ("0.17.6", True), ("0.8.6", False), ("0.18.0", False)],
)
def test_the_range_includes_its_low_end_and_excludes_its_high_end(
    version: str, inside: bool
) -> None:
    """``RUFF_RANGE`` reads as pip reads ``ruff>=low,<high``."""
    assert formatting.in_range(version) is inside


def test_a_module_python_cannot_compile_is_a_located_error(
    project: Project,
    relay_cli: Callable[..., Run],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A generator bug that would emit broken code (here: a buffer named with a hyphen)
    exits 3 naming the schema and its line, and writes no file at all."""
    path = project.schema_module(
        "bad",
        [
            'Field("tokens", lane=Lane.FORWARD, dtype=torch.int64, target="input_ids"),',
            'Field("seq", lane=Lane.SCHEDULE, dtype=torch.int64, target="seq_lens"),',
        ],
    )
    project.schema_module("good", REALISTIC[:1], name="GoodFutureMap")
    real = naming.buffer
    monkeypatch.setattr(
        naming,
        "buffer",
        lambda f: f"{f.name}-buf" if f.name == "tokens" else real(f),
    )
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 3, run.err
    line = line_of(path, "SCHEMA = Schema(")
    assert run.err.startswith(
        f"schemas/bad.py:{line}: error: BadFutureMap: the generated module "
        "maps/bad.py would be broken (SyntaxError: "
    ), run.err
    assert "nothing was written" in run.err
    assert "fix: this is a relay bug" in run.err
    assert not project.maps.exists() or list(project.maps.iterdir()) == []


DOCS = [
    "A path C:\\relay\\maps and a regex \\d+\\s*: \"quoted\", 'single'.",
    '"""Triple quotes""" and """"four"""" and a trailing quote"',
    "\\",
    "ends in a backslash \\",
    'a "\\"" mix \\\\" of both\n\n    indented second paragraph with \\n spelled out',
    '"leading quote',
]


@pytest.mark.parametrize("doc", DOCS)
def test_docs_with_backslashes_and_quotes_round_trip(doc: str) -> None:
    """The schema's doc text comes back exactly: the class doc string opens with it (as
    inspect.getdoc shows doc strings), and the module doc string's first line is its
    first line; ruff format leaves the module alone."""
    schema = Schema(
        name="DocFutureMap",
        doc=doc,
        fields=[
            Field(
                "tokens",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                target="input_ids",
                doc=doc,
            )
        ],
    )
    content = render(schema, source="schemas/doc.py", command="relay generate")
    module = types.ModuleType("relay_doc_map")
    exec(compile(content, "doc.py", "exec"), module.__dict__)
    expected = inspect.cleandoc(doc)
    class_doc = inspect.getdoc(module.DocFutureMap)
    assert class_doc is not None
    assert class_doc.startswith(expected + "\n\nRows are request-pool slots")
    assert module.__doc__.split("\n")[0] == expected.split("\n")[0]
    fmt = subprocess.run(
        [str(formatting.ruff_binary()), "format", "--check", "--isolated", "-"],
        input=content,
        capture_output=True,
        text=True,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_pyproject_declares_the_same_range() -> None:
    """The ``generate`` extra asks pip for exactly the range the generator accepts."""
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert f'"{formatting.RUFF_REQUIREMENT}"' in pyproject.read_text(encoding="utf-8")
