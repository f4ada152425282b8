"""``relay demo``: private generation, consistent map classes, its figures and its output."""

from __future__ import annotations

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
    """Ideal = sync wall / max(forward busy, the rest); efficiency = measured / ideal."""
    assert ideal_speedup(_result(10.0, 8.0)) == pytest.approx(1.25)
    assert ideal_speedup(_result(10.0, 3.0)) == pytest.approx(10.0 / 7.0)
    assert ideal_speedup(_result(10.0, 5.0)) == pytest.approx(2.0)
    row = ModeResult(
        "decode",
        sync=(_result(10.0, 8.0), _result(10.0, 8.0), _result(10.0, 8.0)),
        # Pairs: 1.1x, 1.2x and one noisy 3.0x; the median pair decides.
        overlap=(
            _result(10.0 / 1.1, 9.0),
            _result(10.0 / 1.2, 9.0),
            _result(10.0 / 3.0, 3.0),
        ),
    )
    assert row.speedup == pytest.approx(1.2)
    assert row.ideal == pytest.approx(1.25)
    assert row.efficiency == pytest.approx(1.2 / 1.25)


def test_demo_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    """On a tiny model: all loops run, the table has the ideal and efficiency columns."""
    code = main([*TINY_DEMO, "--debug"])
    out = capsys.readouterr().out
    assert code == 0
    assert "all outputs identical" in out
    for column in ("speedup", "ideal", "efficiency", "occupancy overlap", "accept len"):
        assert column in out
    # Each loop ran twice per mode, after one warm-up; not a terminal: no escape codes.
    assert out.count("decode sync ") == 2 and out.count("eagle overlap ") == 2
    assert "\x1b[" not in out


def test_demo_quiet_prints_only_the_table_and_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``relay demo -q``: no steps and no per-run lines, the table and the verdict."""
    assert main([*TINY_DEMO, "--mode", "decode", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["mode", "sync"]
    assert lines[2].startswith("decode")
    assert lines[-1].startswith("all outputs identical")
    assert len(lines) == 4


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
