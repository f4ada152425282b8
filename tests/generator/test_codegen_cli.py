"""The `relay` command line: help, usage and configuration errors; a light runtime import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from codegen_support import REPO, Run, run_relay_process

from relay.codegen.config import find_pyproject


@pytest.fixture
def bare_folder(tmp_path: Path) -> Path:
    """A folder with no pyproject.toml at or above it."""
    folder = tmp_path / "bare"
    folder.mkdir()
    if find_pyproject(folder) is not None:
        pytest.skip(f"a pyproject.toml above {folder} would be found")
    return folder


def test_relay_help(relay_cli: Callable[..., Run]) -> None:
    """`relay --help` says what relay does and lists its commands, exit 0."""
    run = relay_cli("--help", cwd=REPO)
    assert run.code == 0
    text = " ".join(run.out.split())
    assert text.startswith("usage: relay ")
    assert "generate typed FutureMap classes" in text
    for command in ("generate", "demo", "bench"):
        assert f"\n    {command} " in run.out


def test_generate_help(relay_cli: Callable[..., Run]) -> None:
    """`relay generate --help` explains generation, --out, --check and the exit statuses, exit 0."""
    run = relay_cli("generate", "--help", cwd=REPO)
    assert run.code == 0
    text = " ".join(run.out.split())
    assert text.startswith("usage: relay generate ")
    for phrase in (
        "Generate one typed FutureMap module per schema module.",
        "[tool.relay] in the nearest pyproject.toml",
        "only files whose content changed are written",
        "--out DIR output folder",
        (
            "--check write nothing; exit 1 and list each generated file that is stale, "
            "hand-edited, missing or orphaned, with the fix"
        ),
        "--diff as --check, and print a unified diff",
        "--remove-orphans delete generated modules no schema produces",
        "--format {text,json}",
        (
            "exit status: 0 ok 1 drift found by --check or --diff 2 usage, configuration or write "
            "error (one line on stderr) 3 invalid schema,"
        ),
    ):
        assert phrase in text


def test_no_command_prints_help_and_exits_2(bare_folder: Path) -> None:
    """The installed `relay` with no command prints its help and exits 2."""
    run = run_relay_process(cwd=bare_folder)
    assert run.code == 2
    assert run.out.startswith("usage: relay ")
    assert "generate" in run.out and "--help" in run.out


def test_unknown_command_exits_2(
    relay_cli: Callable[..., Run], bare_folder: Path
) -> None:
    """A mistyped command is a usage error (exit 2) naming the valid commands."""
    run = relay_cli("generat", cwd=bare_folder)
    assert run.code == 2
    assert "invalid choice: 'generat'" in run.err
    assert "'generate'" in run.err


def test_generate_without_pyproject(
    relay_cli: Callable[..., Run], bare_folder: Path
) -> None:
    """With no pyproject.toml, `relay generate` says what to add or pass, and exits 2."""
    run = relay_cli("generate", cwd=bare_folder)
    assert run.code == 2
    assert run.out == ""
    assert run.err == (
        f"relay: error: no pyproject.toml at or above {bare_folder}; name the schemas and --out DIR "
        "on the command line, or add [tool.relay] with schemas and out to a pyproject.toml\n"
    )


def test_generate_without_tool_relay_section(
    relay_cli: Callable[..., Run], bare_folder: Path
) -> None:
    """A pyproject.toml lacking [tool.relay] gets the section to paste, and exit 2."""
    (bare_folder / "pyproject.toml").write_text('[project]\nname = "engine"\n')
    run = relay_cli("generate", "--check", cwd=bare_folder)
    assert run.code == 2
    assert run.err == (
        f"relay: error: {bare_folder / 'pyproject.toml'} has no [tool.relay] section; add one, "
        'e.g. [tool.relay] with schemas = ["schemas/*.py"] and out = "relay/maps", or name the '
        "schemas and --out DIR on the command line\n"
    )


def test_schema_without_out_and_without_config(
    relay_cli: Callable[..., Run], bare_folder: Path
) -> None:
    """Naming a schema but no --out, outside any configured project, is a usage error (exit 2)."""
    (bare_folder / "decode.py").write_text(
        (REPO / "relay" / "schemas" / "decode.py").read_text()
    )
    run = relay_cli("generate", "decode.py", cwd=bare_folder)
    assert run.code == 2
    assert run.err.startswith(
        f"relay: error: no pyproject.toml at or above {bare_folder}; "
    )
    assert "--out DIR" in run.err
    assert sorted(os.listdir(bare_folder)) == ["decode.py"]


IMPORT_PROBE = """\
import json, sys
import relay
import relay.maps.decode
import relay.maps.eagle
print(json.dumps(sorted(name for name in ("jinja2", "relay.codegen", "markupsafe")
                        if name in sys.modules)))
"""


def test_runtime_and_generated_maps_do_not_import_jinja2() -> None:
    """Importing relay and a generated map in a fresh process loads neither jinja2 nor relay.codegen."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
