"""scripts/gpu_check.sh's steps, checked on the CPU (not ``gpu``-marked): the script
parses, every step it lists exists, the steps' selections name real tests, and the
python it runs works here (``gpu_overlap.py --dry-run``, ``gpu_figures.py``); the demo's
CUDA default is the GPU-sized configuration over CUDA graphs."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relay.cli import demo

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _steps() -> list[str]:
    """The step names of the script's STEPS table, in order."""
    text = SCRIPT.read_text()
    table = re.search(r"^STEPS=\(\n(.*?)^\)", text, re.DOTALL | re.MULTILINE)
    assert table is not None, "no STEPS=( ... ) table in gpu_check.sh"
    return re.findall(r"^\s+([a-z-]+) \d+$", table.group(1), re.MULTILINE)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_parses() -> None:
    """``bash -n`` reads the whole script without a syntax error."""
    run = subprocess.run(
        ["bash", "-n", str(SCRIPT)], check=False, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def test_every_listed_step_is_defined_and_exported() -> None:
    """Each step of STEPS has its ``step_<name>`` function, exported to the step's bash."""
    text = SCRIPT.read_text()
    steps = _steps()
    assert steps[0] == "env" and {"reused-event", "overlap", "pytest-gpu"} <= set(steps)
    exported = " ".join(
        re.findall(r"^export -f (.*?)(?<!\\)$", text, re.DOTALL | re.MULTILINE)
    )
    for name in steps:
        function = "step_" + name.replace("-", "_")
        assert re.search(rf"^{function}\(\) \{{", text, re.MULTILINE), function
        assert function in exported, f"{function} is not in export -f"


def test_the_reused_event_step_selects_its_test() -> None:
    """``-k reused_event`` in the reused-event step names a test of test_gpu_streams.py."""
    text = SCRIPT.read_text()
    assert "tests/gpu/test_gpu_streams.py -k reused_event" in text
    streams = (REPO / "tests" / "gpu" / "test_gpu_streams.py").read_text()
    assert re.search(r"^def test_\w*reused_event\w*\(", streams, re.MULTILINE)


def test_the_cuda_default_is_the_gpu_sized_demo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ``--model``, ``relay demo --device cuda`` runs the ``gpu`` model with its
    decode steps over CUDA graphs; the CPU keeps ``small``, eager."""
    assert demo.default_model("cuda") == "gpu"
    assert demo.default_model("cuda:1") == "gpu"
    assert demo.default_model("cpu") == "small"
    gpu, small = demo.model_preset("gpu"), demo.model_preset("small")
    assert gpu.hidden * gpu.layers > 8 * small.hidden * small.layers
    monkeypatch.setattr(demo, "resolve_device", lambda name, ranks=1: name)
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    cuda = demo.config_from_args(parser.parse_args(["--device", "cuda"]))
    assert cuda.model == gpu and cuda.graphs
    cpu = demo.config_from_args(parser.parse_args([]))
    assert cpu.model == small and not cpu.graphs
    chosen = demo.config_from_args(
        parser.parse_args(["--device", "cuda", "--model", "tiny"])
    )
    assert chosen.model == demo.model_preset("tiny") and chosen.graphs


def test_the_overlap_step_and_the_figures_run_on_the_cpu(tmp_path: Path) -> None:
    """``gpu_overlap.py --dry-run`` runs the demo's configuration, small, on the CPU over
    the static buffers (outputs identical, steps in buckets), writes its JSON, and
    ``gpu_figures.py`` sets it against the bars."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "overlap.json"
    script = REPO / "scripts" / "gpu_overlap.py"
    args = ["--dry-run", "--repeat", "1", "--json", str(out)]
    run = subprocess.run(
        [sys.executable, str(script), *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    document = json.loads(out.read_text())
    assert document["dry_run"] and document["device"] == "cpu"
    assert [m["mode"] for m in document["modes"]] == ["decode", "eagle"]
    for m in document["modes"]:
        assert m["identical"] and m["bucket_steps"] > 0 and m["graphs_captured"] == 0
    figures = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_figures.py"), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert figures.returncode == 0, figures.stderr
    assert "| decode |" in figures.stdout and "a dry run: not judged" in figures.stdout


def test_the_figures_read_the_demo_steps_json(tmp_path: Path) -> None:
    """The demo steps' ``--json`` (here a tiny CPU demo) is what ``gpu_figures.py`` sets
    against the bars."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    flags = ["--model", "tiny", "--requests", "8", "--repeat", "1", "--mode", "decode"]
    flags += ["--no-generate", "-q", "--json", str(tmp_path / "demo-decode.json")]
    run = subprocess.run(
        [sys.executable, "-m", "relay", "demo", *flags],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    figures = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_figures.py"), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert figures.returncode == 0, figures.stderr
    assert "- demo-decode decode: sync " in figures.stdout, figures.stdout
    assert "occupancy " in figures.stdout and "identical True" in figures.stdout
