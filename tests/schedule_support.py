"""Seeded schedules for the planted-bug tests (Note [Seeded schedules] in
relay/cpu_stream.py): each bug must be reported in every one of ``SEEDS``, and a test
that fails prints the seed that replays it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from relay.cpu_stream import SeededSchedule, schedule_seed_from_env, seeded_schedule

#: The schedules each planted bug runs in; ``RELAY_SCHEDULE_SEED=7`` runs seed 7 alone.
SEEDS: tuple[int, ...] = (
    (seed,) if (seed := schedule_seed_from_env()) is not None else tuple(range(20))
)


def seed_id(seed: int | None) -> str:
    """A test id naming the schedule: ``seed_7``, or ``free`` (the OS interleaves)."""
    return "free" if seed is None else f"seed_{seed}"


@contextlib.contextmanager
def replaying(seed: int | None) -> Iterator[SeededSchedule | None]:
    """The block run in seeded schedule ``seed`` (``None``: threads run free). A
    failure inside prints the seed, and how to run that schedule alone."""
    if seed is None:
        yield None
        return
    try:
        with seeded_schedule(seed) as schedule:
            yield schedule
    except BaseException:
        print(
            f"failed in seeded schedule {seed}; replay it alone with "
            f"RELAY_SCHEDULE_SEED={seed} pytest ..."
        )
        raise
