"""``relay demo``: private generation, consistent map classes, its figures and its output."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from relay.cli.demo import ModeResult, bundled_schemas, main
from relay.codegen import explicit_job, run_job
from relay.engine import (
    EngineConfig,
    ModelConfig,
    RunResult,
    SchedulerConfig,
    SpecConfig,
    WorkloadConfig,
    run_workload,
)
from relay.engine.engine import ideal_speedup
from relay.engine.maps import MapSource
from relay.engine.relays import MapRelay

REPO = Path(__file__).resolve().parents[2]
SMALL = EngineConfig(
    model=ModelConfig(
        vocab_size=1024, hidden=64, layers=1, heads=2, ffn=128, max_context=128
    ),
    workload=WorkloadConfig(
        requests=16,
        min_prompt=4,
        max_prompt=24,
        min_output=2,
        max_output=16,
        arrival_rate=1.5,
    ),
    scheduler=SchedulerConfig(
        max_running=6, max_prefill_tokens=64, kv_pages=64, page_size=8
    ),
    debug=True,
)
TINY_DEMO = ["--model", "tiny", "--requests", "12", "--repeat", "2"]


def _result(wall: float, busy: float, tokens: int = 100) -> RunResult:
    return RunResult(
        outputs={},
        finish_reasons={},
        generated_tokens=tokens,
        wall_seconds=wall,
        forward_busy_seconds=busy,
        steps=1,
        idle_steps=0,
        decode_rows=0,
        decode_tokens=0,
    )


def test_ideal_speedup_is_sync_wall_over_the_longer_part() -> None:
    """Ideal = sync wall / max(forward busy, the rest); efficiency = measured / ideal,
    each pair from its own runs."""
    assert ideal_speedup(_result(10.0, 8.0)) == pytest.approx(1.25)
    assert ideal_speedup(_result(10.0, 3.0)) == pytest.approx(10.0 / 7.0)
    assert ideal_speedup(_result(10.0, 5.0)) == pytest.approx(2.0)
    sync = (_result(wall=1.0, busy=0.8), _result(wall=2.0, busy=1.0))
    overlap = (_result(wall=0.8, busy=0.7), _result(wall=1.9, busy=1.6))
    row = ModeResult("decode", sync, overlap)
    assert row.speedups == pytest.approx([1.25, 2.0 / 1.9])
    assert row.ideals == pytest.approx([1.25, 2.0])
    assert row.efficiencies == pytest.approx([1.0, (2.0 / 1.9) / 2.0])


def _table(rows: list[ModeResult], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The lines of the results table (and its notes) for ``rows``, as ``-q`` prints them."""
    from relay.cli.demo import _Reporter

    _Reporter(quiet=True).table(rows, ranks=1)
    return capsys.readouterr().out.splitlines()


def _cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_occupancy_is_the_headline_from_each_run_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The first figure is the overlap runs' occupancy, median and range, each from one
    run: no sync run, however slow, moves it, and it cannot pass 100%."""
    overlap = (_result(1.0, 0.9), _result(1.0, 0.98), _result(1.0, 0.95))
    for sync_wall in (1.0, 50.0):  # a sync run slowed down by other load
        sync = (_result(sync_wall, 0.8),) * 3
        lines = _table([ModeResult("decode", sync, overlap)], capsys)
        header, row = _cells(lines[0]), _cells(lines[2])
        assert header[:3] == ["mode", "occupancy overlap", "occupancy sync"]
        assert row[1] == "95.0% (90.0-98.0)"


def test_a_pair_above_its_ideal_is_shown_marked_and_listed_not_capped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three pairs, one of them 119% of its ideal (the median stays below 100%): the
    efficiency shows its range and a mark, and a line lists the pair with its numbers.
    Nothing is capped at 100% or waved off as noise."""
    sync = (_result(1.0, 0.8),) * 3  # ideal 1.25x
    overlap = (_result(0.85, 0.8), _result(1.0 / 1.4875, 0.6), _result(0.9, 0.8))
    lines = _table([ModeResult("decode", sync, overlap)], capsys)
    header, row = _cells(lines[0]), _cells(lines[2])
    cell = dict(zip(header, row))
    assert cell["speedup"] == "1.18x (1.11-1.49)" and cell["ideal"] == "1.25x"
    assert cell["efficiency"] == "94% (89-119)*"
    assert "100%" not in "\n".join(lines[:3]) and "noise" not in "\n".join(lines)
    assert len(lines) == 4
    assert lines[3].startswith(
        "* pairs above their ideal: decode 119% (1.49x against 1.25x)."
    )


