"""Golden copies of the bundled generated modules: any change to generated code is reviewed."""

from __future__ import annotations

from pathlib import Path

import pytest
from codegen_support import GOLDEN, REPO, compare_golden, golden_path

from relay.codegen import configured_job, plan

BUNDLED = sorted(p.stem for p in (REPO / "schemas").glob("*.py") if p.name != "__init__.py")


@pytest.fixture(scope="module")
def fresh() -> dict[str, str]:
    """The bundled maps as the generator renders them now, by schema stem."""
    return {item.path.stem: item.content for item in plan(configured_job(REPO))}


@pytest.mark.parametrize("stem", BUNDLED)
def test_generated_module_matches_golden(stem: str, fresh: dict[str, str],
                                         update_golden: bool) -> None:
    """The generated module of each bundled schema equals its reviewed golden copy."""
    compare_golden(golden_path(stem), fresh[stem], update_golden)


def test_no_golden_file_without_schema(update_golden: bool) -> None:
    """Every golden file belongs to a bundled schema (removed ones are deleted on update)."""
    extra = sorted(p for p in GOLDEN.glob("*.py.txt") if p.name[: -len(".py.txt")] not in BUNDLED)
    if update_golden:
        for path in extra:
            path.unlink()
        return
    assert [p.name for p in extra] == [], "delete them, or run `pytest --update-golden`"


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
