"""The golden corpus: small schemas that together take every branch of the template.

``tests/golden/schemas/*.py`` are rendered and compared byte for byte with
``tests/golden/maps/*.py.txt`` (rewritten only by ``pytest --update-golden``). A
test renders the corpus with an instrumented template and fails naming every
``{% if %}`` arm, inline ``if`` arm and ``{% for %}`` body no corpus schema reaches,
so a template change that adds a branch also adds a schema that takes it. The
bundled maps are not copied here: ``relay generate --check`` already guards them.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable
from pathlib import Path

import attrs
import jinja2
import pytest
from codegen_support import GOLDEN, compare_golden, mypy_strict
from jinja2 import nodes

from relay.codegen import explicit_job, formatting, plan
from relay.codegen.files import Planned, parse
from relay.codegen.formatting import format_module
from relay.codegen.loader import load_schema
from relay.codegen.render import environment, render_body
from relay.codegen.views import map_view

CORPUS = GOLDEN / "schemas"
EXPECTED = GOLDEN / "maps"
STEMS = sorted(p.stem for p in CORPUS.glob("*.py"))


def expected_path(stem: str) -> Path:
    """``tests/golden/maps/<stem>.py.txt``: not .py, so neither pytest nor mypy picks it up."""
    return EXPECTED / f"{stem}.py.txt"


@pytest.fixture(scope="module")
def fresh() -> dict[str, Planned]:
    """The corpus as the generator renders it now, by schema stem."""
    job = explicit_job(sorted(CORPUS.glob("*.py")), EXPECTED)
    return {item.path.stem: item for item in plan(job)}


@pytest.mark.parametrize("stem", STEMS)
def test_generated_module_matches_golden(
    stem: str, fresh: dict[str, Planned], update_golden: bool
) -> None:
    """Each corpus schema's generated module equals its reviewed golden copy, byte for byte."""
    compare_golden(expected_path(stem), fresh[stem].content, update_golden)


@pytest.mark.parametrize("stem", STEMS)
def test_golden_module_compiles(stem: str, fresh: dict[str, Planned]) -> None:
    """Each corpus module is valid Python."""
    compile(fresh[stem].content, f"{stem}.py", "exec")


def test_no_golden_file_without_schema(update_golden: bool) -> None:
    """Every golden module belongs to a corpus schema (removed ones are deleted on update)."""
    extra = sorted(
        p for p in EXPECTED.glob("*.py.txt") if p.name[: -len(".py.txt")] not in STEMS
    )
    if update_golden:
        for path in extra:
            path.unlink()
        return
    assert [p.name for p in extra] == [], "delete them, or run `pytest --update-golden`"


@pytest.mark.slow
def test_corpus_passes_mypy_strict(fresh: dict[str, Planned], tmp_path: Path) -> None:
    """Every corpus module type-checks under `mypy --strict` (one run; the repository's cache,
    which `mypy --strict` in CI has warmed, so torch's stubs are not analysed again)."""
    folder = tmp_path / "corpus_maps"
    folder.mkdir()
    for stem, item in fresh.items():
        (folder / f"{stem}.py").write_text(item.content, encoding="utf-8")
    done = mypy_strict(list(folder.iterdir()))
    assert (done.returncode, done.stdout) == (0, ""), done.stdout + done.stderr


# --- branch coverage ---------------------------------------------------------------------------


@attrs.define
class Branches:
    """Every branch of the instrumented templates, and those taken so far."""

    known: dict[int, str] = attrs.Factory(dict)
    taken: set[int] = attrs.Factory(set)
    ids: itertools.count[int] = attrs.Factory(itertools.count)

    def new(self, template: str, node: nodes.Node, arm: str) -> int:
        number = next(self.ids)
        self.known[number] = f"{template}:{node.lineno}: {arm}"
        return number

    def take(self, number: int, value: object = "") -> object:
        self.taken.add(number)
        return value


def _mark(number: int) -> nodes.Output:
    """A template node that records ``number`` and writes nothing."""
    return nodes.Output(
        [
            nodes.Call(
                nodes.Name("_branch", "load"), [nodes.Const(number)], [], None, None
            )
        ]
    )


def _marked(number: int, expr: nodes.Expr) -> nodes.Call:
    """``expr``, recording ``number`` when it is evaluated."""
    return nodes.Call(
        nodes.Name("_branch", "load"), [nodes.Const(number), expr], [], None, None
    )