def test_demo_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    """On a tiny model: all loops run, the table has the occupancy, ideal and efficiency
    columns."""
    code = main([*TINY_DEMO, "--debug"])
    out = capsys.readouterr().out
    assert code == 0
    assert "all outputs identical" in out
    for column in (
        "occupancy overlap",
        "occupancy sync",
        "speedup",
        "ideal",
        "efficiency",
        "accept len",
        "retracted",
        "aborted",
        "chunks",
        "prebuilt",
    ):
        assert column in out
    # Each loop ran twice per mode, after one warm-up; not a terminal: no escape codes.
    assert out.count("decode sync ") == 2 and out.count("eagle overlap ") == 2
    assert out.count("ngram overlap ") == 2
    assert "\x1b[" not in out


def test_demo_quiet_prints_only_the_table_and_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``relay demo -q``: no steps and no per-run lines: the table, then the line
    listing pairs above their ideal when the machine's load made one (whether it does
    is up to the machine, so either is accepted), then the verdict."""
    assert main([*TINY_DEMO, "--mode", "decode", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["mode", "occupancy", "overlap"]
    assert lines[2].startswith("decode")
    assert lines[-1].startswith("all outputs identical")
    notes = lines[3:-1]
    assert len(notes) <= 1 and all(x.startswith("* pairs above their") for x in notes)


def test_demo_never_touches_the_callers_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run inside a project with a broken schema: its files stay as they were."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.relay]\nschemas = ["schemas/*.py"]\nout = "maps"\n'
    )
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "mine.py").write_text("SCHEMA = this is not python\n")
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "mine.py").write_text("# the user's own module\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    monkeypatch.chdir(tmp_path)
    assert main([*TINY_DEMO, "--repeat", "1", "--mode", "decode"]) == 0
    out = capsys.readouterr().out
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
    assert "into a private folder" in out
    private = Path(out.split("into a private folder, ")[1].split()[0])
    assert not private.is_relative_to(tmp_path)
    assert not private.exists()  # removed when the demo ended


def test_demo_without_bundled_schemas_runs_the_packaged_maps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Installed from a wheel (no schemas/ beside relay/): it says so and runs relay.maps."""
    from relay.cli import demo

    monkeypatch.setattr(demo, "bundled_schemas", lambda: None)
    assert main([*TINY_DEMO, "--repeat", "1", "--mode", "decode"]) == 0
    out = capsys.readouterr().out
    assert "the bundled schemas are not installed with this package" in out
    assert "relay/maps/decode.py" in out


def test_engine_uses_the_classes_of_each_generation(tmp_path: Path) -> None:
    """Two generations of the eagle map in one process (the second from an edited
    schema): each run uses its own generation's map and payload classes together."""
    schemas = bundled_schemas()
    assert schemas is not None, "a source checkout has schemas/ beside relay/"
    edited = tmp_path / "edited"
    edited.mkdir()
    for path in schemas:
        shutil.copy(path, edited / path.name)
    eagle = edited / "eagle.py"
    text = eagle.read_text()
    eagle.write_text(text.replace("SCHEMA = Schema(", "# edited\nSCHEMA = Schema(", 1))
    first, second = tmp_path / "first", tmp_path / "second"
    run_job(explicit_job(schemas, first))
    run_job(explicit_job(sorted(edited.glob("*.py")), second))
    assert (first / "eagle.py").read_bytes() != (second / "eagle.py").read_bytes()

    used: list[tuple[type, type]] = []
    original = MapRelay.stash

    def spy(self: MapRelay, *args: object) -> None:
        used.append((type(self.map), self.maps.eagle_payload))
        original(self, *args)  # type: ignore[arg-type]

    config = attrs.evolve(SMALL, spec=SpecConfig(steps=2, topk=2), overlap=True)
    results = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MapRelay, "stash", spy)
        for folder in (first, second):
            used.clear()
            results.append(
                run_workload(attrs.evolve(config, maps=MapSource(str(folder))))
            )
            maps = MapSource(str(folder)).load()
            # A debug map is the generation's debug subclass of its map class.
            assert used
            assert all(
                issubclass(cls, maps.eagle) and payload is maps.eagle_payload
                for cls, payload in used
            )
    assert MapSource(str(first)).load().eagle is not MapSource(str(second)).load().eagle
    sync = run_workload(attrs.evolve(config, overlap=False))
    assert results[0].outputs == results[1].outputs == sync.outputs


