"""``relay bench``: the baselines' op counts, values checks, the floors, the host time
per method, the quick run's JSON, exit statuses. No timing bar is asserted: times depend
on the machine and its load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from relay.bench import sides
from relay.bench.baseline import DecodeBaseline, EagleBaseline
from relay.bench.plain import Plain, Unsupported, build_plain
from relay.bench.sides import PAIRS, Pair, Shape, Workload, compare_values
from relay.bench.timing import per_method
from relay.cli import main
from relay.opcount import count_ops
from relay.schema import Field, Lane, Resolve, Schema

CPU = torch.device("cpu")
FOUND, _ = sides.discover()
TINY = {
    False: [Shape(17, 4), Shape(17, 1)],
    True: [Shape(17, 4, 2, 8), Shape(17, 1, 1, 0)],
}


def _shapes(table: dict[bool, list[Shape]], pair: Pair) -> list[Shape]:
    """``table``'s shapes for ``pair``, without a hidden state where it takes none (as
    the bench's grid does)."""
    shapes = table[pair.spec]
    return shapes if pair.hidden else [attrs.evolve(s, hidden=0) for s in shapes]


def _pair(name: str) -> Pair:
    return next(p for p in PAIRS if p.name == name)


def _ops(name: str, shape: Shape) -> tuple[dict[str, tuple[str, ...]], ...]:
    """Data ops per method of a steady step: the baseline's, the generated map's."""
    pair = _pair(name)
    generated = {p.name: g for p, g in FOUND}[name]
    work = Workload.random(shape, CPU, 0)
    both = sides.pair_sides(pair, generated, shape, CPU, work)
    for side in both:
        side.step()  # the first resolve reads the priming stash; count a steady step
    return tuple({m: count_ops(call).data for m, call in side.calls} for side in both)


def _baseline_ops(name: str, shape: Shape) -> dict[str, tuple[str, ...]]:
    return _ops(name, shape)[0]


def test_eagle_baseline_dispatches_domain_totals() -> None:
    """EAGLE with hidden states at B >= 2: 12 ops a step, as DOMAIN.md counts sglang's, and
    on the CPU the host copy's ``clone`` (``.cpu()`` there hands the rows themselves, and
    an engine advancing both lengths in place would count twice)."""
    ops = _baseline_ops("eagle", Shape(257, 32, 8, 4096))
    assert ops == {
        "resolve_future": ("index",) * 4,
        "publish": ("index_put_",),
        "stash": ("index_put_",) * 4,
        "resolve_seq_lens_cpu": ("index", "clone", "sum", "_local_scalar_dense"),
    }


def test_the_confidence_baseline_adds_its_write_gather_and_host_copy() -> None:
    """EAGLE with a confidence per draft token: the EAGLE step, and the confidence
    written beside the lengths, gathered by the scheduler and cloned to the host."""
    eagle = _baseline_ops("eagle", Shape(257, 32, 8, 4096))
    assert _baseline_ops("eagle_confidence", Shape(257, 32, 8, 4096)) == {
        **eagle,
        "publish": ("index_put_", "index_put_"),
        "resolve_draft_confidence_cpu": ("index", "clone"),
    }


def test_decode_baselines_dispatch_domain_totals() -> None:
    """Plain decoding: 3 ops a step (gather, indexed write, host seq_lens + 1); the
    design that relays seq_lens too, 12 and the CPU's host copy."""
    assert _baseline_ops("decode", Shape(257, 32)) == {
        "resolve_future": ("index",),
        "stash": ("index_put_",),
        "seq_lens + 1": ("add",),
    }
    ops = _baseline_ops("decode_seq_lens", Shape(257, 32))
    assert ops["invalidate"] == ("neg",)
    assert ops["publish"] == ops["stash"] == ("index_put_",)
    assert sum(len(v) for v in ops.values()) == 13


#: sglang 0.5.23's EAGLE step with top-k and hidden state, as its map dispatches it.
SGLANG_EAGLE_OPS = {
    "resolve_future": ("index",) * 4,
    "publish": ("index_put_",),
    "stash": ("index_put_",) * 4,
    "resolve_seq_lens_cpu": ("index", "clone", "sum", "_local_scalar_dense"),
}


