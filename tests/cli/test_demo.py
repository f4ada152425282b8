"""``relay demo``: private generation, consistent map classes, its figures and its output."""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from relay.cli.demo import (
    ModeResult,
    add_arguments,
    bundled_schemas,
    config_from_args,
    graphs_on,
    main,
)
from relay.cli.machine import Load
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


def _table(
    rows: list[ModeResult],
    *,
    width: int = 80,
    terminal: bool = True,
    wide: bool = False,
    ranks: int = 1,
    threads: int = 2,
) -> list[str]:
    """The lines of the results table (and its notes) for ``rows``, as ``-q`` prints
    them on a terminal ``width`` columns wide, or off a terminal."""
    from rich.console import Console

    from relay.cli.demo import _Reporter

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=terminal, color_system=None)
    _Reporter(quiet=True, wide=wide, console=console).table(rows, ranks, threads)
    return out.getvalue().splitlines()


def _header_and_rows(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """The column names (a header's lines joined) and each mode's cells, read back from
    the printed table: columns are what two or more blanks on every line separate."""
    rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", " ", "─"})
    end = next(
        (i for i in range(rule + 1, len(lines)) if lines[i][:1] in ("*", "!")),
        len(lines),
    )
    table = [
        line.ljust(max(map(len, lines)))
        for line in lines[:rule] + lines[rule + 1 : end]
    ]
    blank = [all(line[i] == " " for line in table) for i in range(len(table[0]))]
    bounds = [m.span() for m in re.finditer(r"F+", "".join("FB"[b] for b in blank))]

    def split(line: str) -> list[str]:
        return [line[a:b].strip() for a, b in bounds]

    names = [" ".join(w for w in col if w) for col in zip(*map(split, table[:rule]))]
    return names, [split(line) for line in table[rule:]]


#: Other processes' load during the runs, on a busy machine and on an idle one.
BUSY = Load(seconds=1.0, others=1.6, stolen=0.0, load_average=3.1)
IDLE = Load(seconds=1.0, others=0.1, stolen=0.0, load_average=0.2)


def _row(
    mode: str, sync_walls: list[float], overlap_walls: list[float], load: Load = IDLE
) -> ModeResult:
    """A mode's runs, 100 tokens each, the forward busy 80% of each sync run (ideal
    1.25x) and 90% of each overlap run."""
    sync = tuple(_result(w, 0.8 * w) for w in sync_walls)
    overlap = tuple(_result(w, 0.9 * w) for w in overlap_walls)
    loads = (load,) * len(sync_walls)
    return ModeResult(mode, sync, overlap, None, loads, loads)


def test_every_figure_of_a_row_comes_from_the_same_totals() -> None:
    """The speedup is the ratio of the two tok/s columns as printed: all come from each
    loop's summed tokens and wall time, where a median of pair ratios beside the
    throughputs could contradict them. Occupancy, the headline, comes first."""
    # Pair ratios 2.0, 0.5 and 0.5: their median, 0.5x, is not the loops' 0.67x.
    row = _row("decode", [1.0, 1.0, 1.0], [0.5, 2.0, 2.0])
    names, (cells,) = _header_and_rows(_table([row], width=250, wide=True))
    assert names[:2] == ["mode", "occupancy overlap"]
    cell = dict(zip(names, cells))
    sync = float(cell["tok/s sync"].replace(",", ""))
    overlap = float(cell["tok/s overlap"].replace(",", ""))
    assert (sync, overlap) == (100.0, 67.0)
    assert cell["speedup"] == f"{overlap / sync:.2f}x!" == "0.67x!"
    assert cell["pairs range"] == "0.50-2.00x"
    assert cell["ideal"] == "1.25x" and cell["efficiency"] == "53%"
    assert cell["occupancy overlap"] == "90.0%" and cell["occupancy sync"] == "80.0%"


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_default_table_is_whole_at_80_columns(terminal: bool, ranks: int) -> None:
    """At 80 columns every header and cell of the default table is printed whole, with
    the widest figures a run gives (5-digit tok/s, marked speedups), and the notes are
    folded at the width, not cut."""
    rows = [
        _row("decode", [0.01] * 3, [0.008] * 3),
        _row("eagle", [0.004] * 3, [0.5] * 3, BUSY),
        _row("ngram", [1.0] * 3, [0.4] * 3),
    ]
    lines = _table(rows, width=80, terminal=terminal, ranks=ranks)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert not any("…" in line for line in lines)
    names, cells = _header_and_rows(lines)
    want = ["mode", "occupancy overlap", "tok/s sync", "tok/s overlap", "speedup"]
    want += ["ideal", "accept length", "outputs identical"]
    assert names == want + ["1 rank agrees"] * (ranks > 1)
    assert [c[0] for c in cells] == ["decode", "eagle", "ngram"]
    assert cells[0][1:6] == ["90.0%", "10,000", "12,500", "1.25x", "1.25x"]
    assert cells[1][4] == "0.01x!" and cells[2][4] == "2.50x*"
    notes = " ".join(line.strip() for line in lines[6:])  # header, rule, 3 rows
    assert "! eagle: overlap was slower than sync, 0.01x against an ideal" in notes
    assert "* ngram: 2.50x against an ideal of 1.25x." in notes


def test_wide_adds_the_other_columns() -> None:
    """``--wide``: each loop's occupancy, the pairs' range, efficiency, other
    processes' CPU use and the scheduling counters."""
    lines = _table([_row("decode", [1.0], [0.9])], width=250, wide=True)
    names, _ = _header_and_rows(lines)
    assert set(names) >= {
        "occupancy sync",
        "pairs range",
        "efficiency",
        "other CPU sync",
        "other CPU overlap",
        "retracted",
        "aborted",
        "chunks",
        "prebuilt",
    }


def _notes(lines: list[str]) -> str:
    """The notes under a one-mode table (header, rule, row), unfolded."""
    return " ".join(line.strip() for line in lines[4:])


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The notes as on a 2-core machine, whatever this one has."""
    from relay.cli import demo

    monkeypatch.setattr(demo, "cores", lambda: 2)


@pytest.mark.usefixtures("two_cores")
def test_overlap_slower_than_sync_says_what_the_machine_was_doing() -> None:
    """A mode that lost to the synchronous loop gets a note with other processes' CPU
    use during each loop's runs, as measured, and whether that left the overlap loop's
    two threads a core each."""
    busy = _notes(_table([_row("decode", [1.0, 1.0], [1.2, 1.1], BUSY)], threads=2))
    idle = _notes(_table([_row("decode", [1.0, 1.0], [1.2, 1.1], IDLE)], threads=2))
    for note, used in ((busy, 1.6), (idle, 0.1)):
        assert note.startswith("! decode: overlap was slower than sync, 0.87x against")
        assert f"other processes used {used:.1f} of this machine's 2 cores" in note
    assert "with about 0.4 cores free they took turns" in busy
    assert "the machine's load does not explain it" in idle
    assert "the 20% of a sync step it can hide" in idle
    assert "took turns" not in idle


@pytest.mark.usefixtures("two_cores")
def test_a_mode_above_its_ideal_is_marked_and_explained_not_capped() -> None:
    """Overlap faster than its ideal: shown as measured with a mark, and a note with
    the two loops' loads. Nothing is capped at the ideal or waved off as noise."""
    lines = _table([_row("decode", [1.0, 1.0], [0.7, 0.7], BUSY)])
    names, (cells,) = _header_and_rows(lines)
    cell = dict(zip(names, cells))
    assert cell["speedup"] == "1.43x*" and cell["ideal"] == "1.25x"
    note = _notes(lines)
    assert note.startswith("* decode: 1.43x against an ideal of 1.25x.")
    assert "other processes used 1.6" in note and "noise" not in note
    assert "may also give them a larger share of the CPU" in note
    idle = _notes(_table([_row("decode", [1.0, 1.0], [0.7, 0.7], IDLE)]))
    assert "other processes used 0.1" in idle and "larger share" not in idle


@pytest.mark.usefixtures("two_cores")
def test_notes_fit_80_columns_off_a_terminal() -> None:
    """Off a terminal the console is 160 wide so that the table never folds; the notes
    under it are prose and still wrap at 80 columns, with nothing dropped."""
    lines = _table(
        [_row("decode", [1.0, 1.0], [1.2, 1.1], BUSY)], width=160, terminal=False
    )
    notes = lines[4:]
    assert len(notes) > 1 and all(len(line) <= 80 for line in notes)
    assert _notes(lines).startswith("! decode: overlap was slower than sync")
    assert "other processes used 1.6 of this machine's 2 cores" in _notes(lines)


def test_demo_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a tiny model: all loops run; ``--wide`` prints every column, ``--json`` writes
    the same figures and each run's, and the speedup is the ratio of the throughputs."""
    figures = tmp_path / "demo.json"
    code = main([*TINY_DEMO, "--debug", "--wide", "--json", str(figures)])
    out = capsys.readouterr().out
    assert code == 0
    assert "all outputs identical" in out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mode ")) - 1
    names, rows = _header_and_rows(lines[start:])
    assert len(names) == 17 and [r[0] for r in rows] == ["decode", "eagle", "ngram"]
    # Each loop ran twice per mode, after one warm-up; not a terminal: no escape codes.
    assert out.count("decode sync ") == 2 and out.count("eagle overlap ") == 2
    assert out.count("ngram overlap ") == 2
    assert "\x1b[" not in out
    data = json.loads(figures.read_text())
    assert [m["mode"] for m in data["modes"]] == ["decode", "eagle", "ngram"]
    for mode, row in zip(data["modes"], rows):
        cell = dict(zip(names, row))
        assert [r["loop"] for r in mode["runs"]] == ["sync"] * 2 + ["overlap"] * 2
        ratio = mode["overlap_tokens_per_second"] / mode["sync_tokens_per_second"]
        assert mode["speedup"] == pytest.approx(ratio)
        assert cell["speedup"].rstrip("*!") == f"{mode['speedup']:.2f}x"
        assert cell["tok/s sync"] == f"{mode['sync_tokens_per_second']:,.0f}"
        assert cell["outputs identical"] == "yes" and mode["identical"]


def test_demo_quiet_prints_only_the_table_and_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``relay demo -q``: no steps and no per-run lines: the table, then a note when the
    machine's load put the speedup above its ideal or below 1.0x (whether it does is up
    to the machine, so either is accepted), then the verdict."""
    assert main([*TINY_DEMO, "--mode", "decode", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("mode ") and lines[3].startswith("decode ")
    assert lines[-1].startswith("all outputs identical")
    notes = lines[4:-1]
    assert not notes or notes[0].startswith(("* decode: ", "! decode: "))


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
    """An installation without relay/schemas/: it says so and runs relay.maps."""
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


def test_graphs_flag_turns_static_decode_steps_either_way() -> None:
    """``--graphs``/``--no-graphs`` choose the engine's static-buffer decode steps;
    without either, CUDA runs them (its graphs) and the CPU does not."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for flags, want in (([], False), (["--graphs"], True), (["--no-graphs"], False)):
        assert config_from_args(parser.parse_args(flags)).graphs is want, flags
    assert graphs_on(None, "cuda") and graphs_on(None, "cuda:1")
    assert not graphs_on(False, "cuda") and graphs_on(True, "cpu")
    assert not graphs_on(None, "cpu")


def test_help_lists_the_graphs_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``relay demo --help`` names both spellings and the per-device default."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--graphs, --no-graphs" in out
    assert "(default: on for CUDA, off on the CPU)" in out


def test_demo_with_graphs_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """``relay demo --graphs`` on the CPU runs the decode steps over static buffers,
    says so, and the overlap loop's tokens are the synchronous loop's."""
    assert main([*TINY_DEMO, "--mode", "eagle", "--repeat", "1", "--graphs"]) == 0
    out = capsys.readouterr().out
    assert "decode steps over static buffers" in out
    assert "all outputs identical" in out
