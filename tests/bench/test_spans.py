"""``relay bench --spans``: the counted scatter's floors make the generated step's data
ops and view ops, in order (the bare one without the host checks' ``aminmax``), and lay
in the same values; the checked one refuses a bad offset before any row changes. No
timing is asserted."""

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
def test_the_floors_make_the_generated_steps_ops(batch: int) -> None:
    """Same data ops and view ops in the same order, over the map's own buffers, from
    the host checks' op forms (above 32 slots, above 48 requests) to none."""
    work = spans.workload(batch, CPU)
    generated, relay, relay_batch = spans.relay_step(work, CPU)
    floor, floor_ids = spans.plain_step(work, relay, CPU)
    bare, bare_ids = spans.plain_step(work, relay, CPU, check=False)
    generated()
    for step, input_ids in ((floor, floor_ids), (bare, bare_ids)):
        step()
        assert torch.equal(relay_batch.input_ids, input_ids)
    made, checked, plain = count_ops(generated), count_ops(floor), count_ops(bare)
    assert made.data == checked.data and "index_copy_" in made.data
    assert len(made.views) == len(checked.views)
    # The host checks' ops: ``aminmax`` of the slots, numpy's reads of the spans.
    assert len(plain.views) == len([v for v in made.views if v != "detach"])
    assert plain.data == tuple(op for op in made.data if op != "aminmax")


def test_the_checked_floor_refuses_a_bad_offset_before_any_row_changes() -> None:
    """An offset past the flat target: the checked floor raises with ``input_ids`` as
    it was; the bare one writes the tokens before it first."""
    for check in (True, False):
        work = spans.workload(8, CPU)
        _, relay, _ = spans.relay_step(work, CPU)
        step, input_ids = spans.plain_step(work, relay, CPU, check)
        work.starts[-1] = work.size  # the last request's span starts past the end
        with pytest.raises(IndexError):
            step()
        assert bool((input_ids == -1).all()) is check


def test_the_spans_run_prints_its_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``relay bench --spans`` at two batch sizes: a row each, values the same."""
    out = tmp_path / "spans.json"
    args = ["bench", "--spans", "--batch", "1,32", "--repeat", "2"]
    assert main([*args, "--sample-ms", "0.05", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gen/floor" in printed and "gen/bare" in printed
    assert printed.count("  same") == 2
    figures = json.loads(out.read_text())["spans"]
    assert [r["batch"] for r in figures] == [1, 32]
    assert all(r["same"] and r["ns"]["generated"] > 0 for r in figures)
    assert all(0 < r["generated/floor"]["median"] for r in figures)
