"""``relay bench --breakdown``: every generated method split into its statements.

No timing is asserted; the split itself is: the statements together dispatch exactly
the method's ops, so no work is lost or counted twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relay.bench.breakdown import breakdown
from relay.bench.counts import count_step
from relay.bench.sides import Workload, discover, generated_side
from relay.bench.sizes import Shape
from relay.cli import main

CPU = torch.device("cpu")
FOUND = {pair.schema: (pair, gen) for pair, gen in discover()[0]}
SHAPES = {"decode": Shape(17, 2), "eagle": Shape(17, 2, 2, 8)}


@pytest.mark.parametrize("schema", sorted(SHAPES))
def test_statements_dispatch_the_methods_ops(schema: str) -> None:
    """Per method, the ops of its top-level statements, in order, are the ops the
    whole method dispatches in the bench's step; each method has its floor time."""
    pair, gen = FOUND[schema]
    shape = SHAPES[schema]
    results = breakdown(schema, shape, repeat=2, sample_us=5)
    work = Workload.random(shape, CPU, torch.Generator().manual_seed(0), spec=pair.spec)
    side = generated_side(gen, shape, CPU, work)
    side.step()
    expected = {m.method: m.ops for m in count_step(side).methods}
    assert [r.method for r in results] == [m for m in expected if m in dir(side.map)]
    for r in results:
        got = tuple(op for s in r.statements if s.level == 0 for op in s.ops)
        assert got == expected[r.method], r.method
        assert r.floor_ns > 0 and r.generated_ns > 0
        assert any(s.level == 0 and not s.ops for s in r.statements)
    stash = next(r for r in results if r.method == "stash")
    assert [what for what, _ in stash.extras] == [
        f"{gen.payload_cls.__name__}(**fields) (built by the caller)"
    ]


def test_breakdown_command_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``relay bench --breakdown`` prints each method's rows and writes them as JSON."""
    out = tmp_path / "breakdown.json"
    argv = ["bench", "--breakdown", "--schema", "decode", "--pool", "17"]
    argv += ["--repeat", "2", "--sample-ms", "0.005", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "== decode P=17 B=1" in text and "stash: generated" in text
    rows = json.loads(out.read_text())
    assert [r["method"] for r in rows] == ["resolve_future", "stash"]
    assert all(r["statements"] for r in rows)


@pytest.mark.parametrize(
    "argv",
    [
        ["--device", "meta"],
        ["--schema", "no_such_schema"],
        ["--repeat", "0"],
        ["--quantile", "2"],
    ],
    ids=["not-cpu", "unknown-schema", "repeat-0", "quantile-2"],
)
def test_breakdown_bad_usage_exits_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A device other than the CPU, a schema without a floor, no repeats or a quantile
    outside [0, 1] exit 2."""
    assert main(["bench", "--breakdown", *argv]) == 2
    assert capsys.readouterr().err.startswith("relay bench: ")
