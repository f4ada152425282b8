"""docs/integrating.md: its example runs a generated map in an engine's call order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_integration_example_prints_what_the_guide_shows() -> None:
    """``examples/integrate_eagle.py`` runs the call order of the guide on the generated
    eagle map, in debug mode, and prints exactly the guide's closing block."""
    guide = (REPO / "docs" / "integrating.md").read_text(encoding="utf-8")
    after = guide.split("## The example's output", 1)[1]
    shown = after.split("```\n", 2)[1]
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "integrate_eagle.py")],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout == shown
    # The order an engine makes the calls in, step by step.
    calls = [line.split(":", 1)[1].split()[0] for line in shown.splitlines()[:10]]
    assert calls == [
        "publish",
        "stash",
        "resolve_seq_lens_cpu",
        "resolve_future",
        "publish",
        "stash",
        "resolve_seq_lens_cpu",
        "release",
        "resolve_future,",
        "publish",
    ]
