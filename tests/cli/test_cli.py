"""The ``relay`` command: help without torch, ``python -m relay``, exit statuses, pipes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import relay
from relay.cli import Exit, main

REPO = Path(__file__).resolve().parents[2]


def _relay(
    *args: str, stdout: int | None = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """``python -m relay ARGS`` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "relay", *args],
        check=False,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
    )


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has imported after running ``code``."""
    probe = (
        f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write(' '.join(sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(done.stderr.split())


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["generate", "--help"]])
def test_help_and_version_do_not_import_torch(argv: list[str]) -> None:
    """``relay --help``, ``--version`` and ``generate --help`` answer without importing torch."""
    modules = _modules_after(f"from relay.cli import main; main({argv!r})")
    assert "relay.cli" in modules
    assert "torch" not in modules
    assert "rich" not in modules


def test_vocabulary_is_importable_from_the_package_lazily() -> None:
    """``import relay`` imports no torch; ``from relay import Field`` still works."""
    assert "torch" not in _modules_after("import relay")
    assert "torch" in _modules_after("from relay import Field")
    from relay import Field, Lane, RelayError
    from relay.errors import RelayError as Home
    from relay.schema import Field as SchemaField

    assert (
        Field is SchemaField and RelayError is Home and Lane.FORWARD.name == "FORWARD"
    )
    with pytest.raises(AttributeError, match="has no attribute 'Feild'"):
        relay.Feild  # noqa: B018


def test_python_dash_m_relay_is_the_command() -> None:
    """``python -m relay --version`` prints the version, exit 0."""
    done = _relay("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"relay {relay.__version__}"


def test_no_command_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """``relay`` alone prints the help and exits 2; an unknown command too."""
    assert main([]) == Exit.USAGE
    assert "generate" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == Exit.USAGE


def test_help_lists_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    """``relay --help`` documents every exit status."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for status in (
        "0 ok",
        "1 generated files drifted",
        "2 bad usage",
        "3 invalid schema",
    ):
        assert status in out


def test_closed_pipe_ends_quietly() -> None:
    """``relay demo | head``: a reader that closed its end, no traceback, exit 141."""
    read, write = os.pipe()
    os.close(read)  # like `head` after it has read what it wanted
    try:
        done = _relay(
            "demo", "--model", "tiny", "--requests", "4", "--repeat", "1", stdout=write
        )
    finally:
        os.close(write)
    assert done.returncode == Exit.BROKEN_PIPE
    assert done.stderr == ""


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(),
    reason="checks the message where CUDA is missing",
)
def test_demo_on_missing_cuda_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``relay demo --device cuda`` without CUDA: one line naming the fix, exit 2."""
    assert main(["demo", "--device", "cuda"]) == Exit.USAGE
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "CUDA is not available" in lines[0] and "--device cpu" in lines[0]
    assert captured.out == ""


def test_demo_unusable_device_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--device tpu`` (checked by torch): exit 2, one error line, no traceback."""
    assert main(["demo", "--device", "tpu"]) == Exit.USAGE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("relay demo: error: --device"), err


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (so that ``sys.modules`` starts empty)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--requests", "0"], "argument --requests: expected a whole number >= 1"),
        (
            ["--abort-share", "1.5"],
            "argument --abort-share: expected a share in [0, 1]",
        ),
        (["--mode", "foo"], "argument --mode: invalid choice: 'foo'"),
        (["--repeat", "x"], "argument --repeat: expected a whole number >= 1"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_demo_flag_is_one_line_before_torch(argv: list[str], says: str) -> None:
    """A bad flag value: one line naming the flag on stderr, exit 2, and torch never
    imported (it takes seconds, more on a busy machine)."""
    done = _python(
        "import sys\nfrom relay.cli import main\ntry:\n"
        f"    main({['demo', *argv]!r})\n"
        "except SystemExit as stop:\n    print(stop.code, 'torch' in sys.modules)\n"
    )
    assert done.stdout.split() == ["2", "False"], done.stderr
    err = done.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith(f"relay demo: error: {says}"), err
    assert "`relay demo --help` lists the flags" in err[0]


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--device", "tpu", "--device 'tpu': the reference engine runs on cpu, cuda"),
        ("--device", "cuda:x", "--device 'cuda:x'"),
        ("--trace", ".", "--trace .: is a folder; name a file in it"),
        ("--plot", ".", "--plot .: is a folder; name a file in it"),
        ("--json", ".", "--json .: is a folder; name a file in it"),
    ],
)
def test_a_bad_device_or_a_folder_as_output_is_refused_before_torch(
    flag: str, value: str, says: str
) -> None:
    """A device the demo cannot run on, or a folder where a file is to be written:
    one line, exit 2, and torch never imported."""
    done = _python(
        "import sys\nfrom relay.cli import main\n"
        f"print(main({['demo', flag, value]!r}), 'torch' in sys.modules)\n"
    )
    assert done.stdout.split() == ["2", "False"], done.stderr
    err = done.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith(f"relay demo: error: {says}"), err


def test_demo_help_speaks_to_users(capsys: pytest.CaptureFixture[str]) -> None:
    """``relay demo --help`` opens with what the demo shows, in words for its users:
    no module names or markup."""
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    description = out.split("\n\n", 2)[1]
    assert description.startswith("Watch overlap scheduling work:")
    assert "``" not in out and "relay.engine" not in out and "library" not in out


