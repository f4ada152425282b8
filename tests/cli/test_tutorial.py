"""docs/tutorial.md and docs/ci.md, followed literally in a fresh project, work end to end.

The test reads the tutorial in order: a fenced block introduced by "create
`PATH`", "save it as `PATH`" or "add this section to ... `PATH`" is written to that
file; a block of ``$`` lines is run, command by command, with ``bash`` in the
project, and each command's output (stdout and stderr) must be the lines shown
under it (timings such as ``(0.16s)`` may differ; a ``...`` line stands for any
lines). Installing is the one step done differently, offline: relay is installed
from this checkout exactly as the tutorial's "from a checkout" line says, with
``--no-deps --no-build-isolation`` (torch, mypy and the rest come from the test's
own environment through a ``.pth`` file).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

pytestmark = pytest.mark.slow  # a venv, an editable install and mypy: 10-60 s


@attrs.frozen
class Block:
    """A fenced block of a document, with the paragraph before it."""

    lang: str
    body: str
    intro: str
    line: int


def blocks(doc: Path, start: str | None = None, stop: str | None = None) -> Iterator[Block]:
    """The blocks of ``doc`` from the heading ``start`` to the heading ``stop``."""
    text = doc.read_text(encoding="utf-8")
    begin = text.index(f"\n{start}\n") if start else 0
    end = text.index(f"\n{stop}\n") if stop else len(text)
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.DOTALL | re.MULTILINE):
        if not begin <= match.start() < end:
            continue
        before = text[: match.start()].rstrip("\n")
        intro = before.rsplit("\n\n", 1)[-1]
        line = text.count("\n", 0, match.start()) + 1
        yield Block(match.group(1), match.group(2), intro, line)


def _file_target(intro: str) -> tuple[str, bool] | None:
    """(path, append) when the paragraph asks to write the block to a file."""
    words = intro.replace("\n", " ")
    path = next((p for p in re.findall(r"`([\w./-]+\.(?:py|toml))`", words)), None)
    if path is None:
        return None
    if re.search(r"\b(?:[Cc]reate|[Ss]ave it as)\b", words):
        return path, False
    if re.search(r"\b[Aa]dd this section to\b", words):
        return path, True
    return None


def _commands(body: str) -> list[tuple[str, list[str]]]:
    """Each ``$`` line and the output lines under it."""
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def _normalize(line: str) -> str:
    return re.sub(r"\(\d+\.\d+s\)", "(T s)", line.rstrip())


def _matches(got: list[str], want: list[str]) -> bool:
    """``got`` is ``want``, where a ``...`` line of ``want`` stands for any lines."""
    if not want:
        return not got
    if want[0] == "...":
        return any(_matches(got[i:], want[1:]) for i in range(len(got) + 1))
    return bool(got) and got[0] == want[0] and _matches(got[1:], want[1:])


class Project:
    """The fresh project, its environment, and the commands run in it."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env

    def run(self, command: str) -> list[str]:
        done = subprocess.run(["bash", "-c", command], check=False, cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=300)
        output = (done.stdout + done.stderr).splitlines()
        return [_normalize(line) for line in output]

    def check(self, command: str, want: list[str], where: str) -> None:
        got = self.run(command)
        want = [_normalize(line) for line in want]
        assert _matches(got, want), (
            f"{where}: `{command}` printed\n" + "\n".join(got) + "\nbut the doc shows\n"
            + "\n".join(want)
        )


def _install(tmp_path: Path) -> dict[str, str]:
    """A venv with relay installed from this checkout, editable in compat mode."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    # torch, attrs, jinja2, mypy, setuptools: from the environment running the tests.
    Path(site, "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-build-isolation", "--no-index", "-e", str(REPO),
         "--config-settings", "editable_mode=compat"],
        check=True, capture_output=True, text=True)
    # What `pip install mypy` would put there: a console script on the venv's python.
    mypy = venv / "bin" / "mypy"
    mypy.write_text(f"#!{python}\nimport sys\nfrom mypy.__main__ import console_entry\n"
                    "sys.exit(console_entry())\n")
    mypy.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # The repository's mypy cache already holds torch's modules: a cold cache costs ~40 s.
    env["MYPY_CACHE_DIR"] = str(REPO / ".mypy_cache")
    return env


def _follow(doc: Path, project: Project, start: str | None = None,
            stop: str | None = None) -> int:
    """Do what ``doc`` says from heading ``start`` to ``stop``; the commands run."""
    ran = 0
    for block in blocks(doc, start, stop):
        where = f"{doc.relative_to(REPO)}:{block.line}"
        if block.body.startswith("$ "):
            for command, want in _commands(block.body):
                project.check(command, want, where)
                ran += 1
            continue
        if "at the end of the schema's `fields` list" in block.intro.replace("\n", " "):
            schema = project.root / "myengine/relay_schemas/decode.py"
            text = schema.read_text().replace("from relay import Field,",
                                              "from relay import Alloc, Field,")
            field = "".join(f"        {line}\n" for line in block.body.splitlines())
            end = text.rindex("    ],\n)")
            schema.write_text(text[:end] + field + text[end:])
            continue
        target = _file_target(block.intro)
        if target is not None and block.lang in ("python", "toml"):
            path, append = target
            file = project.root / path
            file.parent.mkdir(parents=True, exist_ok=True)
            with file.open("a" if append else "w", encoding="utf-8") as out:
                out.write(block.body)
    return ran


def test_tutorial_and_ci_recipe_work_in_a_fresh_project(tmp_path: Path) -> None:
    """Every file and command of the tutorial, then docs/ci.md's checks, in a new project."""
    project_root = tmp_path / "project"
    project_root.mkdir()
    project = Project(project_root, _install(tmp_path))
    later = "## Adding a field later"
    assert _follow(DOCS / "tutorial.md", project, stop=later) >= 7
    # docs/ci.md's setup, while the project is clean: [tool.mypy], then the checks.
    assert _follow(DOCS / "ci.md", project, stop="## A plain shell script") == 1
    assert _follow(DOCS / "tutorial.md", project, start=later) == 3
