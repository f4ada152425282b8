"""Helpers shared by the code-generator tests: throwaway projects and ways to run ``relay``."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

REPO = Path(__file__).resolve().parents[2]
RELAY_EXE = Path(sys.executable).with_name("relay")

# Every schema module written by these tests starts with these lines, so a
# declaration's line number is found by searching the text (see ``line_of``).
SCHEMA_PRELUDE = (
    "import torch\n\n"
    "from relay.schema import FROM_PAYLOAD, Alloc, Carried, Field, Guard, HostCopy, Lane, Resolve, "
    "Scatter, Schema, Tails, TailsKv\n\n"
)


@attrs.frozen
class Run:
    """The outcome of one ``relay`` invocation."""

    code: int
    out: str
    err: str


@attrs.frozen
class Project:
    """A throwaway relay project: pyproject.toml with [tool.relay], schemas/ and maps/."""

    root: Path

    @property
    def schemas(self) -> Path:
        return self.root / "schemas"

    @property
    def maps(self) -> Path:
        return self.root / "maps"

    def write_schema(self, stem: str, text: str) -> Path:
        """Write ``schemas/<stem>.py`` (dedented) and return its path."""
        path = self.schemas / f"{stem}.py"
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    def schema_module(
        self, stem: str, fields: Sequence[str], name: str = "BadFutureMap"
    ) -> Path:
        """A schema module whose ``fields=[...]`` holds ``fields``, one declaration a line."""
        body = "".join(f"        {line}\n" for line in fields)
        text = (
            SCHEMA_PRELUDE
            + f"SCHEMA = Schema(\n    name={name!r},\n    fields=[\n"
            + body
            + "    ],\n)\n"
        )
        return self.write_schema(stem, text)

    def copy_bundled(self, *stems: str) -> None:
        """Copy bundled schemas from the repository's ``relay/schemas/``."""
        for stem in stems:
            shutil.copy(
                REPO / "relay" / "schemas" / f"{stem}.py", self.schemas / f"{stem}.py"
            )


def line_of(path: Path, needle: str) -> int:
    """1-based number of the only line of ``path`` containing ``needle``."""
    hits = [
        n for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line
    ]
    assert len(hits) == 1, f"{needle!r} found on lines {hits} of {path}"
    return hits[0]


def run_relay_process(
    *args: str, cwd: Path, hash_seed: str = "0", extra_env: dict[str, str] | None = None
) -> Run:
    """Run the installed ``relay`` console script in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = hash_seed
    env.update(extra_env or {})
    proc = subprocess.run(
        [str(RELAY_EXE), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


GOLDEN = REPO / "tests" / "golden"


def compare_golden(path: Path, fresh: str, update: bool) -> None:
    """Compare ``fresh`` with the golden file; rewrite it instead when ``update`` is set.

    Without ``update`` a difference fails the test with a unified diff and the command
    that accepts it, and the golden file is left as it is.
    """
    shown = (
        path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
    )
    if update:
        if not path.exists() or path.read_text(encoding="utf-8") != fresh:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(fresh.encode("utf-8"))
        return
    if not path.exists():
        pytest.fail(
            f"{shown} does not exist; review the generated module, then run "
            "`pytest --update-golden` to create it",
            pytrace=False,
        )
    golden = path.read_text(encoding="utf-8")
    if golden != fresh:
        diff = "".join(
            difflib.unified_diff(
                golden.splitlines(keepends=True),
                fresh.splitlines(keepends=True),
                fromfile=f"{shown} (golden)",
                tofile=f"{shown} (generated now)",
            )
        )
        pytest.fail(
            f"generated code differs from {shown}:\n{diff}\nIf the change is intended, "
            "review the diff, then run `pytest --update-golden` and commit "
            f"{shown}",
            pytrace=False,
        )


def mypy_strict(paths: Sequence[Path]) -> subprocess.CompletedProcess[str]:
    """`mypy --strict` over ``paths`` in one run, from the repository (its cache, which
    `mypy --strict` in CI has warmed, so torch's stubs are not analysed again)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            *sorted(str(p) for p in paths),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
