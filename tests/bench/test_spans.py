"""``relay bench --spans``: the counted scatter's plain floor makes the generated step's
data ops and view ops, in order, and lays in the same values. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relay.bench import spans
from relay.cli import main
from relay.opcount import count_ops

CPU = torch.device("cpu")


@pytest.mark.parametrize("batch", [1, 8, 20, 64, 256])
def test_the_plain_floor_makes_the_generated_steps_ops(batch: int) -> None:
    """Same data ops and view ops in the same order, over the map's own buffers, from
    the host checks' one-op forms (above 32 slots, above 48 positions) to none."""
    work = spans.workload(batch, CPU)
    generated, relay, relay_batch = spans.relay_step(work, CPU)
    plain, input_ids = spans.plain_step(work, relay, CPU)
    generated()
    plain()
    assert torch.equal(relay_batch.input_ids, input_ids)
    made, floor = count_ops(generated), count_ops(plain)
    assert made.data == floor.data
    assert len(made.views) == len(floor.views)
    assert "index_copy_" in made.data


def test_the_spans_run_prints_its_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``relay bench --spans`` at two batch sizes: a row each, values the same."""
    out = tmp_path / "spans.json"
    args = [
        "bench",
        "--spans",
        "--batch",
        "1,32",
        "--repeat",
        "2",
        "--sample-ms",
        "0.05",
    ]
    assert main([*args, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gen/plain" in printed and printed.count("same") == 2
    figures = json.loads(out.read_text())["spans"]
    assert [r["batch"] for r in figures] == [1, 32]
    assert all(r["same"] and r["generated_us"] > 0 for r in figures)