def test_importing_the_engine_imports_no_map() -> None:
    """``import relay.engine`` binds no generated class (maps are loaded per run)."""
    probe = "import sys, relay.engine; print([m for m in sys.modules if m.startswith('relay.maps')])"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert done.stdout.strip() == "[]"


def test_engine_config_default_runs_the_packaged_maps() -> None:
    """Without a folder the engine runs ``relay.maps`` (what an installed wheel ships)."""
    maps = MapSource().load()
    assert maps.decode.__module__ == "relay.maps.decode"
    assert EngineConfig().maps == MapSource()


@pytest.mark.gpu
def test_demo_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    """``relay demo --device cuda`` on a tiny model: overlap matches sync on CUDA streams."""
    assert main([*TINY_DEMO, "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "run the engine on cuda" in out
    assert "all outputs identical" in out


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("folder", "is a folder"),
        ("empty folder", "is a folder"),
        ("missing folder", "no folder"),
        ("under a file", "no folder"),
        ("unwritable", "cannot write in"),
    ],
)
@pytest.mark.parametrize("flag", ["--trace", "--plot"])
def test_demo_refuses_an_output_it_cannot_write_before_running(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    where: str,
    says: str,
) -> None:
    """An existing folder, a missing one, a file in the way or an unwritable place:
    one line on stderr, exit 2, no run and nothing written."""
    (tmp_path / "out.png").mkdir()
    (tmp_path / "out.png" / "kept").write_text("")
    (tmp_path / "empty.png").mkdir()
    (tmp_path / "file").write_text("")
    path = {
        "folder": tmp_path / "out.png",
        "empty folder": tmp_path / "empty.png",
        "missing folder": tmp_path / "nowhere" / "out.png",
        "under a file": tmp_path / "file" / "out.png",
        # Not even root may create a file here.
        "unwritable": Path("/proc/relay-demo-out.png"),
    }[where]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main([*TINY_DEMO, flag, str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and flag in err[0], err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "empty.png").is_dir()


def test_flag_defaults_are_the_engines() -> None:
    """The defaults the flags show (written out, so that parsing needs no torch) are
    the engine's own."""
    from relay.cli.demo import DEFAULTS

    assert DEFAULTS == {
        "requests": WorkloadConfig().requests,
        "arrival_rate": WorkloadConfig().arrival_rate,
        "max_running": SchedulerConfig().max_running,
        "page_size": SchedulerConfig().page_size,
        "spec_steps": SpecConfig().steps,
        "topk": SpecConfig().topk,
    }


def test_one_rank_and_two_agree_except_where_an_abort_cut_a_request() -> None:
    """An abort comes at a step; how far a request got by then depends on the batches,
    so the ranks' check leaves aborted requests out, and only them."""
    ranked = attrs.evolve(
        _result(wall=1.0, busy=0.5),
        outputs={0: (5, 6), 1: (7,)},
        aborted_ids=(1,),
    )
    single = attrs.evolve(ranked, outputs={0: (5, 6), 1: (7, 8)}, aborted_ids=(1,))
    row = ModeResult("decode", (ranked,), (ranked,), single)
    assert row.ranks_agree and row.identical
    wrong = attrs.evolve(single, outputs={0: (5, 9), 1: (7, 8)})
    assert not ModeResult("decode", (ranked,), (ranked,), wrong).identical
