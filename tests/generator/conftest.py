"""Fixtures for the code-generator tests: throwaway relay projects and CLI runners."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from codegen_support import Project, Run, run_relay_process

from relay import cli


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
def relay_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
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
