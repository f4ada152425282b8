"""What the rest of the machine did while a run ran: the CPU time other processes used.

``relay demo`` compares two runs of the same work, and another process's load slows
one more than the other. It measures that load around each run rather than guessing:
the CPU time every process used (``/proc/stat``, Linux) less this process's own and
its children's (``getrusage``), and the time the host took from this machine when it
is a virtual one (``steal``). Elsewhere only the load average is known.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

__all__ = ["Load", "Meter", "cores", "pooled"]

_STAT = Path("/proc/stat")


def cores() -> int:
    """The machine's CPU cores (``/proc/stat`` counts them all, whatever this process
    may run on)."""
    return os.cpu_count() or 1


@attrs.frozen
class Load:
    """Other processes' CPU use during ``seconds`` of wall time."""

    seconds: float
    #: CPU seconds other processes used (None where ``/proc/stat`` is missing).
    others: float | None
    #: CPU seconds the host took from this virtual machine (None where not known).
    stolen: float | None
    #: The one-minute load average at the end (None where the system has none).
    load_average: float | None

    @property
    def others_cores(self) -> float | None:
        """Cores other processes kept busy, on average."""
        if self.others is None or self.seconds <= 0:
            return None
        return self.others / self.seconds

    @property
    def stolen_cores(self) -> float | None:
        if self.stolen is None or self.seconds <= 0:
            return None
        return self.stolen / self.seconds


def pooled(loads: Sequence[Load]) -> Load | None:
    """Several runs' loads as one (CPU seconds over wall seconds), None for none."""
    if not loads:
        return None
    others = [x.others for x in loads]
    stolen = [x.stolen for x in loads]
    return Load(
        seconds=sum(x.seconds for x in loads),
        others=None if None in others else sum(o for o in others if o is not None),
        stolen=None if None in stolen else sum(s for s in stolen if s is not None),
        load_average=loads[-1].load_average,
    )


def _machine_cpu() -> tuple[float, float] | None:
    """(busy, stolen) CPU seconds of every core since boot, or None off Linux."""
    try:
        first = _STAT.read_text(encoding="ascii").split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(x) for x in first[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    busy = ticks[0] + ticks[1] + ticks[2] + sum(ticks[5:7])
    steal = ticks[7] if len(ticks) > 7 else 0
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, steal / hz


def _own_cpu() -> float:
    """CPU seconds of this process (every thread) and its finished children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class Meter:
    """Measures other processes' load over a ``with`` block; ``load`` once it ends."""

    def __init__(self) -> None:
        self.load: Load | None = None
        self._start: tuple[float, tuple[float, float] | None, float] = (0.0, None, 0.0)

    def __enter__(self) -> None:
        self._start = (time.perf_counter(), _machine_cpu(), _own_cpu())

    def __exit__(self, *exc: object) -> None:
        wall0, machine0, own0 = self._start
        wall, machine, own = time.perf_counter(), _machine_cpu(), _own_cpu()
        others = stolen = None
        if machine0 is not None and machine is not None:
            others = max(0.0, machine[0] - machine0[0] - (own - own0))
            stolen = machine[1] - machine0[1]
        try:
            average: float | None = os.getloadavg()[0]
        except OSError:
            average = None
        self.load = Load(wall - wall0, others, stolen, average)
