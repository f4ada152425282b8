"""What ``relay bench`` measures and for how long: shapes, presets and every default.

The one place a default lives; the command line, the harness and the docs read it
from here. Imports no torch, so ``relay --help`` stays fast.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import attrs

__all__ = [
    "BREAKDOWN",
    "DEFAULTS",
    "PRESETS",
    "Defaults",
    "Preset",
    "Shape",
]


@attrs.frozen
class Shape:
    """One benchmarked size: pool P, batch B and, for speculative maps, top-k K and
    hidden H (bf16; 0 means the hidden state is not relayed)."""

    pool: int
    batch: int
    topk: int = 0
    hidden: int = 0

    @property
    def label(self) -> str:
        """``P=257 B=32`` or ``P=257 B=32 K=8 H=4096``."""
        text = f"P={self.pool} B={self.batch}"
        if self.topk:
            text += f" K={self.topk} H={self.hidden}"
        return text

    def problem(self) -> str | None:
        """Why this shape cannot run, or None. Row 0 is the scratch row, so a pool of
        P rows holds at most P - 1 requests."""
        if self.pool < 2:
            return f"{self.label}: the pool needs at least 2 rows (row 0 is scratch)"
        if self.batch < 1:
            return f"{self.label}: the batch needs at least 1 request"
        if self.batch > self.pool - 1:
            return f"{self.label}: a pool of {self.pool} rows holds at most {self.pool - 1} requests"
        return None


@attrs.frozen
class Preset:
    """A grid of sizes; speculative maps take the cross product with ``topk`` and
    ``hidden``, plain decoding only ``pool`` x ``batch``."""

    pool: tuple[int, ...]
    batch: tuple[int, ...]
    topk: tuple[int, ...]
    hidden: tuple[int, ...]
    #: Field counts of the generator-speed table.
    fields: tuple[int, ...]

    def shapes(self, *, spec: bool) -> Iterator[Shape]:
        """Every shape of the grid that fits (batches larger than P - 1 are dropped)."""
        if spec:
            grid: Iterator[tuple[int, ...]] = itertools.product(
                self.pool, self.batch, self.topk, self.hidden
            )
        else:
            grid = ((p, b, 0, 0) for p, b in itertools.product(self.pool, self.batch))
        for pool, batch, topk, hidden in grid:
            shape = Shape(pool, batch, topk, hidden)
            if shape.problem() is None:
                yield shape

    def narrowed(
        self,
        *,
        pool: Sequence[int] | None = None,
        batch: Sequence[int] | None = None,
        topk: Sequence[int] | None = None,
        hidden: Sequence[int] | None = None,
    ) -> Preset:
        """This preset with the given axes replaced (the ``--pool`` ... flags)."""
        return attrs.evolve(
            self,
            pool=tuple(pool) if pool is not None else self.pool,
            batch=tuple(batch) if batch is not None else self.batch,
            topk=tuple(topk) if topk is not None else self.topk,
            hidden=tuple(hidden) if hidden is not None else self.hidden,
        )


#: Size presets. ``default`` is issue 7's grid (pool 257 and 4097; batch 1, 32, 256;
#: top-k 1 and 8; hidden 4096 and 7168 in bf16). ``draft_probs`` (P x vocab float32,
#: gigabytes) is in none of them.
PRESETS: dict[str, Preset] = {
    "quick": Preset(
        pool=(257,), batch=(1, 32), topk=(1,), hidden=(4096,), fields=(10, 100)
    ),
    "default": Preset(
        pool=(257, 4097),
        batch=(1, 32, 256),
        topk=(1, 8),
        hidden=(4096, 7168),
        fields=(10, 100, 1000),
    ),
    "full": Preset(
        pool=(257, 513, 2049, 4097),
        batch=(1, 8, 32, 64, 256),
        topk=(1, 4, 8),
        hidden=(0, 4096, 7168),
        fields=(10, 30, 100, 300, 1000),
    ),
}


@attrs.frozen
class Defaults:
    """How long and how carefully to measure; ``quick`` is the fast path the tests run."""

    preset: str
    #: Timed samples per side; a ratio is the median over them.
    repeat: int
    #: Untimed steps of each side before timing.
    warmup: int
    #: Target length of one sample: short, so a context switch spoils one sample
    #: (which the median drops) rather than all of them.
    sample_ms: float
    #: Steps driven with fresh outputs to check both sides resolve the same values.
    check_steps: int
    #: Size of each tensor of the copy-bandwidth probe.
    bandwidth_mb: int
    #: torch intra-op threads while timing (0 keeps torch's setting): the ops are
    #: small, and on a shared machine extra threads add only noise.
    threads: int = 1
    seed: int = 0


DEFAULTS: dict[str, Defaults] = {
    "default": Defaults(
        preset="default",
        repeat=15,
        warmup=3,
        sample_ms=0.25,
        check_steps=3,
        bandwidth_mb=64,
    ),
    "quick": Defaults(
        preset="quick",
        repeat=5,
        warmup=2,
        sample_ms=0.1,
        check_steps=2,
        bandwidth_mb=32,
    ),
}


@attrs.frozen
class BreakdownDefaults:
    """``relay bench --breakdown``: which maps, at which shape, how long."""

    #: Schemas broken down when ``--schema`` is not given.
    schemas: tuple[str, ...] = ("decode", "eagle")
    #: Sizes when no size flag is given: batch 1, the latency case.
    preset: Preset = Preset(
        pool=(4097,), batch=(1,), topk=(1,), hidden=(4096,), fields=()
    )
    #: Interleaved repeats; each statement's figure is the median over them.
    repeat: int = 100
    #: Target length of one sample of one statement or method: long enough that the
    #: first call of a sample (colder caches) weighs little in it.
    sample_ms: float = 0.3
    #: Each row's figure: this quantile of its samples (Note [Low quantile]).
    quantile: float = 0.1


BREAKDOWN = BreakdownDefaults()
