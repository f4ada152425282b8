"""The generated maps type-check both ways under ``mypy --strict``.

``usage_ok.py`` uses the maps the way an engine does, with its own batch dataclasses;
it must produce no error. ``usage_bad.py`` misuses them; every bad line carries a
``# E: <code>`` marker, and mypy must report exactly those (line, code) pairs.
Both files are checked in one mypy run with a fresh cache, from the repository root,
with explicit paths (the repository's ``[tool.mypy]`` excludes ``tests/typing/`` from
its own discovery, which does not apply to files named on the command line).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
GOOD = HERE / "usage_ok.py"
BAD = HERE / "usage_bad.py"

_ERROR = re.compile(
    r"^(?P<path>[^:\n]+):(?P<line>\d+): error: .*\[(?P<code>[a-z0-9-]+)\]$"
)
_MARKER = re.compile(r"#\s*E:\s*(?P<codes>[a-z0-9-]+(?:[ ,]+[a-z0-9-]+)*)\s*$")

# The misuse categories the marker file must keep covering (code, a word of the line).
_REQUIRED_CASES = {
    ("call-arg", "next_tokens_ids"),  # a misspelled payload field
    ("call-arg", "EaglePayload(bonus_tokens=tokens, topk_p=tokens)"),  # a missing field
    ("arg-type", "decode.stash([1, 2]"),  # a wrong argument type
    ("arg-type", "NoHostMirrorBatch("),  # a batch lacking an attribute the map writes
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.fixture(scope="module")
def mypy_errors(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, set[tuple[int, str]]]:
    """Run mypy once over both files; the (line, code) errors of each, by relative path."""
    cache = tmp_path_factory.mktemp("mypy-cache")
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--cache-dir",
        str(cache),
        "--show-error-codes",
        "--no-error-summary",
        "--hide-error-context",
        "--no-pretty",
        "--no-color-output",
        _rel(GOOD),
        _rel(BAD),
    ]
    done = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), f"mypy crashed:\n{done.stdout}\n{done.stderr}"
    errors: dict[str, set[tuple[int, str]]] = {_rel(GOOD): set(), _rel(BAD): set()}
    for line in done.stdout.splitlines():
        match = _ERROR.match(line)
        if match:
            path = Path(match["path"]).as_posix()
            errors.setdefault(path, set()).add((int(match["line"]), match["code"]))
        elif ": error:" in line:
            pytest.fail(f"mypy error without an error code: {line}")
    return errors


def _markers(path: Path) -> set[tuple[int, str]]:
    expected: set[tuple[int, str]] = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = _MARKER.search(text)
        if match:
            for code in re.split(r"[ ,]+", match["codes"]):
                expected.add((number, code))
    return expected


def test_usage_ok_passes_mypy_strict(
    mypy_errors: dict[str, set[tuple[int, str]]],
) -> None:
    """An engine's own batch dataclasses satisfy the generated Protocols under --strict."""
    assert mypy_errors[_rel(GOOD)] == set()


def test_usage_bad_errors_are_exactly_the_marked_lines(
    mypy_errors: dict[str, set[tuple[int, str]]],
) -> None:
    """Each misuse is reported on its marked line with its marked code, and nothing else."""
    expected = _markers(BAD)
    got = mypy_errors[_rel(BAD)]
    assert got == expected, (
        f"missing (marked, not reported): {sorted(expected - got)}\n"
        f"unexpected (reported, not marked): {sorted(got - expected)}"
    )


def test_no_errors_outside_the_two_files(
    mypy_errors: dict[str, set[tuple[int, str]]],
) -> None:
    """The generated maps themselves type-check while the usage files are checked."""
    others = {
        path: errs
        for path, errs in mypy_errors.items()
        if path not in (_rel(GOOD), _rel(BAD))
    }
    assert others == {}


def test_marker_file_covers_the_required_misuses() -> None:
    """The misuse file keeps a case for each misuse users most often make."""
    lines = BAD.read_text().splitlines()
    marked = {(number, code) for number, code in _markers(BAD)}
    for code, snippet in _REQUIRED_CASES:
        hits = [n for n, text in enumerate(lines, start=1) if snippet in text]
        assert hits, f"no line of {BAD.name} contains {snippet!r}"
        assert any((n, code) in marked for n in hits), (
            f"{snippet!r} is not marked {code}"
        )
