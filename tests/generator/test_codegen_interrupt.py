"""A run interrupted at any point leaves no temp file and every target as it was (or, once
every rename is done, all of them written): Note [Interrupted writes] in codegen/files.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from codegen_support import REPO, Project

from relay.codegen import explicit_job, run_job
from relay.codegen.api import Job
from relay.codegen.files import WriteError

STEMS = ("decode", "eagle", "eagle_dsa")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` (temp files included) and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _edited_project(project: Project) -> tuple[Job, dict[str, bytes], dict[str, bytes]]:
    """Three maps generated, then every schema edited and a fourth schema added: the job
    that rewrites three targets and creates one, the maps before it and the maps after."""
    project.copy_bundled(*STEMS)
    job = explicit_job([project.schemas / f"{s}.py" for s in STEMS], project.maps)
    run_job(job)
    before = snapshot(project.maps)
    decode = project.schemas / "decode.py"
    decode.write_text(decode.read_text().replace('doc="""', 'doc="""Edited. ', 1))
    eagle = project.schemas / "eagle.py"  # a field eagle_dsa.py builds on
    eagle.write_text(eagle.read_text().replace("Guard.POSITIVE", "Guard.NON_NEGATIVE"))
    project.copy_bundled("decode_seq_lens")
    job = explicit_job(
        [project.schemas / f"{s}.py" for s in (*STEMS, "decode_seq_lens")],
        project.maps,
    )
    twin = (
        project.root.parent / "twin"
    )  # the same project, generated without interrupts
    shutil.copytree(project.root, twin)
    run_job(
        explicit_job([twin / "schemas" / p.name for p in job.schemas], twin / "maps")
    )
    after = snapshot(twin / "maps")
    assert set(after) == {*before, "decode_seq_lens.py"}
    assert [n for n in before if before[n] != after[n]] == [
        "decode.py",
        "eagle.py",
        "eagle_dsa.py",  # its base, eagle.py, changed: so did it
    ]
    return job, before, after


class Interrupt:
    """Patches ``owner.name`` so that its k-th call raises KeyboardInterrupt, before the
    call (``after=False``) or once the call has done its work (``after=True``)."""

    def __init__(self, owner: object, name: str, k: int, *, after: bool) -> None:
        self.real: Callable[..., object] = getattr(owner, name)
        self.k = k
        self.after = after
        self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        if self.calls == self.k and not self.after:
            raise KeyboardInterrupt
        result = self.real(*args, **kwargs)
        if self.calls == self.k:
            raise KeyboardInterrupt
        return result


POINTS = [
    (os, "open"),
    (os, "fchmod"),
    (os, "fdopen"),
    (os, "replace"),
]


@pytest.mark.parametrize("after", [False, True], ids=["before-call", "after-call"])
@pytest.mark.parametrize(
    ("owner", "name"), POINTS, ids=[f"{o.__name__}.{n}" for o, n in POINTS]
)
def test_keyboard_interrupt_at_every_call_restores_every_target(
    project: Project,
    monkeypatch: pytest.MonkeyPatch,
    owner: object,
    name: str,
    after: bool,
) -> None:
    """KeyboardInterrupt at the k-th open/fchmod/fdopen/replace, for every k: no temp
    file is left and every map is byte-identical to before; past the last call, all are new."""
    job, before, after_run = _edited_project(project)
    k = 1
    while True:
        interrupt = Interrupt(owner, name, k, after=after)
        monkeypatch.setattr(owner, name, interrupt)
        try:
            run_job(job)
        except KeyboardInterrupt:
            monkeypatch.undo()
            assert snapshot(project.maps) == before, f"interrupted at call {k}"
            k += 1
            continue
        monkeypatch.undo()
        break
    assert k > 4, "the interrupt reached every file"
    assert snapshot(project.maps) == after_run


def test_failed_rename_is_rolled_back_and_leaves_no_temp(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename that fails with OSError is rolled back and reported; no temp file remains."""
    job, before, _ = _edited_project(project)
    real = os.replace
    calls = []

    def replace(src: object, dst: object) -> None:
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(WriteError, match="No space left on device"):
        run_job(job)
    monkeypatch.undo()
    assert snapshot(project.maps) == before


