"""Counts of a counted scatter gone wrong, planted into the reference engine: its n-gram
mode hands each request's accepted drafts to the next step by a counted scatter into a
packed target, laid out by the engine from each row's count (Note [Packed accepted
drafts] in relay/engine/runner.py). Planted, one row's count in the laid-out batch is
above its row's width, or -1, or one more than its batch laid out (within the width,
so its span runs into the next request's, or onto the next row); relay refuses the
resolve before the target changes, naming the map, the field and the request, debug
mode on and off (off also over the static buffers' in-place layout), in every seeded
schedule. Unplanted, every seeded schedule runs clean."""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs
import pytest
import torch
from schedule_support import SEEDS, replaying, seed_id
from test_engine_bugs import BASE, TINY

from relay import RelayError
from relay.engine import EngineConfig, SpecConfig, run_workload
from relay.engine.batch import ForwardBatch, SpecInfo, placeholders
from relay.engine.graphs import StaticInputs
from relay.engine.model import KVCache
from relay.engine.runner import ModelRunner

STEPS = 3
#: A vocabulary this small makes the outputs repeat, so the n-gram drafts are often
#: right and the counts vary from 0 to ``STEPS`` (the engine's acceptance test).
CONFIG = attrs.evolve(
    BASE,
    model=attrs.evolve(TINY, vocab_size=16),
    spec=SpecConfig(steps=STEPS, method="ngram"),
)


#: A plant: from a batch's counts, the row to plant into, the count its batch lays
#: out for it and the count it reads; ``None`` where the batch has no such row.
Pick = Callable[[list[int]], "tuple[int, int, int] | None"]


def _above_the_width(counts: list[int]) -> tuple[int, int, int] | None:
    """Row 0 reads one more than its row holds."""
    return 0, counts[0], STEPS + 1


def _minus_one(counts: list[int]) -> tuple[int, int, int] | None:
    """Row 0 reads -1."""
    return 0, counts[0], -1


def _one_short(counts: list[int], next_laid: bool) -> tuple[int, int, int] | None:
    """The first row that accepted drafts whose next row lays some (``next_laid``)
    or none (or is the last row): its batch lays one draft fewer out for it (a
    trim, the consumer's right) and it reads them all, one into the next span."""
    for row, count in enumerate(counts):
        after = counts[row + 1] if row + 1 < len(counts) else 0
        if count > 0 and (after > 0) == next_laid:
            return row, count - 1, count
    return None  # not in this batch


PLANTS: dict[str, tuple[Pick, tuple[str, ...]]] = {
    "above the width": (_above_the_width, (f"has a count of {STEPS + 1} value(s)",)),
    "minus one": (_minus_one, ("has a count of -1 value(s)",)),
    # The next request's drafts start where this one's last lands.
    "into the next span": (
        functools.partial(_one_short, next_laid=True),
        ("one would overwrite the other's values",),
    ),
    # The next row lays nothing (or there is none): this one's last lands past its row.
    "onto the next row": (
        functools.partial(_one_short, next_laid=False),
        ("outside its batch row",),
    ),
}


@attrs.define
class Planted:
    """Where the plant changed a count: the batch's draft input, its row, the packed
    target as it was laid out and the bonus tokens the draft input held then."""

    info: SpecInfo
    row: int
    rid: int
    laid_out: torch.Tensor
    bonus: torch.Tensor