def test_sglang_baselines_dispatch_what_sglang_dispatches() -> None:
    """sglang 0.5.23's maps, op by op: EAGLE 12 ops a step (the confidence and the
    mixed batch's tails are not called in a decode step), 10 when a captured graph
    wrote the lengths and bonus tokens (no scatter for them); n-gram 8; plain
    decoding 3, the very baseline of ``decode``. A map relaying lengths adds the host
    copy's ``clone`` on the CPU."""
    shape = Shape(257, 4, 4, 64)
    assert _baseline_ops("sglang_eagle", shape) == SGLANG_EAGLE_OPS
    assert _baseline_ops("sglang_eagle/graph", shape) == {
        **SGLANG_EAGLE_OPS,
        "graph_wrote": (),
        "publish": (),
        "stash": ("index_put_",) * 3,
    }
    assert _baseline_ops("sglang_ngram", shape) == {
        "resolve_future": ("index", "index"),
        "publish": ("index_put_",),
        "stash": ("index_put_", "index_put_"),
        "resolve_seq_lens_cpu": ("index", "clone", "sum", "_local_scalar_dense"),
    }
    assert _baseline_ops("sglang_decode", Shape(257, 4)) == _baseline_ops(
        "decode", Shape(257, 4)
    )


@pytest.mark.parametrize("batch", [4, 100])
def test_a_graph_written_step_scatters_none_of_the_graphs_values(batch: int) -> None:
    """The generated map handed ``None`` for the values the captured graph wrote
    dispatches no write for them: its publish only its host slot check (above 32 slots
    on the CPU), its stash one ``index_copy_`` fewer than the step without a graph."""
    shape = Shape(257, batch, 4, 64)
    _, plain = _ops("sglang_eagle", shape)
    _, graph = _ops("sglang_eagle/graph", shape)
    check = ("aminmax",) if batch > 32 else ()
    assert plain["publish"] == (*check, "index_copy_")
    assert graph["publish"] == check
    assert plain["stash"] == (*check, *("index_copy_",) * 4)
    assert graph["stash"] == (*check, *("index_copy_",) * 3)
    assert graph["graph_wrote"] == ()


def test_the_graphs_values_reach_the_batch() -> None:
    """In the graph-written step the values both sides hand over are the ones the
    captured graph wrote (the values check is not comparing stale buffers)."""
    pair = _pair("sglang_eagle/graph")
    generated = {p.name: g for p, g in FOUND}[pair.name]
    shape = Shape(17, 4, 2, 8)
    work = Workload.random(shape, CPU, 0)
    both = sides.pair_sides(pair, generated, shape, CPU, work)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        bonus = work.values["bonus_tokens"]
        work.renew(shape, g)
        for side in both:
            side.check_step()
            assert sides.same(side.batch.spec_info.bonus_tokens, bonus)
            assert sides.same(side.batch.seq_lens, work.values["new_seq_lens"])


@pytest.mark.parametrize("name", ["sglang_eagle", "sglang_eagle/graph", "sglang_ngram"])
def test_the_faithful_steps_follow_the_draft_inputs_slots(name: str) -> None:
    """Both sides read their slots from ``spec_info.future_indices``, as sglang does:
    a batch whose draft input has none, or has no draft input, is left as it is."""
    pair = _pair(name)
    generated = {p.name: g for p, g in FOUND}[name]
    shape = Shape(17, 4, 2, 8)
    work = Workload.random(shape, CPU, 0)
    for side in sides.pair_sides(pair, generated, shape, CPU, work):
        resolves = [(m, c) for m, c in side.calls if m.startswith("resolve_")]
        assert [m for m, _ in resolves] == ["resolve_future", "resolve_seq_lens_cpu"]
        side.batch.spec_info.future_indices = None
        before = dict(sides.observed(side.batch))
        for _, call in resolves:
            assert count_ops(call).data == ()
        after = dict(sides.observed(side.batch))
        assert all(after[key] is value for key, value in before.items())
        side.batch.spec_info = None
        for _, call in resolves:
            assert count_ops(call).data == ()


@pytest.mark.parametrize("pair,generated", FOUND, ids=[p.name for p, _ in FOUND])
@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_generated_and_baseline_resolve_the_same_values(
    pair: Pair, generated: sides.Generated, debug: bool
) -> None:
    """Over several steps with fresh outputs, both sides hand the next forward and the
    scheduler the same values."""
    for shape in _shapes(TINY, pair):
        for seed in range(2):
            problems = compare_values(
                pair, generated, shape, CPU, steps=4, seed=seed, debug=debug
            )
            assert problems == []


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


