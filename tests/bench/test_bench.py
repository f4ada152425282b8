"""``relay bench``: the quick path, the baselines' op counts, values checks, exit status.

No timing is asserted: times depend on the machine and its load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from relay.bench import sides
from relay.bench.baseline import DecodeBaseline, EagleBaseline
from relay.bench.codegen_speed import generation_times
from relay.bench.counts import count_step
from relay.bench.sides import (
    PAIRS,
    Pair,
    Workload,
    baseline_side,
    compare_values,
    discover,
    pair_named,
)
from relay.bench.sizes import PRESETS, Shape
from relay.cli import main

CPU = torch.device("cpu")
FOUND, _ = discover()
TINY = {
    False: [Shape(17, 4), Shape(17, 1)],
    True: [Shape(17, 4, 2, 8), Shape(17, 1, 1, 0)],
}


def _baseline_count(schema: str, shape: Shape) -> dict[str, tuple[str, ...]]:
    pair = pair_named(schema)
    work = Workload.random(shape, CPU, torch.Generator().manual_seed(0), spec=pair.spec)
    side = baseline_side(pair, shape, CPU, work)
    side.step()  # the first step's resolve reads the priming stash; count a steady one
    return {m.method: m.ops for m in count_step(side).methods}


def test_eagle_baseline_dispatches_domain_totals() -> None:
    """EAGLE with hidden states at B >= 2: 12 ops a step, as DOMAIN.md counts sglang's."""
    ops = _baseline_count("eagle", Shape(257, 32, 8, 4096))
    assert ops == {
        "resolve_future": ("index",) * 4,
        "publish": ("index_put_",),
        "stash": ("index_put_",) * 4,
        "resolve_seq_lens_cpu": ("index", "sum", "_local_scalar_dense"),
    }
    assert sum(len(v) for v in ops.values()) == 12


def test_decode_baselines_dispatch_domain_totals() -> None:
    """Plain decoding: 3 ops a step (gather, indexed write, host seq_lens + 1); the
    seq_lens-relaying 2026-05 design 12."""
    assert _baseline_count("decode", Shape(257, 32)) == {
        "resolve_future": ("index",),
        "stash": ("index_put_",),
        "scheduler: seq_lens + 1": ("add",),
    }
    ops = _baseline_count("decode_seq_lens", Shape(257, 32))
    assert ops["invalidate"] == ("neg",)
    assert ops["publish"] == ops["stash"] == ("index_put_",)
    assert sum(len(v) for v in ops.values()) == 12


@pytest.mark.parametrize("pair,generated", FOUND, ids=[p.schema for p, _ in FOUND])
@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_generated_and_baseline_resolve_the_same_values(
    pair: Pair, generated: sides.Generated, debug: bool
) -> None:
    """Over several steps with fresh outputs, both sides hand the next forward and the
    scheduler the same values."""
    for shape in TINY[pair.spec]:
        for seed in range(2):
            assert (
                compare_values(
                    pair, generated, shape, CPU, steps=4, seed=seed, debug=debug
                )
                == []
            )


class _WrongRowDecode(DecodeBaseline):
    """Gathers the neighbouring slot: what an off-by-one in a hand-written map does."""

    def resolve_future(self, batch: Any) -> None:
        batch.input_ids = self.output_tokens_buf[batch.req_pool_indices - 1]


