"""relay and its tests leave the temporary folder as they found it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest
import torch

from relay import Field, Lane, Resolve, Schema
from relay.testing import load_map_class

REPO = Path(__file__).resolve().parents[2]

#: Tests that make every kind of temporary folder relay makes: the lockstep harness's
#: map classes (at import and inside tests), the demo's private maps and its trace
#: folder, the data-parallel ranks' rendezvous folder, and generation interrupted by
#: a signal in a child process.
REPRESENTATIVE = [
    "tests/runtime/test_late_bindings.py",
    "tests/runtime/test_debug_seeds.py",
    "tests/cli/test_demo.py::test_demo_never_touches_the_callers_project",
    "tests/cli/test_plot.py::test_demo_writes_a_trace_and_a_timeline",
    "tests/engine/test_engine.py::test_data_parallel_two_ranks_match_one",
    "tests/generator/test_codegen_interrupt.py::test_signal_while_staging_writes_nothing",
]

SCHEMA = Schema(
    name="TempProbeMap",
    doc="A map for the temporary-folder test.",
    fields=[
        Field(
            "tokens",
            lane=Lane.FORWARD,
            dtype=torch.int64,
            source="next_token_ids",
            target="input_ids",
            resolve=Resolve.PLACEHOLDER,
            doc="Sampled tokens.",
        )
    ],
    indices="req_pool_indices",
)


def test_load_map_class_writes_no_file_and_keeps_its_source_for_tracebacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lockstep harness's map class is compiled from memory: nothing appears in the
    temporary folder, and a traceback through the class still shows its source lines."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cls = load_map_class(SCHEMA)
    assert list(tmp_path.iterdir()) == []
    relay = cls("cpu", pool_size=4)
    with pytest.raises(Exception) as caught:
        relay.stash(torch.tensor([1, 2]), "not a payload")
    frames = traceback.extract_tb(caught.value.__traceback__)
    generated = [f for f in frames if f.filename == "<relay.testing TempProbeMap>"]
    assert generated and all(f.line for f in generated)


@pytest.mark.slow
def test_a_test_run_leaves_the_temporary_folder_as_it_found_it(tmp_path: Path) -> None:
    """A run of the representative tests, with a temporary folder of its own (pytest's
    own ``tmp_path`` folders go elsewhere, under ``--basetemp``), leaves nothing of
    relay's or its tests' there."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'pytest'}",
            *REPRESENTATIVE,
        ],
        cwd=REPO,
        # The inner run makes (and removes) its own torch compiler cache folder.
        env={
            **{k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"},
            "TMPDIR": str(temp),
        },
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "passed" in done.stdout and "skipped" not in done.stdout, done.stdout
    assert sorted(p.name for p in temp.iterdir()) == []