def _generated_and_plain(
    pair: Pair,
    generated: sides.Generated,
    shape: Shape,
    seed: int = 0,
    *,
    check: bool = True,
) -> tuple[Workload, sides.Side, Plain, sides.Side]:
    """The generated map's side and its floor (checked, or bare) over one workload,
    each one step in, and the second map whose buffers the floor runs over (the bench
    shares the generated map's), so a write to the wrong rows cannot hide behind the
    other side's."""
    work = Workload.random(shape, CPU, seed)
    side, other = (sides.pair_sides(pair, generated, shape, CPU, work)[1] for _ in "ab")
    schema = Schema.bundled(pair.schema)
    methods = [m for m, _ in side.calls]
    plain = build_plain(
        schema, other.map, shape, work, methods, graph=pair.graph, check=check
    )
    side.step()
    plain.step()
    return work, side, plain, other


def _bind(plain: Plain, work: Workload) -> None:
    """Rebind the floor's values (``v_<name>``) after ``work.renew``."""
    bound = [k for k in plain.namespace if k.startswith("v_")]
    plain.namespace.update((k, work.values[k.removeprefix("v_")]) for k in bound)


#: Both host sums (a Python sum up to 64 slots, numpy above) and no hidden state.
PLAIN_SHAPES = {
    False: [*TINY[False], Shape(257, 100)],
    True: [*TINY[True], Shape(257, 100, 8, 0)],
}


@pytest.mark.parametrize("pair,generated", FOUND, ids=[p.name for p, _ in FOUND])
def test_the_floors_dispatch_the_generated_ops(
    pair: Pair, generated: sides.Generated
) -> None:
    """The checked floor makes the generated step's calls: per method, in the step's
    order, the same data ops and view ops, in the same order; the bare floor the same
    but the host check's ``aminmax`` (above 32 slots, once per write call)."""
    for shape in _shapes(PLAIN_SHAPES, pair):
        _, side, plain, _ = _generated_and_plain(pair, generated, shape)
        _, _, bare, _ = _generated_and_plain(pair, generated, shape, check=False)
        assert [m for m, _ in plain.calls] == [m for m, _ in side.calls]
        want = {m: count_ops(c) for m, c in side.calls}
        assert {m: count_ops(c) for m, c in plain.calls} == want, shape.label
        for method, call in bare.calls:
            ops = want[method].data
            writes = method in ("stash", "publish")
            check = ("aminmax",) if writes and shape.batch > 32 else ()
            assert ops[: len(check)] == check, (shape.label, method)
            assert count_ops(call).data == ops[len(check) :], (shape.label, method)


@pytest.mark.parametrize("pair,generated", FOUND, ids=[p.name for p, _ in FOUND])
@pytest.mark.parametrize("check", [True, False], ids=["floor", "bare"])
def test_the_floors_resolve_the_same_values(
    pair: Pair, generated: sides.Generated, check: bool
) -> None:
    """Over several steps with fresh outputs, each floor hands the next forward and the
    scheduler what the generated map hands them."""
    for shape in _shapes(PLAIN_SHAPES, pair):
        work, side, plain, other = _generated_and_plain(
            pair, generated, shape, seed=3, check=check
        )
        g = torch.Generator().manual_seed(4)
        for step in range(3):
            work.renew(shape, g)
            _bind(plain, work)
            side.check_step()
            for method, call in plain.calls:
                if method == "graph_wrote" and other.graph is not None:
                    other.graph()  # the captured graph writes the floor's buffers
                call()
            assert sides.differences(side.batch, plain.batch) == [], (shape.label, step)


def test_the_floor_is_plain_tensor_methods() -> None:
    """No relay Python and no op overloads: the calls are tensor methods on bound
    tensors, the fence's bound record and wait, the driver's own ``seq_lens + 1``, and
    the host check's list read, its test against the pool's slot set ``S`` and
    ``IndexError``."""
    for pair, generated in FOUND:
        shape = _shapes(PLAIN_SHAPES, pair)[0]
        _, _, plain, _ = _generated_and_plain(pair, generated, shape)
        assert "_rt" not in plain.source and "aten" not in plain.source
        for _, call in plain.calls:
            names = set(call.__code__.co_names)
            bound = {n for n in names if n in plain.namespace}
            assert all(
                isinstance(plain.namespace[n], (torch.Tensor, tuple, sides.Batch))
                for n in bound - {"record", "wait", "advance", "P", "S"}
            ), (pair.schema, bound)
            assert "S" not in bound or isinstance(plain.namespace["S"], frozenset)


