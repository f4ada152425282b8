"""Adopted buffers that would write each other's rows, planted into the reference
engine: its decode steps over static buffers write the relay's rows into buffers the
engine allocates and the overlap map adopts (Note [Graph-written relay buffers] in
relay/engine/relays.py). Planted, the engine hands the map one tensor as both the
bonus tokens' and the new lengths' buffer (a stash of a bonus token would be read back
by the scheduler as a length), overlapping views of one allocation, or a float buffer
that requires grad; relay refuses each when the map is built, naming the map, the field
and the fix, before any step, in every seeded schedule. Unplanted, every seeded
schedule runs clean."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from schedule_support import SEEDS, replaying, seed_id
from test_engine_bugs import BASE

from relay import RelayError
from relay.engine import SpecConfig, run_workload
from relay.engine import relays as relays_module

#: The speculative modes, whose maps adopt a bonus-token and a lengths buffer; their
#: decode steps run over static buffers.
SPECS = {
    "eagle": SpecConfig(method="eagle", steps=3, topk=2),
    "ngram": SpecConfig(method="ngram", steps=3),
}
MAP = {"eagle": "EagleFutureMap", "ngram": "NgramFutureMap"}


def _config(mode: str) -> Any:
    return attrs.evolve(BASE, spec=SPECS[mode], graphs=True)


def _one_tensor(w: dict[str, Any]) -> dict[str, Any]:
    """The lengths' buffer is the tokens' buffer."""
    return {**w, "new_seq_lens": w["tokens"]}


def _overlapping(w: dict[str, Any]) -> dict[str, Any]:
    """The lengths' buffer is the tokens' allocation one row on."""
    tokens = w["tokens"]
    whole = torch.zeros(tokens.numel() + 1, dtype=tokens.dtype, device=tokens.device)
    return {**w, "tokens": whole[:-1], "new_seq_lens": whole[1:]}


def _requires_grad(w: dict[str, Any]) -> dict[str, Any]:
    """A float buffer (EAGLE's top-k probabilities) that requires grad."""
    return {**w, "topk_p": w["topk_p"].clone().requires_grad_(True)}


PLANTS = {
    "one tensor": (
        _one_tensor,
        (
            r"\.new_seq_lens: the buffer handed to the constructor shares storage with "
            r"\w+FutureMap\.output_tokens's buffer"
        ),
    ),
    "overlapping views": (
        _overlapping,
        (
            r"\.new_seq_lens: the buffer handed to the constructor shares storage with "
            r"\w+FutureMap\.output_tokens's buffer \(bytes"
        ),
    ),
    "requires grad": (
        _requires_grad,
        r"\.topk_p: the buffer handed to the constructor requires grad",
    ),
}
#: Each plant in each mode whose map holds the buffers it edits (n-gram's holds no
#: float buffer).
CASES = [
    (plant, mode)
    for plant in sorted(PLANTS)
    for mode in sorted(SPECS)
    if plant != "requires grad" or mode == "eagle"
]


@pytest.mark.parametrize("mode", sorted(SPECS))
@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_the_adopted_buffers_run_clean(mode: str, seed: int) -> None:
    """No report: the engine's buffers are apart, the map adopted them, and the
    decode steps ran over them."""
    with replaying(seed):
        result = run_workload(_config(mode))
    assert len(result.outputs) == BASE.workload.requests
    assert sum(result.bucket_steps.values()) > 0


@pytest.mark.parametrize(("plant", "mode"), CASES)
@pytest.mark.parametrize("seed", [None, *SEEDS], ids=seed_id)
def test_buffers_that_would_write_each_other_are_refused(
    monkeypatch: pytest.MonkeyPatch, plant: str, mode: str, seed: int | None
) -> None:
    """Refused when the map is built, naming the map, the field and the fix: no step
    runs, whatever the schedule."""
    edit, message = PLANTS[plant]
    shipped = relays_module.Written

    def planted(**buffers: Any) -> Any:
        return shipped(**edit(buffers))

    monkeypatch.setattr(relays_module, "Written", planted)
    with replaying(seed), pytest.raises(RelayError, match=message) as raised:
        run_workload(_config(mode))
    assert str(raised.value).startswith(MAP[mode] + "."), raised.value
    assert "hand each field its own tensor" in str(raised.value) or (
        "requires_grad=False" in str(raised.value)
    )
