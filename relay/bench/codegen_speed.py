"""Generator speed: how long ``relay.codegen`` takes as a schema grows.

A synthetic schema of N forward-lane fields (each a float32 ``(topk,)`` row gathered
into ``spec_info.f<i>``) is written to a temporary folder and planned (loaded,
validated, rendered) through ``relay.codegen``'s API, as ``relay generate`` does,
without writing the output.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

__all__ = ["GenerationTime", "generation_times", "wide_schema"]


@attrs.frozen
class GenerationTime:
    """One schema size: fields, seconds to plan it, and the generated module's size."""

    fields: int
    seconds: float
    lines: int


def wide_schema(fields: int) -> str:
    """The source of a schema module with ``fields`` forward-lane fields."""
    lines = [
        '"""A synthetic schema for the generator-speed table of relay bench."""',
        "",
        "import torch",
        "",
        "from relay.schema import Field, Lane, Schema",
        "",
        "SCHEMA = Schema(",
        f'    name="Wide{fields}FutureMap",',
        f'    doc="A relay of {fields} fields.",',
        "    fields=[",
    ]
    lines += [
        f'        Field("f{i}", lane=Lane.FORWARD, dtype=torch.float32, shape=("topk",), '
        f'target="spec_info.f{i}"),'
        for i in range(fields)
    ]
    lines += ["    ],", ")", ""]
    return "\n".join(lines)


def generation_times(sizes: Sequence[int]) -> tuple[float, list[GenerationTime]]:
    """The first generation in the process (templates compiled, one field) and then
    the time of each size in ``sizes``."""
    from relay.codegen import explicit_job, plan

    def timed(folder: Path, fields: int) -> GenerationTime:
        path = folder / f"wide_{fields}.py"
        path.write_text(wide_schema(fields), encoding="utf-8")
        job = explicit_job([path], folder / "out")
        start = time.perf_counter()
        planned = plan(job)
        seconds = time.perf_counter() - start
        return GenerationTime(fields, seconds, planned[0].content.count("\n"))

    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        folder = Path(tmp)
        (folder / "pyproject.toml").write_text("", encoding="utf-8")  # the project root
        first = timed(folder, 1).seconds
        return first, [timed(folder, n) for n in sizes]