def instrument(tree: nodes.Template, template: str, branches: Branches) -> None:
    """Insert a recorder at the start of every branch of ``tree``, in place."""
    ifs = list(tree.find_all(nodes.If))
    elifs = {id(e) for n in ifs for e in n.elif_}
    for node in ifs:
        if id(node) in elifs:
            continue  # an elif's arms belong to the if it continues
        node.body.insert(0, _mark(branches.new(template, node, "{% if %} true")))
        for number, elif_ in enumerate(node.elif_, 1):
            elif_.body.insert(
                0, _mark(branches.new(template, elif_, f"{{% elif %}} #{number}"))
            )
        node.else_.insert(
            0, _mark(branches.new(template, node, "{% if %} false (else)"))
        )
    for loop in list(tree.find_all(nodes.For)):
        loop.body.insert(0, _mark(branches.new(template, loop, "{% for %} body")))
    for cond in list(tree.find_all(nodes.CondExpr)):
        cond.expr1 = _marked(
            branches.new(template, cond, "inline if: true"), cond.expr1
        )
        otherwise = cond.expr2 if cond.expr2 is not None else nodes.Const("")
        cond.expr2 = _marked(
            branches.new(template, cond, "inline if: false"), otherwise
        )


def instrumented_environment(branches: Branches) -> jinja2.Environment:
    """The generator's environment, with every template it loads instrumented."""

    class Instrumented(jinja2.Environment):
        def _parse(
            self, source: str, name: str | None, filename: str | None
        ) -> nodes.Template:
            tree = super()._parse(source, name, filename)
            instrument(tree, name or "<string>", branches)
            return tree

    env = environment(Instrumented)
    env.globals["_branch"] = branches.take
    return env


def _render_all(
    env: jinja2.Environment, render: Callable[..., str] = render_body
) -> dict[str, str]:
    bodies = {}
    for stem in STEMS:
        path = CORPUS / f"{stem}.py"
        source = f"tests/golden/schemas/{stem}.py"
        bodies[stem] = render(map_view(load_schema(path, source), source=source), env)
    return bodies


def test_corpus_takes_every_branch_of_the_template() -> None:
    """Rendering the corpus reaches every if arm (else included), inline if arm and for body."""
    branches = Branches()
    _render_all(instrumented_environment(branches))
    assert len(branches.known) > 20, "the instrumentation found no branches"
    missed = [branches.known[n] for n in sorted(set(branches.known) - branches.taken)]
    assert missed == [], (
        "no schema of tests/golden/schemas/ takes these template branches; add a small schema "
        "that does (then `pytest --update-golden`), or drop the branch:\n  "
        + "\n  ".join(missed)
    )


def test_instrumentation_changes_no_output(fresh: dict[str, Planned]) -> None:
    """The instrumented template renders the same bytes, so its coverage is the real one."""
    bodies = _render_all(instrumented_environment(Branches()))
    for stem, item in fresh.items():
        parsed = parse(item.content)
        assert parsed is not None
        assert format_module(bodies[stem], f"{stem}.py") == parsed[1], stem


def test_coverage_check_sees_a_missed_branch() -> None:
    """A branch no schema takes is reported (here: a template with an arm never true)."""
    branches = Branches()
    env = jinja2.Environment()
    tree = env.parse("{% if m.never %}x{% endif %}{{ 'a' if m.always }}")
    instrument(tree, "probe", branches)
    template = env.from_string(tree)
    template.globals["_branch"] = branches.take
    assert template.render(m={"never": False, "always": True}) == "a"
    missed = sorted(branches.known[n] for n in set(branches.known) - branches.taken)
    assert missed == ["probe:1: inline if: false", "probe:1: {% if %} true"]


# --- the golden-file helper ------------------------------------------------------------------


def test_mismatch_fails_with_diff_and_leaves_golden(tmp_path: Path) -> None:
    """Without --update-golden a difference fails with the diff and the fix; nothing is written."""
    path = tmp_path / "decode.py.txt"
    path.write_text("a\nb\n")
    with pytest.raises(pytest.fail.Exception) as excinfo:
        compare_golden(path, "a\nc\n", update=False)
    message = str(excinfo.value)
    assert "-b\n+c\n" in message
    assert "run `pytest --update-golden`" in message
    assert path.read_text() == "a\nb\n"


def test_missing_golden_fails_without_update(tmp_path: Path) -> None:
    """A golden file that does not exist fails the test rather than being created silently."""
    path = tmp_path / "new.py.txt"
    with pytest.raises(pytest.fail.Exception, match="pytest --update-golden"):
        compare_golden(path, "x\n", update=False)
    assert not path.exists()


def test_update_rewrites_golden(tmp_path: Path) -> None:
    """With --update-golden the golden file gets the fresh bytes and the test passes."""
    path = tmp_path / "decode.py.txt"
    path.write_text("old\n")
    compare_golden(path, "new\n", update=True)
    assert path.read_bytes() == b"new\n"


def test_corpus_is_left_alone_by_ruff(
    fresh: dict[str, Planned], tmp_path: Path
) -> None:
    """ruff format --check and ruff check, at ruff's defaults, change and find nothing in
    any corpus module (relay a third-party package, as in a user's project)."""
    for stem, item in fresh.items():
        (tmp_path / f"{stem}.py").write_text(item.content, encoding="utf-8")
    for args in (["format", "--check"], ["check"]):
        done = subprocess.run(
            [str(formatting.ruff_binary()), *args, "--isolated", "."],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
