"""``relay bench --spans``: each map's counted scatter's floors make the generated step's
data ops and view ops, in order (the bare one without the host checks' ``aminmax``), and
hand on the same values; the checked one refuses a bad offset before any row changes.
No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relay.bench import spans
from relay.bench.main import SPAN_MAPS
from relay.cli import main
from relay.opcount import count_ops

CPU = torch.device("cpu")


@pytest.mark.parametrize("name", SPAN_MAPS)
@pytest.mark.parametrize("batch", [1, 8, 20, 64, 256])
def test_the_floors_make_the_generated_steps_ops(name: str, batch: int) -> None:
    """Same data ops and view ops in the same order, over the map's own buffers, from
    the host checks' op forms (above 32 slots, above 48 requests) to none; the same
    scatter target and gathered values handed on."""
    work = spans.workload(batch, CPU, name=name)
    generated, relay, relay_batch = spans.relay_step(work, CPU)
    floor, floor_handed = spans.plain_step(work, relay, CPU)
    bare, bare_handed = spans.plain_step(work, relay, CPU, check=False)
    generated()
    handed = spans.handed(work, relay_batch)
    assert len(handed) == (2 if name == "ngram" else 1)  # ngram's bonus token too
    for step, values in ((floor, floor_handed), (bare, bare_handed)):
        step()
        assert all(map(torch.equal, handed, values))
    made, checked, plain = count_ops(generated), count_ops(floor), count_ops(bare)
    assert made.data == checked.data and "index_copy_" in made.data
    assert len(made.views) == len(checked.views)
    # The host checks' ops: ``aminmax`` of the slots, numpy's reads of the spans.
    assert len(plain.views) == len([v for v in made.views if v != "detach"])
    assert plain.data == tuple(op for op in made.data if op != "aminmax")


@pytest.mark.parametrize("name", SPAN_MAPS)
def test_the_checked_floor_refuses_a_bad_offset_before_any_row_changes(
    name: str,
) -> None:
    """An offset past the flat target: the checked floor raises with its target as it
    was; the bare one writes the values before it first."""
    for check in (True, False):
        work = spans.workload(8, CPU, name=name)
        _, relay, _ = spans.relay_step(work, CPU)
        step, (target, *_) = spans.plain_step(work, relay, CPU, check)
        work.starts[-1] = work.size  # the last request's span starts past the end
        work.counts[-1] = work.ready[-1] = 1  # and lays a value there
        assert int(work.counts[:-1].sum()) > 0  # values before it for the bare floor
        with pytest.raises(IndexError):
            step()
        assert bool((target == -1).all()) is check


def test_the_spans_run_prints_its_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``relay bench --spans`` at two batch sizes: a row per map and size, each map
    named in its JSON row, values the same."""
    out = tmp_path / "spans.json"
    args = ["bench", "--spans", "--batch", "1,32", "--repeat", "2"]
    assert main([*args, "--sample-ms", "0.05", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gen/floor" in printed and "gen/bare" in printed
    assert printed.count("  same") == 2 * len(SPAN_MAPS)
    figures = json.loads(out.read_text())["spans"]
    assert [(r["map"], r["batch"]) for r in figures] == [
        (name, batch) for name in SPAN_MAPS for batch in (1, 32)
    ]
    assert all(r["same"] and r["ns"]["generated"] > 0 for r in figures)
    assert all(0 < r["generated/floor"]["median"] for r in figures)


def test_the_spans_run_takes_the_maps_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--schema`` names the maps ``--spans`` times; one it does not time is refused."""
    args = ["bench", "--spans", "--batch", "8", "--repeat", "1", "--sample-ms", "0.05"]
    assert main([*args, "--schema", "ngram"]) == 0
    assert capsys.readouterr().out.count("  same") == 1
    assert main([*args, "--schema", "ngram,decode"]) == 2
    assert "--spans times" in capsys.readouterr().err