def test_demo_without_the_generate_extra_refuses_before_torch() -> None:
    """jinja2 missing: ``relay demo`` says which extra to install before importing torch."""
    done = _python(
        "import sys\nsys.modules['jinja2'] = None\nfrom relay.cli import main\n"
        "print(main(['demo']), 'torch' in sys.modules)\n"
    )
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert done.stderr.startswith(
        "relay demo: needs the generate extra (jinja2 missing)"
    )


def test_sigterm_removes_the_demos_temporary_folder() -> None:
    """SIGTERM mid-run cleans up as Ctrl-C does: the private folder and its generated
    modules are gone, one line on stderr, exit 143. The signal is sent once the demo
    says it runs the engine (a gate on its output, not a sleep)."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "relay", "demo", "--model", "tiny", "--repeat", "999"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert demo.stdout is not None
    folder = None
    for line in demo.stdout:
        if "into a private folder, " in line:
            folder = Path(line.split("into a private folder, ")[1].strip())
        if line.startswith("3. run the engine"):
            break
    assert folder is not None and len(list(folder.glob("*.py"))) == 4
    demo.send_signal(signal.SIGTERM)
    _, err = demo.communicate(timeout=300)
    assert demo.returncode == Exit.TERMINATED == 143
    assert err == "relay: terminated\n"
    assert not folder.exists()


def test_readme_quickstart_output_is_what_the_example_prints() -> None:
    """The README's quickstart output is exactly what ``examples/quickstart.py`` prints."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    after = readme.split("(`.venv/bin/python examples/quickstart.py`", 1)[1]
    shown = after.split("```\n", 2)[1]
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "quickstart.py")],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout == shown


def test_every_command_reports_with_one_set_of_exit_statuses() -> None:
    """``generate`` and ``bench`` return the members of ``relay.cli.status.Exit``."""
    from relay.bench import main as bench
    from relay.codegen import cli as generate

    assert generate.EXIT_DRIFT is Exit.DRIFT is Exit.FAILED
    assert generate.EXIT_INVALID_SCHEMA is Exit.INVALID_SCHEMA
    assert generate.EXIT_USAGE is bench.EXIT_USAGE is Exit.USAGE
    assert bench.EXIT_FAILED is Exit.FAILED


def test_the_engine_imports_nothing_from_the_cli() -> None:
    """``relay.engine`` is a library: no module of it imports ``relay.cli``, even lazily."""
    import ast

    for path in sorted((REPO / "relay" / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith("relay.cli"), f"{path.name} imports {name}"


@pytest.mark.parametrize(
    ("command", "missing"),
    [("generate", "jinja2"), ("demo", "rich"), ("bench", "rich")],
)
def test_a_command_without_the_generate_extra_says_what_to_install(
    command: str,
    missing: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without the ``generate`` extra (here: one module of it missing) every command
    prints one line naming the extra and exits 2."""
    monkeypatch.setitem(sys.modules, missing, None)
    assert main([command]) == Exit.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"relay {command}: needs the generate extra ({missing} missing)"
    )
    assert "pip install 'relay-futuremap[generate]'" in err


def test_commands_on_committed_maps_need_no_formatter(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where ruff is missing (a GPU machine's image), the bench and the demo on the
    committed maps get past the extra's check; generating does not."""
    monkeypatch.setitem(sys.modules, "ruff", None)
    monkeypatch.delenv("RELAY_RUFF", raising=False)
    assert main(["bench", "--schema", "nothing"]) == Exit.USAGE
    assert "generate extra" not in capsys.readouterr().err
    assert main(["demo", "--no-generate", "--device", "nosuch"]) == Exit.USAGE
    assert "generate extra" not in capsys.readouterr().err
    assert main(["generate"]) == Exit.USAGE
    assert "(ruff missing)" in capsys.readouterr().err


_BLOCK_GENERATOR = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('jinja2', 'ruff', 'rich', 'tomli'):
            raise ImportError(f'{name} is blocked: the runtime must not import it')
sys.meta_path.insert(0, Block())
"""


def test_the_runtime_and_every_bundled_map_need_no_generator_dependency() -> None:
    """With jinja2, ruff, rich and tomli unimportable, ``relay``, ``relay.runtime`` and
    every bundled map import, and a map stashes and resolves."""
    maps = sorted(p.stem for p in (REPO / "relay" / "maps").glob("*.py"))
    code = _BLOCK_GENERATOR + (
        "import importlib, torch, relay, relay.runtime\n"
        f"for name in {maps!r}:\n"
        "    importlib.import_module('relay.maps.' + name)\n"
        "from relay.maps.decode import DecodeFutureMap, DecodePayload\n"
        "m = DecodeFutureMap('cpu', 8)\n"
        "slots = torch.tensor([3, 5])\n"
        "m.stash(slots, DecodePayload(next_token_ids=torch.tensor([7, 9])))\n"
        "class Batch:\n"
        "    req_pool_indices = slots\n"
        "    input_ids = torch.zeros(2, dtype=torch.int64)\n"
        "b = Batch()\n"
        "m.resolve_future(b)\n"
        "print(b.input_ids.tolist())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[7, 9]"