def _plant(monkeypatch: pytest.MonkeyPatch, pick: Pick) -> list[Planted]:
    """The engine lays its batches' drafts out as shipped, but for one row of the
    first batch ``pick`` chooses: laid out for one count, read with another. In an
    eager forward, and in one over a bucket's static buffers."""
    planted: list[Planted] = []
    shipped, shipped_static = SpecInfo.lay_out_drafts, StaticInputs.lay_out_drafts
    shipped_runner = ModelRunner._lay_out_drafts
    batches: list[ForwardBatch] = []  # the batch being laid out

    def remembering(self: ModelRunner, batch: ForwardBatch) -> None:
        batches[:] = [batch]
        shipped_runner(self, batch)

    def laying_out(self: SpecInfo, counts: torch.Tensor, width: int) -> None:
        chosen = None if planted else pick(counts.tolist())
        if chosen is None:
            shipped(self, counts, width)
            return
        row, laid, read = chosen
        laid_counts, read_counts = counts.clone(), counts.clone()
        laid_counts[row], read_counts[row] = laid, read
        shipped(self, laid_counts, width)
        self.accept_lens = read_counts
        laid_out = self.accept_tokens.clone()
        rid = batches[0].rids[row]
        planted.append(Planted(self, row, rid, laid_out, self.bonus_tokens))

    def laying_out_static(self: StaticInputs, kv: KVCache, steps: int) -> None:
        shipped_static(self, kv, steps)
        real = int(self.real.sum())
        chosen = None if planted else pick(self.accept_lens[:real].tolist())
        if chosen is None:
            return
        row, laid, read = chosen
        laid_counts = self.accept_lens.clone()
        laid_counts[row] = laid
        torch.cumsum(laid_counts, 0, out=self.accept_rows[1:])
        end = self.accept_rows[-1:]
        self.accept_tokens.copy_(placeholders(self.accept_tokens.numel(), end))
        self.accept_lens[row] = read
        info, rid = self.batch.spec_info, self.batch.rids[row]
        laid_out = info.accept_tokens.clone()
        planted.append(Planted(info, row, rid, laid_out, info.bonus_tokens))

    monkeypatch.setattr(SpecInfo, "lay_out_drafts", laying_out)
    monkeypatch.setattr(StaticInputs, "lay_out_drafts", laying_out_static)
    monkeypatch.setattr(ModelRunner, "_lay_out_drafts", remembering)
    return planted


def _refusal(config: EngineConfig) -> RelayError:
    """Run ``config``; the relay error it stopped on, wherever it was raised (one on
    the forward worker reaches the host as the cause of its error)."""
    try:
        run_workload(config)
    except Exception as error:  # the chain is inspected below
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, RelayError):
            cause = cause.__cause__
        if cause is None:
            raise
        return cause
    raise AssertionError("the run passed: the planted count went unreported")


#: Debug mode off and on; off, also with the decode steps over static buffers, whose
#: forward lays its bucket's drafts out in place and resolves into them.
MODES = {
    "fast": {"debug": False},
    "debug": {"debug": True},
    "fast/graphs": {"debug": False, "graphs": True},
}
EACH_MODE = pytest.mark.parametrize("mode", list(MODES))


@EACH_MODE
@pytest.mark.parametrize("seed", SEEDS, ids=seed_id)
def test_the_engine_as_shipped_lays_its_counts_out_clean(mode: str, seed: int) -> None:
    """No refusal and no report: every count the engine lays out is its row's, and
    drafts were handed over (acceptance well above the bonus token alone)."""
    config = attrs.evolve(CONFIG, **MODES[mode])
    with replaying(seed):
        result = run_workload(config)
    assert len(result.outputs) == CONFIG.workload.requests
    assert result.accept_length > 2.0, result.accept_length
    assert not config.graphs or sum(result.bucket_steps.values()) > 0


@pytest.mark.parametrize("plant", sorted(PLANTS))
@EACH_MODE
@pytest.mark.parametrize("seed", [None, *SEEDS], ids=seed_id)
def test_a_planted_count_is_refused_before_the_target_changes(
    monkeypatch: pytest.MonkeyPatch, plant: str, mode: str, seed: int | None
) -> None:
    """Refused at the resolve, naming the map, the field and the request whose count
    is wrong; the packed target still holds what the batch laid out."""
    pick, messages = PLANTS[plant]
    planted = _plant(monkeypatch, pick)
    with replaying(seed):
        refused = _refusal(attrs.evolve(CONFIG, **MODES[mode]))
    assert planted, "no batch had a row to plant into"
    (where,) = planted
    text = str(refused)
    assert text.startswith("NgramFutureMap.accept_tokens: "), text
    assert f"request {where.rid} (row {where.row}, slot " in text, text
    assert any(m in text for m in messages), text
    assert torch.equal(where.info.accept_tokens, where.laid_out), "the target changed"
    assert where.info.bonus_tokens is where.bonus, "the resolve wrote another field"
