"""Fixtures for the code-generator tests: throwaway relay projects and CLI runners."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def _import_the_generator() -> None:
    # pytest puts tests/ on sys.path (tests/conftest.py has no package), where this
    # folder would be found first, as a namespace package named "codegen", and shadow
    # the generator that the editable install provides through a meta-path finder.
    # Importing the real package once, with tests/ hidden, makes every later
    # `import codegen` (tests, and relay's CLI run in-process) get the generator.
    if getattr(sys.modules.get("codegen"), "__file__", None) is not None:
        return
    sys.modules.pop("codegen", None)
    tests = Path(__file__).resolve().parent.parent
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if Path(p or ".").resolve() != tests]
    try:
        importlib.import_module("codegen")
    finally:
        sys.path[:] = saved


_import_the_generator()

from codegen_support import Project, Run, run_relay_process  # noqa: E402

from relay import cli  # noqa: E402


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """An empty relay project configured to generate schemas/*.py into maps/."""
    root = tmp_path / "proj"
    (root / "schemas").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "userproj"\n\n[tool.relay]\nschemas = ["schemas/*.py"]\nout = "maps"\n',
        encoding="utf-8",
    )
    return Project(root)


@pytest.fixture
def relay_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
              ) -> Callable[..., Run]:
    """Run ``relay <args>`` in this process from folder ``cwd`` (fast; no torch re-import)."""

    def run(*args: str, cwd: Path) -> Run:
        capsys.readouterr()
        with monkeypatch.context() as m:
            m.chdir(cwd)
            try:
                code = cli.main(list(args))
            except SystemExit as exit_:  # argparse's --help and usage errors
                code = int(exit_.code or 0)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture
def relay_process() -> Callable[..., Run]:
    """Run the installed ``relay`` console script in a subprocess (real exit codes)."""
    return run_relay_process