def test_a_step_the_floor_does_not_write_is_refused() -> None:
    """A placeholder field: no floor rather than a wrong one."""
    schema = Schema(
        name="PlaceholderFutureMap",
        fields=[
            Field(
                "output_tokens",
                lane=Lane.FORWARD,
                dtype=torch.int64,
                source="next_token_ids",
                target="input_ids",
                resolve=Resolve.PLACEHOLDER,
            )
        ],
    )
    work = Workload.random(Shape(17, 4), CPU, 0)
    relay_map = DecodeBaseline(CPU, 17)  # refused before any buffer is looked for
    with pytest.raises(Unsupported, match="placeholder"):
        build_plain(schema, relay_map, Shape(17, 4), work, ["resolve_future", "stash"])


def _swap(monkeypatch: pytest.MonkeyPatch, schema: str, baseline: type[Any]) -> None:
    swapped = tuple(
        attrs.evolve(p, baseline=baseline) if p.schema == schema else p for p in PAIRS
    )
    monkeypatch.setattr(sides, "PAIRS", swapped)


TINY_RUN = ["bench", "-q", "--pool", "17", "--batch", "4", "--topk", "2"]
TINY_RUN += ["--hidden", "8", "--repeat", "2", "--warmup", "1", "--sample-ms", "0.02"]


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
        ["--sample-ms", "0"],
        ["--warmup", "-1"],
        ["--threads", "-1"],
        ["--device", "no_such_device"],
    ],
    ids=[
        "batch-over-pool",
        "topk-0",
        "unknown-schema",
        "repeat-0",
        "sample-ms-0",
        "warmup-negative",
        "threads-negative",
        "bad-device",
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Bad sizes, names or devices exit 2 with one line on stderr."""
    assert main(["bench", "-q", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("relay bench: ") and "\n" not in err


def test_every_schema_skipped_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No generated module to compare (each skipped) is said as such, not as a shape
    that does not fit."""
    skipped = [(_pair("decode"), "no module relay.maps.decode")]
    monkeypatch.setattr(sides, "discover", lambda schemas=None: ([], skipped))
    assert main(["bench", "-q", "--schema", "decode"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "relay bench: decode skipped (no module relay.maps.decode)",
        "relay bench: no generated map to compare: every schema was skipped",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """``--device cuda`` on a machine without CUDA is a usage error, not a traceback."""
    assert main(["bench", "-q", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_quick_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``relay bench --quick`` exits 0 with every generated pair at every quick shape:
    values agree, ops are counted per method for all four sides (the checked floor's
    equal to the generated map's, the bare floor's without the host check), and every
    time, ratio, host time per method and buffer size is there."""
    out_json = tmp_path / "bench.json"
    assert main(["bench", "--quick", "-q", "--json", str(out_json)]) == 0
    data = json.loads(out_json.read_text())
    assert {"date", "commit", "device", "machine", "torch"} <= set(data["meta"])
    assert [c["name"] for c in data["configs"]] == [
        p.name for p, _ in FOUND for _ in ((1,), (2,))
    ]
    ngram = [c for c in data["configs"] if c["schema"] == "sglang_ngram"]
    assert {c["hidden"] for c in ngram} == {0}
    assert [c["graph"] for c in data["configs"]].count(True) == 2
    sides_ = ("baseline", "generated", "floor", "bare")
    for config in data["configs"]:
        assert config["ok"] is True and config["problems"] == []
        ops, methods = config["ops"], config["methods"]
        assert ops["baseline"] > 0
        assert ops["generated"] == ops["floor"] == ops["bare"] > 0  # B <= 32
        assert methods["floor"] == methods["generated"] == methods["bare"]
        assert all(config["ns"][side] > 0 for side in sides_)
        for ratio in ("generated/baseline", "generated/floor", "generated/bare"):
            q = config[ratio]
            assert 0 < q["p25"] <= q["median"] <= q["p75"]
        host = config["host_ns"]
        assert list(host["generated"]) == [*methods["generated"], "step"]
        assert list(host["baseline"]) == [*methods["baseline"], "step"]
        assert config["bytes"]["generated"] > 0 and config["bytes"]["baseline"] > 0
        assert config["floor_missing"] is None
        assert "index_select(0, idx)" in config["floor_source"]
        assert "tolist()" in config["floor_source"]
        assert "tolist()" not in config["bare_source"].replace("h.tolist()", "")
    out = capsys.readouterr().out
    for column in ("gen/baseline", "gen/floor", "gen/bare", "floor us", "bare us"):
        assert column in out
    assert "baseline: the sglang-style map an engine keeps by hand" in out
    assert "host us per step, and per method" in out
    assert "index_copy_" in out and "one function per method in step order" in out
    assert "values: generated == baseline == floors in every configuration" in out


@pytest.mark.parametrize("pair,generated", FOUND, ids=[p.name for p, _ in FOUND])
def test_host_time_per_method_sums_to_the_step(
    pair: Pair, generated: sides.Generated
) -> None:
    """The breakdown of a step's host time names each method of the step, in its
    order, for the generated map and its baseline; each part is a time, and the parts
    lie inside the step they were measured in. How much of the step they make up
    depends on how busy the machine is, so it is not asserted."""
    shape = _shapes(TINY, pair)[0]
    work = Workload.random(shape, CPU, 0)
    both = sides.pair_sides(pair, generated, shape, CPU, work)
    got = per_method([side.calls for side in both], CPU, repeat=3, inner=20)
    for side, parts in zip(both, got):
        assert list(parts) == [*(m for m, _ in side.calls), "step"]
        methods = sum(ns for m, ns in parts.items() if m != "step")
        assert all(ns > 0 for ns in parts.values())
        assert methods <= parts["step"]


@pytest.mark.parametrize("batch", [4, 40])
def test_the_floors_check_refuses_a_bad_slot_before_any_row_changes(
    batch: int,
) -> None:
    """The checked floor's host check (a list up to 32 slots, ``aminmax`` above) is a
    check: a slot outside the pool raises before any row is written, as relay refuses
    it; the bare floor writes the rows before it and then raises, as torch does."""
    pair = _pair("decode")
    generated = {p.name: g for p, g in FOUND}["decode"]
    shape = Shape(257, batch)
    for check in (True, False):
        work, _, floor, other = _generated_and_plain(
            pair, generated, shape, check=check
        )
        work.renew(shape, torch.Generator().manual_seed(1))
        _bind(floor, work)  # new tokens: a row written is a row changed
        buf = other.map.output_tokens_buf
        before = buf.clone()
        work.indices[-1] = 257  # one past the pool, after the good slots
        stash = dict(floor.calls)["stash"]
        with pytest.raises(IndexError):
            stash()
        assert torch.equal(buf, before) is check


def test_bench_flags_import_no_torch() -> None:
    """Building ``relay bench``'s flags (as ``relay --help`` does) loads only the
    command line: no torch, no harness."""
    code = (
        "import sys, argparse\n"
        "from relay.bench import main\n"
        "main.add_arguments(argparse.ArgumentParser())\n"
        "print(sorted(m for m in sys.modules if m.startswith(('relay.bench', 'torch'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['relay.bench', 'relay.bench.main']"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--batch", "x"],
            "error: argument --batch: expected non-negative ints, got 'x'",
        ),
        (["--pool", "0"], "--topk and --batch must be >= 1, --pool >= 2"),
        (["--topk", "0"], "--topk and --batch must be >= 1, --pool >= 2"),
        (["--pool", "2", "--batch", "4"], "no shape fits"),
        (["--repeat", "0"], "--repeat must be >= 1 and --sample-ms > 0"),
        (["--sample-ms", "0"], "--repeat must be >= 1 and --sample-ms > 0"),
        (["--sample-ms", "nan"], "--repeat must be >= 1 and --sample-ms > 0"),
        (["--warmup", "-1"], "--warmup and --threads must be >= 0"),
        (["--threads", "-1"], "--warmup and --threads must be >= 0"),
    ],
)
def test_a_bad_bench_flag_is_one_line_before_torch(argv: list[str], says: str) -> None:
    """A bad flag value: one line on stderr, exit 2, and torch never imported (it takes
    seconds; the bench would otherwise import it only to refuse the flag)."""
    code = (
        "import sys\nfrom relay.cli import main\ntry:\n"
        f"    code = main({['bench', *argv]!r})\n"
        "except SystemExit as stop:\n    code = stop.code\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.split() == ["2", "False"], done.stderr
    err = done.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("relay bench: "), err
    assert says in err[0], err


@pytest.mark.gpu
def test_cuda_run_agrees_and_counts(tmp_path: Path) -> None:
    """On CUDA every side runs, the values agree, and ops are counted."""
    out_json = tmp_path / "bench.json"
    assert main([*TINY_RUN, "--device", "cuda", "--json", str(out_json)]) == 0
    configs = json.loads(out_json.read_text())["configs"]
    assert configs and all(c["ok"] and c["ops"]["generated"] > 0 for c in configs)
