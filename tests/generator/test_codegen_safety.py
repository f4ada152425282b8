"""relay generate never damages a file, never passes over a broken schema, and fails in one line."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from codegen_support import REPO, Project, Run, line_of, run_relay_process

from relay.codegen import files

PAIR = ("decode", "eagle")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (recursively) and its bytes."""
    if not folder.exists():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_one_line_error(run: Run, *needles: str) -> None:
    """Exit 2, nothing on stdout, one `relay: error:` line on stderr holding ``needles``."""
    assert run.code == 2, run
    assert run.out == ""
    assert run.err.count("\n") == 1 and run.err.startswith("relay: error: "), run.err
    assert "Traceback" not in run.err
    for needle in needles:
        assert needle in run.err, run.err


# --- files relay did not write ----------------------------------------------------------------


def test_out_folder_holding_schemas_is_refused(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """Generating into the folder of the schemas is refused (exit 2); the schema is untouched."""
    project.copy_bundled("decode")
    before = snapshot(project.schemas)
    run = relay_cli(
        "generate", "schemas/decode.py", "--out", "schemas", cwd=project.root
    )
    assert_one_line_error(
        run,
        "the output folder schemas holds schema modules (schemas/decode.py)",
        "choose another --out",
    )
    assert snapshot(project.schemas) == before


def test_configured_out_holding_schemas_is_refused(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """[tool.relay] out naming the schemas folder is refused too, under --check as well."""
    project.copy_bundled("decode")
    pyproject = project.root / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('out = "maps"', 'out = "schemas"')
    )
    before = snapshot(project.schemas)
    for args in (("generate",), ("generate", "--check")):
        assert_one_line_error(
            relay_cli(*args, cwd=project.root), "holds schema modules"
        )
    assert snapshot(project.schemas) == before


@pytest.mark.parametrize("check", [False, True])
def test_file_without_relay_header_is_never_overwritten(
    project: Project, relay_cli: Callable[..., Run], check: bool
) -> None:
    """A hand-written module where a map would go: exit 2 naming it and the fix; it survives."""
    project.copy_bundled(*PAIR)
    project.maps.mkdir()
    (project.maps / "decode.py").write_text("# my own decode helpers\nX = 1\n")
    before = snapshot(project.maps)
    run = relay_cli("generate", *(["--check"] if check else []), cwd=project.root)
    assert_one_line_error(
        run,
        "maps/decode.py exists and relay did not generate it",
        "move it away, or choose another --out",
    )
    assert snapshot(project.maps) == before, "nothing written, eagle.py included"


def test_orphans_are_reported_and_removed_only_on_request(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """A generated module whose schema is gone is named by `relay generate`, deleted by
    --remove-orphans; a hand-written module beside it is never touched."""
    project.copy_bundled(*PAIR)
    assert relay_cli("generate", cwd=project.root).code == 0
    (project.schemas / "eagle.py").unlink()
    (project.maps / "helpers.py").write_text("X = 1\n")
    run = relay_cli("generate", "-q", cwd=project.root)
    assert (run.code, run.out) == (0, "")
    assert run.err == (
        "relay: warning: maps/eagle.py is orphaned: no schema generates it "
        "any more; delete it, or run `relay generate --remove-orphans`\n"
    )
    assert (project.maps / "eagle.py").exists()

    run = relay_cli("generate", "--remove-orphans", cwd=project.root)
    assert run.code == 0, run.err
    assert "removed maps/eagle.py" in run.out
    assert sorted(p.name for p in project.maps.iterdir()) == ["decode.py", "helpers.py"]


def test_remove_orphans_with_check_is_a_usage_error(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """--remove-orphans writes and --check does not: together they are refused (exit 2)."""
    project.copy_bundled("decode")
    assert_one_line_error(
        relay_cli("generate", "--check", "--remove-orphans", cwd=project.root),
        "use one or the other",
    )


# --- schema modules that end the import -------------------------------------------------------

ENDINGS = {
    "exit_zero": "raise SystemExit(0)\n",
    "sys_exit": "import sys\nsys.exit()\n",
    "base_exception": "class Stop(BaseException):\n    pass\n\n\nraise Stop('no')\n",
    "getattr_raises": (
        "def __getattr__(name):\n    raise RuntimeError(f'no {name}')\n"
    ),
}


@pytest.mark.parametrize("stem", sorted(ENDINGS))
def test_schema_import_that_ends_is_exit_3_under_generate_and_check(
    project: Project, relay_cli: Callable[..., Run], stem: str
) -> None:
    """However a schema import ends, generate and --check both exit 3 with a located error,
    even over up-to-date maps of other schemas."""
    project.copy_bundled("decode")
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    path = project.write_schema(stem, ENDINGS[stem])
    for args in (("generate",), ("generate", "--check")):
        run = relay_cli(*args, cwd=project.root)
        assert run.code == 3, run
        first = run.err.splitlines()[0]
        assert first.startswith(f"schemas/{stem}.py:"), first
        assert ": error: the schema module " in first
        assert run.err.endswith("(nothing was written)\n")
    if stem == "exit_zero":
        assert first == (
            f"schemas/{stem}.py:{line_of(path, 'SystemExit')}: error: the schema "
            "module ended the process while importing (SystemExit(0))"
        )


def test_exit_inside_schema_module_in_a_real_process(project: Project) -> None:
    """The installed command, not only the in-process runner: `--check` exits 3 for a schema
    that runs `raise SystemExit(0)`."""
    project.write_schema("quits", ENDINGS["exit_zero"])
    run = run_relay_process("generate", "--check", cwd=project.root)
    assert run.code == 3, run
    assert "SystemExit(0)" in run.err


def test_mistyped_enum_keeps_pythons_hint(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """`Lane.FORWRAD` is reported with Python's own "Did you mean: 'FORWARD'?"."""
    path = project.schema_module(
        "typo",
        ['Field("tokens", lane=Lane.FORWRAD, dtype=torch.int64, target="input_ids"),'],
    )
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 3
    first = run.err.splitlines()[0]
    assert first.startswith(
        f"schemas/typo.py:{line_of(path, 'FORWRAD')}: error: the schema "
        "module failed to import: AttributeError: "
    )
    assert first.endswith("FORWRAD. Did you mean: 'FORWARD'?")


def test_schema_file_name_that_is_not_a_module_name(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """`my-relay.py` would generate a module nobody can import: exit 3 with the rename."""
    project.copy_bundled("decode")
    (project.schemas / "decode.py").rename(project.schemas / "my-relay.py")
    run = relay_cli("generate", cwd=project.root)
    assert run.code == 3
    assert run.err.splitlines()[:2] == [
        (
            "schemas/my-relay.py: error: its generated module would be my-relay.py, a name Python "
            "cannot import"
        ),
        "    fix: rename the schema module, e.g. to my_relay.py",
    ]
    assert not project.maps.exists()


# --- write failures: one line, exit 2, all or nothing -----------------------------------------


def _three(project: Project) -> None:
    project.copy_bundled("decode", "eagle", "eagle_dsa")


def test_file_where_the_out_folder_should_be(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """`maps` is a file: one line naming it, exit 2, and the file is left as it was."""
    _three(project)
    project.maps.write_text("not a folder\n")
    run = relay_cli("generate", cwd=project.root)
    assert_one_line_error(
        run, "cannot write maps/decode.py: a file stands where its folder should be"
    )
    assert project.maps.read_text() == "not a folder\n"


def test_folder_where_a_module_should_be_writes_nothing(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """The third module's path is a folder: exit 2, and the first two are not written either."""
    _three(project)
    (project.maps / "eagle_dsa.py").mkdir(parents=True)
    run = relay_cli("generate", cwd=project.root)
    assert_one_line_error(run, "cannot write maps/eagle_dsa.py: it is a folder")
    assert sorted(os.listdir(project.maps)) == ["eagle_dsa.py"]


def test_full_disk_on_the_third_module_writes_nothing(
    project: Project, relay_cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails on the third module leaves the first two as they were; no temp files."""
    _three(project)
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    for stem in ("decode", "eagle", "eagle_dsa"):
        source = project.schemas / f"{stem}.py"
        source.write_text(source.read_text().replace('doc="""', 'doc="""Changed. ', 1))
    before = snapshot(project.maps)
    real = files._write_fd
    calls: list[int] = []

    def fill_up(fd: int, data: bytes) -> None:
        calls.append(fd)
        if len(calls) == 3:
            os.close(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(files, "_write_fd", fill_up)
    run = relay_cli("generate", cwd=project.root)
    assert_one_line_error(
        run, "cannot write maps/eagle_dsa.py: No space left on device"
    )
    assert len(calls) == 3
    assert snapshot(project.maps) == before


def test_failed_rename_puts_back_what_earlier_renames_replaced(
    project: Project, relay_cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the second rename fails, the first renamed module gets its old bytes back."""
    _three(project)
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    for stem in ("decode", "eagle"):
        source = project.schemas / f"{stem}.py"
        source.write_text(source.read_text().replace('doc="""', 'doc="""Changed. ', 1))
    before = snapshot(project.maps)
    real = os.replace
    calls: list[object] = []

    def flaky(src: str, dst: str) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    run = relay_cli("generate", cwd=project.root)
    assert_one_line_error(run, "cannot write maps/eagle.py: Input/output error")
    assert snapshot(project.maps) == before


def test_read_only_folder(
    project: Project, relay_cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder that refuses new files (simulated: tests may run as root): one line, exit 2."""
    _three(project)
    project.maps.mkdir()

    def refuse(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(files, "_open_temp", refuse)
    run = relay_cli("generate", cwd=project.root)
    assert_one_line_error(run, "cannot write maps/decode.py: Permission denied")
    assert os.listdir(project.maps) == []


def test_longest_legal_module_name_is_written(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """A module name at the file system's limit is written: the temp name does not grow with it
    (a name that is legal until a temp suffix is added used to fail)."""
    project.copy_bundled("decode")
    limit = os.pathconf(project.root, "PC_NAME_MAX")
    stem = "d" * (limit - 3)
    (project.schemas / "decode.py").rename(project.schemas / f"{stem}.py")
    run = relay_cli("generate", "-q", cwd=project.root)
    assert (run.code, run.err) == (0, "")
    assert os.listdir(project.maps) == [f"{stem}.py"]


# --- drift kinds, the header, the output formats ------------------------------------------------


def test_header_command_is_the_same_however_the_module_was_generated(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """A module of a [tool.relay] schema generated by naming it is byte-identical to
    `relay generate`'s, so `--check` passes; outside the configuration it names its command."""
    project.copy_bundled(*PAIR)
    run = relay_cli(
        "generate", "-q", "schemas/decode.py", "--out", "maps", cwd=project.root
    )
    assert run.code == 0, run.err
    assert (project.maps / "decode.py").read_text().splitlines()[1] == (
        "# Regenerate with: relay generate"
    )
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    assert relay_cli("generate", "--check", cwd=project.root).code == 0

    run = relay_cli(
        "generate", "-q", "schemas/decode.py", "--out", "elsewhere", cwd=project.root
    )
    assert run.code == 0, run.err
    assert (project.root / "elsewhere" / "decode.py").read_text().splitlines()[1] == (
        "# Regenerate with: relay generate schemas/decode.py --out elsewhere"
    )


def test_header_edit_is_named_as_such(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """Only the header's command differs: the drift says the header names another command."""
    project.copy_bundled("decode")
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    target = project.maps / "decode.py"
    target.write_text(
        target.read_text().replace(
            "# Regenerate with: relay generate\n", "# Regenerate with: make maps\n"
        )
    )
    run = relay_cli("generate", "--check", cwd=project.root)
    assert run.code == 1
    assert run.err.splitlines()[1] == (
        "  maps/decode.py: stale (its header names another schema path or command)"
    )
    assert (
        "with `make maps`, not from schemas/decode.py with `relay generate`" in run.err
    )


def test_check_quiet_prints_only_the_problems(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """`--check -q`: nothing when up to date; on drift the summary lines, never the diff."""
    project.copy_bundled("decode")
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    assert relay_cli("generate", "--check", "-q", cwd=project.root) == Run(0, "", "")
    (project.maps / "decode.py").unlink()
    run = relay_cli("generate", "--check", "-q", cwd=project.root)
    assert (run.code, run.out) == (1, "")
    assert run.err.splitlines()[:2] == [
        "relay: 1 generated file(s) out of date:",
        "  maps/decode.py: missing",
    ]


def test_diff_alone_checks_and_shows_the_diff(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """`--diff` writes nothing, prints the unified diff on stdout and exits 1 on drift."""
    project.copy_bundled("decode")
    run = relay_cli("generate", "--diff", cwd=project.root)
    assert run.code == 1
    assert run.out.startswith(
        "--- maps/decode.py (on disk)\n+++ maps/decode.py (generated)\n"
    )
    assert not project.maps.exists()


def test_check_json_for_drift(project: Project, relay_cli: Callable[..., Run]) -> None:
    """`--check --format json` prints one JSON object naming each drifted file and its kind."""
    project.copy_bundled(*PAIR)
    assert relay_cli("generate", "-q", cwd=project.root).code == 0
    (project.maps / "decode.py").unlink()
    eagle = project.maps / "eagle.py"
    eagle.write_text(eagle.read_text() + "# edited\n")
    run = relay_cli("generate", "--check", "--format", "json", cwd=project.root)
    assert (run.code, run.err) == (1, "")
    report = json.loads(run.out)
    assert {k: report[k] for k in ("version", "mode", "status", "exit_code")} == {
        "version": 1,
        "mode": "check",
        "status": "drift",
        "exit_code": 1,
    }
    assert [(f["path"], f["kind"]) for f in report["files"]] == [
        ("maps/decode.py", "missing"),
        ("maps/eagle.py", "hand-edited"),
    ]
    assert all(f["fix"] for f in report["files"]) and "diff" not in report["files"][0]
    run = relay_cli("generate", "--diff", "--format", "json", cwd=project.root)
    report = json.loads(run.out)
    assert report["files"][1]["diff"].endswith("-# edited\n")


def test_check_json_for_invalid_schema(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """An invalid schema under `--check --format json`: exit 3, each problem with path and line."""
    path = project.schema_module(
        "bad", ['Field("tokens", lane="forward", dtype=torch.int64),']
    )
    run = relay_cli("generate", "--check", "--format", "json", cwd=project.root)
    assert run.code == 3
    report = json.loads(run.out)
    assert report["status"] == "invalid-schema"
    (problem,) = report["problems"]
    assert problem == {
        "path": "schemas/bad.py",
        "line": line_of(path, '"tokens"'),
        "schema": "BadFutureMap",
        "field": "tokens",
        "message": "lane must be Lane.FORWARD or Lane.SCHEDULE (got 'forward' that is a str)",
        "fix": "write lane=Lane.FORWARD (stashed for the next forward) or lane=Lane.SCHEDULE "
        "(published for the scheduler)",
    }


def test_json_for_a_usage_error(relay_cli: Callable[..., Run], tmp_path: Path) -> None:
    """A configuration error under --format json: exit 2, the line on stderr, JSON on stdout."""
    run = relay_cli("generate", "--check", "--format", "json", cwd=tmp_path)
    assert run.code == 2
    assert run.err.startswith("relay: error: ")
    report = json.loads(run.out)
    assert (report["status"], report["exit_code"]) == ("error", 2)


def test_generate_cli_module_imports_no_pipeline() -> None:
    """Importing `relay.codegen.cli` (what `relay --help` needs) loads neither jinja2 nor the
    pipeline; they are imported when `relay generate` runs."""
    probe = (
        "import json, sys\nimport relay.codegen.cli\nprint(json.dumps(sorted(n for n in "
        "('jinja2', 'relay.codegen.api', 'relay.codegen.render') if n in sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_hostile_value_that_exits_during_validation(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """A declared value whose repr ends the process cannot turn --check green: exit 3, located."""
    path = project.write_schema(
        "hostile",
        """\
        import torch

        from relay.schema import Field, Lane, Schema


        class Sneaky:
            def __repr__(self):
                raise SystemExit(0)


        SCHEMA = Schema(
            name="HostileFutureMap",
            fields=[Field("x", lane=Lane.FORWARD, dtype=Sneaky())],
        )
    """,
    )
    run = relay_cli("generate", "--check", cwd=project.root)
    assert run.code == 3, run
    assert run.err.startswith(
        f"schemas/hostile.py:{line_of(path, 'SCHEMA = Schema(')}: error: "
        "the schema could not be validated: SystemExit: 0"
    )


def test_generator_source_never_spells_the_generated_marker() -> None:
    """No file of the generator holds the whole `@generated` marker, so tools that skip
    generated files (by that marker) never skip the generator itself."""
    marker = "@" + "generated"
    sources = sorted((REPO / "relay" / "codegen").rglob("*"))
    holders = [
        p.relative_to(REPO).as_posix()
        for p in sources
        if p.is_file()
        and p.suffix in (".py", ".jinja")
        and marker in p.read_text(encoding="utf-8")
    ]
    assert holders == []


def test_schema_that_prints_keeps_json_output_clean(
    project: Project, relay_cli: Callable[..., Run]
) -> None:
    """What a schema module prints while imported goes to stderr, so stdout stays pure JSON."""
    project.copy_bundled("decode")
    path = project.schemas / "decode.py"
    path.write_text('print("loading decode")\n' + path.read_text())
    run = relay_cli("generate", "--check", "--format", "json", cwd=project.root)
    assert run.code == 1
    assert json.loads(run.out)["status"] == "drift"
    assert run.err == "loading decode\n"