def test_run_on_another_thread_is_cleaned_up_too(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off the main thread no handler can be installed: an interrupt there is still
    cleaned up, and the process's own handlers are left alone."""
    job, before, _ = _edited_project(project)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(os, "replace", Interrupt(os, "replace", 2, after=False))
    caught: list[BaseException] = []

    def work() -> None:
        try:
            run_job(job)
        except BaseException as error:
            caught.append(error)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    monkeypatch.undo()
    assert [type(e) for e in caught] == [KeyboardInterrupt]
    assert snapshot(project.maps) == before
    assert {s: signal.getsignal(s) for s in handlers} == handlers


# --- real signals, sent by the test at a gate it controls -------------------------------------

CHILD = textwrap.dedent(
    """
    import os
    import signal
    import sys

    from relay import cli

    # Ctrl-C as a terminal delivers it: a test run started with SIGINT ignored
    # (nohup ... &, some CI wrappers) would otherwise pass the ignore on to this child.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    gate, k = sys.argv[1], int(sys.argv[2])
    real = getattr(os, gate)
    calls = 0


    def gated(*args, **kwargs):
        global calls
        calls += 1
        if calls == k:
            print("ready", flush=True)  # the test sends its signal now ...
            sys.stdin.readline()  # ... and then lets the run go on
        return real(*args, **kwargs)


    setattr(os, gate, gated)
    sys.exit(cli.main(["generate", *sys.argv[3:]]))
    """
)


def _run_child(
    project: Project, job: Job, gate: str, k: int, signum: int, *, write: bool = True
) -> subprocess.CompletedProcess[str]:
    script = project.root / "child.py"
    if write:
        script.write_text(CHILD)
    args = [str(p.relative_to(project.root)) for p in job.schemas]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(script), gate, str(k), *args, "--out", "maps", "-q"],
        cwd=project.root,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signum)
    out, err = proc.communicate("go\n", timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_signal_while_staging_writes_nothing(project: Project, signum: int) -> None:
    """SIGTERM or SIGINT while the second temp file is written: the run stops at once
    (killed by SIGTERM as usual, exit 130 on SIGINT), no temp file, every map as before."""
    job, before, _ = _edited_project(project)
    done = _run_child(project, job, "fchmod", 2, signum)
    if signum == signal.SIGTERM:
        assert done.returncode == -signal.SIGTERM, done.stderr
    else:
        assert (done.returncode, done.stderr) == (130, "relay: interrupted\n")
    assert snapshot(project.maps) == before


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_signal_while_renaming_waits_for_the_last_rename(
    project: Project, signum: int
) -> None:
    """SIGTERM or SIGINT between two renames is held until every rename is done, then
    stops the run as usual: no temp file, every map written, none half-way."""
    job, _, after = _edited_project(project)
    done = _run_child(project, job, "replace", 2, signum)
    if signum == signal.SIGTERM:
        assert done.returncode == -signal.SIGTERM, done.stderr
    else:
        assert (done.returncode, done.stderr) == (130, "relay: interrupted\n")
    assert snapshot(project.maps) == after


HANDLERS = {
    "ignored": "signal.signal(signal.SIGTERM, signal.SIG_IGN)",
    "returns": "signal.signal(signal.SIGTERM, lambda signum, frame: print('noted'))",
}


@pytest.mark.parametrize("handler", sorted(HANDLERS))
def test_a_process_with_its_own_sigterm_handler(project: Project, handler: str) -> None:
    """A process that ignores SIGTERM finishes the run; one whose handler returns gets
    the signal delivered to it, and the stopped run is a one-line write error (exit 2)."""
    job, before, after = _edited_project(project)
    child = project.root / "child.py"
    child.write_text(
        CHILD.replace(
            "\nfrom relay import cli\n",
            "\n" + "import signal\n" + HANDLERS[handler] + "\nfrom relay import cli\n",
            1,
        )
    )
    assert HANDLERS[handler] in child.read_text()
    done = _run_child(project, job, "fchmod", 2, signal.SIGTERM, write=False)
    if handler == "ignored":
        assert done.returncode == 0, done.stderr
        assert snapshot(project.maps) == after
    else:
        assert done.returncode == 2, done.stderr
        assert done.stdout == "noted\n"  # after "ready", which _run_child read
        assert done.stderr == (
            "relay: error: interrupted by SIGTERM before any generated file was "
            "replaced; nothing was written\n"
        )
        assert snapshot(project.maps) == before
