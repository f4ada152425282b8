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


#: What one device call allows (seconds), and what the script runs outside its budget:
#: the figures (``timeout 30``) and a timed-out step's grace (``--kill-after=10``).
DEVICE_CALL_S = 600
OUTSIDE_BUDGET_S = 30 + 10


def _limits() -> dict[str, int]:
    text = SCRIPT.read_text()
    table = re.search(r"^STEPS=\(\n(.*?)^\)", text, re.DOTALL | re.MULTILINE)
    assert table is not None
    rows = re.findall(r"^\s+([a-z-]+) (\d+)$", table.group(1), re.MULTILINE)
    return {name: int(limit) for name, limit in rows}


def _default_budget() -> int:
    found = re.search(
        r"^BUDGET=\$\{GPU_CHECK_BUDGET_S:-(\d+)\}$", SCRIPT.read_text(), re.MULTILINE
    )
    assert found is not None, "no BUDGET=${GPU_CHECK_BUDGET_S:-N} in gpu_check.sh"
    return int(found.group(1))


def test_a_default_run_fits_one_device_call() -> None:
    """The steps' default limits add up to at most 540 s and to no more than the
    default budget, so no step is cut short by the budget, and the budget with what
    runs outside it stays under one 10-minute call."""
    limits = _limits()
    assert list(limits) == _steps()
    assert sum(limits.values()) <= 540
    assert sum(limits.values()) <= _default_budget()
    assert _default_budget() + OUTSIDE_BUDGET_S < DEVICE_CALL_S
    assert f"add up to {sum(limits.values())} s" in SCRIPT.read_text()


def test_docs_give_each_step_its_limit_and_command() -> None:
    """docs/gpu.md's table of steps lists the script's steps, in order, with their
    limits, and says the whole check fits one call."""
    page = (REPO / "docs" / "gpu.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)` \| (\d+) s \|", page, re.MULTILINE)
    assert {name: int(limit) for name, limit in rows} == _limits()
    assert [name for name, _ in rows] == _steps()
    assert f"add up to {sum(_limits().values())} s" in page
    assert f"under {_default_budget()} s" in page


def _check(tmp_path: Path, **env: str) -> tuple[int, str]:
    """Run gpu_check.sh with ``env`` into a fresh results folder: its exit status and
    its summary."""
    results = tmp_path / "results"
    run = subprocess.run(
        ["bash", str(SCRIPT), str(results)],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable, **env},
        timeout=120,
    )
    summary = results / "summary.txt"
    return run.returncode, summary.read_text() if summary.is_file() else run.stderr


@pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None,
    reason="needs bash and coreutils' timeout",
)
def test_the_runner_on_the_cpu(tmp_path: Path) -> None:
    """The runner itself, with a step that needs no GPU: the step's line (PASS, or
    SKIP without ruff) and an overall PASS; a spent budget reports the step not run
    and fails; an unknown step is bad usage."""
    code, summary = _check(tmp_path / "one", GPU_CHECK_STEPS="generate-check")
    assert code == 0, summary
    assert re.search(r"^(PASS|SKIP)  generate-check ", summary, re.MULTILINE), summary
    assert "overall: PASS" in summary and "of a 540s budget" in summary
    code, summary = _check(
        tmp_path / "spent", GPU_CHECK_STEPS="generate-check", GPU_CHECK_BUDGET_S="2"
    )
    assert code == 1 and "not run: the run's budget of 2s is spent" in summary
    assert "overall: FAIL (1 of 1 steps)" in summary
    code, err = _check(tmp_path / "bad", GPU_CHECK_STEPS="warp-drive")
    assert code == 2 and "no step 'warp-drive'" in err


def test_the_sanitizers_workload_runs_on_the_cpu() -> None:
    """The sanitizer steps run ``gpu_overlap.py --short`` (both modes, over the static
    buffers); on the CPU it runs the same workload, outputs identical."""
    text = SCRIPT.read_text()
    assert (
        "SHORT=(scripts/gpu_overlap.py --device cuda --short --modes decode eagle)"
        in text
    )
    assert (
        text.count('"$PY" "${SHORT[@]}"') == 2
    )  # torch's sanitizer, compute-sanitizer
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_overlap.py"), "--short"]
        + ["--device", "cpu", "--modes", "decode", "eagle"],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[-1] == "PASS"
    for mode in ("decode", "eagle"):
        line = next(x for x in lines if x.startswith(f"{mode}: "))
        assert "identical True" in line and "steps in buckets 0" not in line
