"""Two runs compared: the first request whose tokens differ, the first step whose
relayed inputs differ, named so a failure says where to look."""

from __future__ import annotations

from collections.abc import Mapping

from relay.engine.engine import RunResult

__all__ = ["first_input_difference", "first_output_difference"]


def first_output_difference(
    want: Mapping[int, tuple[int, ...]], got: Mapping[int, tuple[int, ...]]
) -> str | None:
    """``None`` when ``got`` has ``want``'s tokens; else the first request that differs,
    at which output position and with which tokens."""
    for rid in sorted(set(want) | set(got)):
        a, b = want.get(rid), got.get(rid)
        if a == b:
            continue
        if a is None or b is None:
            return f"token comparison: request {rid} is in only one of the runs"
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if at is None:
            return (
                f"token comparison: request {rid} has {len(b)} output tokens, "
                f"expected {len(a)} (the first {min(len(a), len(b))} agree)"
            )
        return (
            f"token comparison: request {rid} differs at output token {at}: "
            f"{b[at]}, expected {a[at]}"
        )
    return None


def first_input_difference(want: RunResult, got: RunResult) -> str | None:
    """``None`` when both runs (recorded with ``record_inputs``) fed every decode step
    the same input tokens; else the first step and request where they differ."""
    expected = {(step, rid): token for step, rid, token in want.inputs}
    for step, rid, token in got.inputs:
        other = expected.pop((step, rid), None)
        if other != token:
            return (
                f"step inputs: step {step}, request {rid}: the relay handed input "
                f"token {token}, the other run {other}"
            )
    if expected:
        (step, rid), token = min(expected.items())
        return f"step inputs: step {step}, request {rid}: only the other run decoded it"
    return None
