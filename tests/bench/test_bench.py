"""Smoke tests of ``relay bench``: report structure and baseline/generated agreement.

No timing is asserted: ratios depend on the machine and its load.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relay.bench.main import (
    OPS,
    Config,
    Workload,
    bench,
    build_sides,
    compare_values,
    configs_for,
    device_bytes,
    format_report,
)
from relay.cli import main

CPU = torch.device("cpu")
TINY = [
    Config("decode", 17, 4),
    Config("eagle", 17, 4, topk=2, hidden=8),
    Config("eagle", 17, 1, topk=1, hidden=0),
]


def test_cli_writes_report_with_every_op_and_config(tmp_path: Path) -> None:
    """A tiny ``relay bench`` run exits 0 and its JSON has every config, op and ratio."""
    out = tmp_path / "bench.json"
    status = main([
        "bench", "--pool", "17", "--batch", "1,4,32", "--topk", "2", "--hidden", "8",
        "--repeat", "2", "--warmup", "1", "--sample-ms", "0.05", "--json", str(out),
    ])
    assert status == 0
    data = json.loads(out.read_text())
    assert set(data) == {"meta", "configs", "summary", "engine"}
    assert data["meta"]["repeat"] == 2 and data["meta"]["device"] == "cpu"
    labels = [c["label"] for c in data["configs"]]
    # B=32 does not fit P=17 (at most P-1 requests) and is skipped.
    assert labels == ["decode P=17 B=1", "decode P=17 B=4",
                      "eagle P=17 B=1 K=2 H=8", "eagle P=17 B=4 K=2 H=8"]
    for entry in data["configs"]:
        assert entry["identical"] is True and entry["problems"] == []
        assert entry["memory"]["baseline_bytes"] == entry["memory"]["generated_bytes"] > 0
        assert list(entry["ops"]) == list(OPS)
        for op, result in entry["ops"].items():
            assert result["ratio"] > 0 and result["control_ratio"] > 0
            assert result["baseline_ns"] > 0 and result["generated_ns"] > 0
            assert (result["debug_ratio"] is not None) == (op == "step")
    assert set(data["summary"]) == {*OPS, "step+debug", "memory"}
    assert data["engine"] is None


def test_filters_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    """``--map`` and ``--op`` narrow the run; the table names the ops timed."""
    status = main(["bench", "--map", "eagle", "--op", "stash,step", "--pool", "9",
                   "--batch", "2", "--topk", "1", "--hidden", "0", "--repeat", "1",
                   "--sample-ms", "0.05", "--no-debug", "--no-control"])
    assert status == 0
    out = capsys.readouterr().out
    assert "eagle" in out and "stash" in out and "decode" not in out.split("summary")[0]
    assert "res_fut" not in out


def test_bad_sizes_are_usage_errors() -> None:
    """A pool with no room for the batch, or a zero top-k, exits 2."""
    assert main(["bench", "--pool", "2", "--batch", "4"]) == 2
    assert main(["bench", "--map", "eagle", "--topk", "0", "--pool", "9", "--batch", "1"]) == 2


@pytest.mark.parametrize("config", TINY, ids=lambda c: c.label)
@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_baseline_and_generated_produce_identical_values(config: Config, debug: bool) -> None:
    """Over several steps with fresh outputs, both maps resolve the same batch values."""
    for seed in range(3):
        assert compare_values(config, CPU, steps=5, seed=seed, debug=debug) == []


@pytest.mark.parametrize("config", TINY, ids=lambda c: c.label)
def test_step_ops_agree_and_memory_is_equal(config: Config) -> None:
    """Every timed callable leaves both batches equal; both maps hold the same bytes."""
    work = Workload.random(config, CPU, torch.Generator().manual_seed(1))
    base, gen = build_sides(config, CPU, work)
    for op in OPS:
        base.ops[op]()
        gen.ops[op]()
    assert torch.equal(base.batch.input_ids, gen.batch.input_ids)
    assert torch.equal(base.batch.seq_lens_cpu, gen.batch.seq_lens_cpu)
    assert base.batch.seq_lens_sum == gen.batch.seq_lens_sum
    expected = config.pool * 8 * 2  # output_tokens and new_seq_lens, int64
    expected += config.pool * config.topk * (4 + 8)  # topk_p f32, topk_index i64
    expected += config.pool * config.hidden * 2  # hidden_states bf16
    assert device_bytes(base.map, CPU) == device_bytes(gen.map, CPU) == expected


def test_debug_step_runs_and_report_formats() -> None:
    """The debug-mode step consumes every value once; the report prints aligned rows."""
    report = bench(TINY[:2], CPU, repeat=2, warmup=1, target_ns=20_000)
    text = format_report(report)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("map "))
    rule = lines[lines.index(header) + 1]
    assert set(rule.replace(" ", "")) == {"-"}
    assert all(r.ops["step"].debug_ratio is not None for r in report.results)
    assert "device buffers: generated == baseline" in text


def test_configs_skip_batches_larger_than_the_pool() -> None:
    """Row 0 is scratch, so a pool of P rows serves at most P - 1 requests."""
    configs = configs_for(["decode"], [9, 257], [1, 8, 64], [1], [0])
    assert [(c.pool, c.batch) for c in configs] == [(9, 1), (9, 8), (257, 1), (257, 8), (257, 64)]
