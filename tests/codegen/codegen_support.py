"""Helpers shared by the code-generator tests: throwaway projects and ways to run ``relay``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import attrs

REPO = Path(__file__).resolve().parents[2]
RELAY_EXE = Path(sys.executable).with_name("relay")

# Every schema module written by these tests starts with these lines, so a
# declaration's line number is found by searching the text (see ``line_of``).
SCHEMA_PRELUDE = (
    "import torch\n\n"
    "from relay.schema import FROM_PAYLOAD, Alloc, Field, Guard, Lane, Resolve, Schema\n\n"
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

    def schema_module(self, stem: str, fields: Sequence[str], name: str = "BadFutureMap") -> Path:
        """A schema module whose ``fields=[...]`` holds ``fields``, one declaration a line."""
        body = "".join(f"        {line}\n" for line in fields)
        text = (SCHEMA_PRELUDE + f"SCHEMA = Schema(\n    name={name!r},\n    fields=[\n"
                + body + "    ],\n)\n")
        return self.write_schema(stem, text)

    def copy_bundled(self, *stems: str) -> None:
        """Copy bundled schemas from the repository's ``schemas/``."""
        for stem in stems:
            shutil.copy(REPO / "schemas" / f"{stem}.py", self.schemas / f"{stem}.py")


def line_of(path: Path, needle: str) -> int:
    """1-based number of the only line of ``path`` containing ``needle``."""
    hits = [n for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} found on lines {hits} of {path}"
    return hits[0]


def run_relay_process(*args: str, cwd: Path, hash_seed: str = "0",
                      extra_env: dict[str, str] | None = None) -> Run:
    """Run the installed ``relay`` console script in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = hash_seed
    env.update(extra_env or {})
    proc = subprocess.run([str(RELAY_EXE), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    return Run(proc.returncode, proc.stdout, proc.stderr)