class _RaisingEagle(EagleBaseline):
    def publish(self, indices: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        raise RuntimeError("publish failed")


def test_values_check_catches_a_wrong_row() -> None:
    """A side that resolves another slot's token is reported, step by step."""
    pair = Pair("decode", _WrongRowDecode, "wrong row", spec=False)
    generated = {p.schema: g for p, g in FOUND}["decode"]
    problems = compare_values(pair, generated, Shape(17, 4), CPU, steps=2)
    assert problems and all("next tokens differs" in p for p in problems)


def _swap(monkeypatch: pytest.MonkeyPatch, schema: str, baseline: type[Any]) -> None:
    swapped = tuple(
        Pair(p.schema, baseline, p.design, p.spec) if p.schema == schema else p
        for p in PAIRS
    )
    monkeypatch.setattr(sides, "PAIRS", swapped)


TINY_RUN = [
    "bench",
    "-q",
    "--pool",
    "17",
    "--batch",
    "4",
    "--topk",
    "2",
    "--hidden",
    "8",
    "--repeat",
    "2",
    "--warmup",
    "1",
    "--sample-ms",
    "0.02",
    "--fields",
    "0",
]


def test_values_that_differ_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose sides disagree exits 1 and names the configuration."""
    _swap(monkeypatch, "decode", _WrongRowDecode)
    assert main([*TINY_RUN, "--schema", "decode"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "decode P=17 B=4" in out


def test_a_side_that_raises_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An exception inside a side is reported per configuration and the run exits 1."""
    _swap(monkeypatch, "eagle", _RaisingEagle)
    out_json = tmp_path / "bench.json"
    assert main([*TINY_RUN, "--schema", "eagle", "--json", str(out_json)]) == 1
    assert "publish failed" in capsys.readouterr().out
    config = json.loads(out_json.read_text())["configs"][0]
    assert config["ok"] is False and "RuntimeError: publish failed" in config["error"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--pool", "2", "--batch", "4"],
        ["--pool", "9", "--batch", "1", "--topk", "0"],
        ["--schema", "no_such_schema"],
        ["--repeat", "0"],
    ],
    ids=["batch-over-pool", "topk-0", "unknown-schema", "repeat-0"],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Bad sizes or names exit 2 with one line on stderr."""
    assert main(["bench", "-q", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("relay bench: ") and "\n" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """``--device cuda`` on a machine without CUDA is a usage error, not a traceback."""
    assert main(["bench", "-q", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_quick_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``relay bench --quick`` exits 0 with every generated pair at every quick shape,
    op counts per method, the floor, and the generator table; piped, it prints plain
    tables."""
    out_json = tmp_path / "bench.json"
    assert main(["bench", "--quick", "-q", "--json", str(out_json)]) == 0
    data = json.loads(out_json.read_text())
    quick = PRESETS["quick"]
    expected = [
        (p.schema, s.label) for p, _ in FOUND for s in quick.shapes(spec=p.spec)
    ]
    assert [(c["schema"], c["label"]) for c in data["configs"]] == expected
    for config in data["configs"]:
        assert config["ok"] is True and config["problems"] == []
        assert config["baseline"]["ops"] > 0 and config["generated"]["ops"] > 0
        assert (
            config["ratio"] > 0 and config["control"] > 0 and config["debug_ratio"] > 0
        )
        assert config["launches_baseline"] is None  # CPU: no kernel launches to count
        assert config["floor_ratio"] > 0 and config["floor_ops_match"] is True
        assert config["floor"]["ops"] == config["generated"]["ops"]
    assert [g["fields"] for g in data["generation"]["sizes"]] == list(quick.fields)
    assert data["copy_bandwidth_bytes_per_s"] > 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a terminal: no colour codes
    assert "| schema / method" in out and "index_put_" in out
    assert "gen/floor" in out and "ops differ" not in out
    assert "values: generated == baseline" in out


def test_generation_time_table_grows_with_fields() -> None:
    """The generator-speed table plans each size; bigger schemas give longer modules."""
    first, times = generation_times([2, 20])
    assert first > 0 and [t.fields for t in times] == [2, 20]
    assert times[0].lines < times[1].lines


def test_bench_flags_import_neither_rich_nor_the_harness() -> None:
    """Building ``relay bench``'s flags (as ``relay --help`` does) loads only the
    command line and the defaults: no rich, no harness."""
    code = (
        "import sys, argparse\n"
        "from relay.bench import main\n"
        "main.add_arguments(argparse.ArgumentParser())\n"
        "print(sorted(m for m in sys.modules if m.startswith(('relay.bench', 'rich'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['relay.bench', 'relay.bench.main', 'relay.bench.sizes']"


@pytest.mark.gpu
def test_cuda_run_counts_kernel_launches(tmp_path: Path) -> None:
    """On CUDA both sides run, agree, and launch at least one kernel a step."""
    out_json = tmp_path / "bench.json"
    assert main([*TINY_RUN, "--device", "cuda", "--json", str(out_json)]) == 0
    configs = json.loads(out_json.read_text())["configs"]
    assert configs
    for config in configs:
        assert config["ok"] is True
        assert config["launches_baseline"] >= 1 and config["launches_generated"] >= 1
