"""The engine's matrix: every mode with retraction, aborts, chunked prefill, mixed
batches and prebuilt requests each on and off, on 1 and 2 data-parallel ranks, maps
in debug mode and not, the overlap loop's decode steps eager or over the static
buffers of ``EngineConfig.graphs``: the overlap loop yields the synchronous (eager)
loop's tokens.

A seeded slice runs with the suite; the whole matrix is opt-in
(``RELAY_FULL_MATRIX=1 pytest -m slow tests/engine/test_matrix.py``), several minutes.
"""

from __future__ import annotations

import itertools
import os
import random

import attrs
import pytest

from relay.engine import (
    EngineConfig,
    ModelConfig,
    RunResult,
    SchedulerConfig,
    SpecConfig,
    WorkloadConfig,
    run_workload,
)
from relay.engine.compare import first_output_difference
from relay.engine.parallel import merge_results, run_data_parallel_many

MODES: dict[str, SpecConfig | None] = {
    "decode": None,
    "eagle": SpecConfig(steps=3, topk=2),
    "ngram": SpecConfig(steps=3, method="ngram"),
    # 0 to 3 drafts per request and step, as many as its n-gram match found.
    "ngram_variable": SpecConfig(steps=3, method="ngram", variable_drafts=True),
}
FEATURES = ("retract", "abort", "chunked", "mixed", "prebuilt")

TINY = ModelConfig(
    vocab_size=1024, hidden=32, layers=1, heads=2, ffn=64, max_context=96
)


@attrs.frozen
class Cell:
    """One configuration of the matrix."""

    mode: str
    on: frozenset[str]
    ranks: int
    debug: bool
    #: The overlap loop runs its decode steps over static buffers per bucket.
    graphs: bool = False

    def __str__(self) -> str:
        features = "+".join(f for f in FEATURES if f in self.on) or "plain"
        debug = "debug" if self.debug else "fast"
        static = "/graphs" if self.graphs else ""
        return f"{self.mode}/{features}/{self.ranks}rank/{debug}{static}"

    def config(self) -> EngineConfig:
        on = self.on
        return EngineConfig(
            model=TINY,
            spec=MODES[self.mode],
            workload=WorkloadConfig(
                requests=36,
                min_prompt=4,
                max_prompt=40,
                min_output=2,
                max_output=24,
                arrival_rate=1.5,
                abort_share=0.4 if "abort" in on else 0.0,
                prebuilt_share=0.3 if "prebuilt" in on else 0.0,
            ),
            scheduler=SchedulerConfig(
                max_running=6,
                max_prefill_tokens=24,
                # Tight with retraction (pages run out), ample without.
                kv_pages=10 if "retract" in on else 96,
                page_size=8,
                retract="retract" in on,
                chunked_prefill="chunked" in on,
                mixed="mixed" in on,
            ),
            debug=self.debug,
        )


def all_cells() -> list[Cell]:
    """Every cell of the matrix, in a fixed order."""
    subsets = [
        frozenset(f for f, bit in zip(FEATURES, bits) if bit)
        for bits in itertools.product((False, True), repeat=len(FEATURES))
    ]
    return [
        Cell(mode, on, ranks, debug, graphs)
        for mode in MODES
        for on in subsets
        for ranks in (1, 2)
        for debug in (True, False)
        for graphs in (False, True)
    ]


def _check(cell: Cell, sync: RunResult, overlap: RunResult) -> str | None:
    """What is wrong with a cell's pair of runs, or ``None``."""
    problem = first_output_difference(sync.outputs, overlap.outputs)
    if problem is not None:
        return f"{cell}: {problem}"
    if cell.graphs and not sum(overlap.bucket_steps.values()):
        return f"{cell}: no decode step ran over the static buffers"
    # A feature switched on must have happened, or the cell proves nothing about it.
    seen = {
        "retract": sync.retractions,
        "abort": sync.aborts,
        "chunked": sync.chunks,
        "prebuilt": sync.prebuilt,
    }
    missing = [f for f, n in seen.items() if f in cell.on and n == 0]
    if missing:
        return f"{cell}: never happened: {', '.join(missing)}"
    return None


def run_cells(cells: list[Cell]) -> list[str]:
    """Run each cell's sync and overlap loops; the problems found."""
    problems = []
    single = [c for c in cells if c.ranks == 1]
    for cell in single:
        config = cell.config()
        sync = run_workload(attrs.evolve(config, overlap=False))
        overlap = run_workload(attrs.evolve(config, overlap=True, graphs=cell.graphs))
        problems.append(_check(cell, sync, overlap))
    ranked = [c for c in cells if c.ranks == 2]
    if ranked:
        configs = [
            attrs.evolve(c.config(), overlap=overlap, graphs=overlap and c.graphs)
            for c in ranked
            for overlap in (False, True)
        ]
        results = [merge_results(r) for r in run_data_parallel_many(configs, 2)]
        for i, cell in enumerate(ranked):
            problems.append(_check(cell, results[2 * i], results[2 * i + 1]))
    return [p for p in problems if p is not None]


def test_matrix_slice() -> None:
    """Every feature on in each mode, debug maps, eager and over static buffers, and
    a seeded sample of other cells."""
    cells = all_cells()
    full = [
        c for c in cells if c.on == frozenset(FEATURES) and c.ranks == 1 and c.debug
    ]
    full += [
        c
        for c in cells
        if c.on == frozenset(FEATURES) and c.ranks == 1 and c.graphs and not c.debug
    ]
    rng = random.Random(24)
    sample = rng.sample([c for c in cells if c.ranks == 1 and c not in full], 3)
    problems = run_cells(full + sample)
    assert problems == [], "\n".join(problems)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RELAY_FULL_MATRIX") != "1",
    reason="the whole matrix takes minutes: RELAY_FULL_MATRIX=1 runs it",
)
def test_whole_matrix() -> None:
    """Every cell: overlap equals sync, and every feature switched on happened."""
    cells = all_cells()
    problems = run_cells(cells)
    print(f"{len(cells)} cells, {len(problems)} problems")
    assert problems == [], "\n".join(problems)
