"""The bundled ``vllm_v1_drafts`` map agrees with the model of vLLM 0.33's V1 runner on
every ``input_ids`` it builds, over the schedules V1 runs (rows reordered, handed-over
rows not first, chunked prefills, requests sitting a step out with their -1 draft
placeholders left, draft widths changing per step, no speculation at all), with debug
mode off and on; debug mode reports nothing there, and names each planted bug with its
cause and the request's id."""

from __future__ import annotations

import importlib.util
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_support import V1Run, V2Run, lookup_plant, run_v1, run_v2

from relay import RelayDebugError, RelayError
from relay.testing import Namespace
from relay.testing.vllm_reference import V2Runner


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("width", [0, 3], ids=["no-speculation", "K=3"])
def test_the_v1_map_agrees_with_the_v1_runner(width: int, debug: bool) -> None:
    """20 runs of 60 steps: every input_ids equal, and (debug on) no report."""
    seen: Counter[str] = Counter()
    for seed in range(20):
        seen += Counter(run_v1(seed, 60, debug=debug, width=width).seen)
    assert seen["handed_over"] > 500
    assert seen["not_first"] > 50  # handed-over rows are not always the first rows
    if width:
        assert seen["left_placeholders"] > 10  # -1 left outside the spans
        assert seen["trimmed"] > 50
        assert seen["width_0"] > 50  # a step that proposed no drafts


def test_a_port_placing_its_own_drafts_runs_clean_in_debug_mode() -> None:
    """A port written against the last release: relay hands over the sampled token
    alone (every draft count 0) and the engine lays the scheduled drafts after it,
    after the resolve. The -1 placeholders it fills later are its own: no report."""
    seen: Counter[str] = Counter()
    for seed in range(10):
        seen += Counter(run_v1(seed, 60, debug=True, engine_drafts=True).seen)
    assert seen["handed_over"] > 200
    assert seen["engine_placed"] > 50
    assert seen["left_placeholders"] > 5


def _planted(plant: object, message: str) -> None:
    run = V1Run(1, debug=True)
    for _ in range(200):
        try:
            run.step(plant)  # type: ignore[arg-type]
        except RelayDebugError as error:
            assert re.search(message, str(error)), str(error)
            return
    raise AssertionError(f"debug mode never named: {message}")


def _swap(batch: Namespace, run: V1Run) -> None:
    """Two handed-over requests' slots swapped, their ids not."""
    if batch.slots.numel() >= 2:
        batch.slots = batch.slots[[1, 0, *range(2, batch.slots.numel())]]


def _more_drafts(batch: Namespace, run: V1Run) -> None:
    """The scheduler counts one draft more than the drafter made, every request's span
    laid out for it at the end of the target."""
    n = batch.slots.numel()
    if n and 0 < run.prev_width < run.width:
        span = run.width + 2
        base = batch.input_ids.numel()
        tail = torch.full((n * span,), -1, dtype=torch.int32)
        batch.input_ids = torch.cat([batch.input_ids, tail])
        batch.token_positions = base + torch.arange(n, dtype=torch.int32) * span
        batch.num_draft_tokens = torch.full((n,), run.prev_width + 1, dtype=torch.int32)


def _no_drafts_in_offsets(batch: Namespace, run: V1Run) -> None:
    """Offsets counted without the drafts: one position per request."""
    n = batch.slots.numel()
    if n > 1 and int(batch.num_draft_tokens.sum()):
        batch.token_positions = torch.arange(n, dtype=torch.int32)


@lookup_plant
def _lookup_swap(lookup: Namespace, run: V1Run) -> None:
    """The scheduler's lookup of kept counts swaps two requests' slots."""
    if lookup.slots.numel() >= 2:
        lookup.slots = lookup.slots[[1, 0, *range(2, lookup.slots.numel())]]


@pytest.mark.parametrize(
    ("plant", "message"),
    [
        (
            _swap,
            (
                r"VllmV1DraftsFutureMap\.sampled_tokens: slot \d+: resolve_future reads it "
                r"for request 'req-\d+' \(position 0\), but stash wrote it for request "
                r"'req-\d+'"
            ),
        ),
        (
            _more_drafts,
            (
                r"draft_tokens: request 'req-\d+' \(row \d+, slot \d+\) reads \d value\(s\), "
                r"but its stash wrote \d: the producer and the consumer disagree"
            ),
        ),
        (
            _no_drafts_in_offsets,
            (
                r"sampled_tokens: request 'req-\d+' \(row \d+, slot \d+\) starts at \d+, "
                r"inside the \d+ position\(s\) of request 'req-\d+'"
            ),
        ),
        (
            _lookup_swap,
            (
                r"kept_counts: slot \d+: resolve_kept_counts_cpu reads it for request "
                r"'req-\d+' \(position 0\), but publish wrote it for request 'req-\d+'"
            ),
        ),
    ],
    ids=["swapped slots", "more drafts than made", "offsets without drafts", "lookup"],
)
def test_each_planted_bug_is_named_with_its_cause_and_request(
    plant: object, message: str
) -> None:
    """Planted into the V1 schedule above, each bug is named by debug mode: the map,
    the field, the cause and the request's id."""
    _planted(plant, message)


class ExtraDraftOntoAPrefill:
    """One draft more than the batch laid out for a handed-over request whose next row
    is one relay does not write (a prefill, or a request absent from the last step):
    the extra draft would land on that row's first token. The producer made it."""

    def __init__(self) -> None:
        #: The planted batch, its ``input_ids`` before the resolve, the request's id.
        self.planted: tuple[Namespace, list[int], str] | None = None

    def __call__(self, batch: Namespace, run: V1Run) -> None:
        rows = batch.token_rows.tolist()
        ends = batch.query_start_loc.tolist()
        for j, row in enumerate(rows):
            nxt = row + 1
            count = int(batch.num_draft_tokens[j])
            if nxt < len(ends) - 1 and nxt not in rows and count < run.prev_width:
                batch.num_draft_tokens = batch.num_draft_tokens.clone()
                batch.num_draft_tokens[j] = count + 1
                self.planted = (batch, batch.input_ids.tolist(), batch.req_ids[j])
                return


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_an_extra_draft_onto_the_next_prefill_row_is_refused(debug: bool) -> None:
    """Planted into V1's schedule, with debug mode off and on: refused before
    ``input_ids`` changes, naming the map, the field, the request's id, its row and
    the fix (the map's positions outside the handed-over spans are the engine's, so
    this is the batch rows' check, not debug mode's placeholder check)."""
    run = V1Run(3, debug=debug)
    plant = ExtraDraftOntoAPrefill()
    for _ in range(200):
        try:
            run.step(plant)
        except RelayError as error:
            assert plant.planted is not None, error
            batch, before, rid = plant.planted
            assert re.match(
                rf"VllmV1DraftsFutureMap\.draft_tokens: request '{rid}' \(row \d+, "
                r"slot \d+\) would lay its \d value\(s\) at positions \d+ to \d+, "
                r"outside its batch row \d+ \(positions \d+ to \d+ by "
                r"batch\.query_start_loc\): position \d+ is batch row \d+'s first, "
                r"another request's\. Lay out each request's row",
                str(error),
            ), str(error)
            assert not isinstance(error, RelayDebugError)
            assert batch.input_ids.tolist() == before
            return
    raise AssertionError("the extra draft was never refused")


def test_the_v2_model_follows_the_prefill_rule() -> None:
    """V2's combine: a prompt tail padded with two draft placeholders keeps its prompt
    token and gets the slot's drafts; a decoding request gets its token and its one
    scheduled draft; a request mid-prefill gets nothing; drafts past the step's count
    are -1 in the state."""
    model = V2Runner(width=3)
    for rid, prefill in (("tail", 5), ("dec", 2), ("mid", 9)):
        model.add_request(rid, prefill)
    model.post_update("dec", [41, 42])
    model.set_drafts("dec", [7, 8, 9], count=2)
    model.set_drafts("tail", [5, 6, 4], count=3)
    assert model.draft_tokens["dec"] == [7, 8, -1]
    host = [100, -1, -1, 0, 0, 200, 201]
    ids = model.combine(
        ["tail", "dec", "mid"], [0, 3, 5, 7], [5 + 2, 4, 4], [2, 1, 0], host
    )
    assert ids == [100, 5, 6, 42, 7, 200, 201]


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("width", [0, 3], ids=["no-speculation", "K=3"])
def test_the_v2_map_agrees_with_the_v2_runner(width: int, debug: bool) -> None:
    """20 runs of 60 steps of V2's schedules: chunked prompts, prompt tails padded
    with drafts (the prompt token kept, the slot's drafts laid), requests mid-prefill
    stashing drafts alone, rows in any order, draft widths changing per step with -1
    past the count; every input_ids equal, and (debug on) no report."""
    seen: Counter[str] = Counter()
    for seed in range(20):
        seen += Counter(run_v2(seed, 60, debug=debug, width=width).seen)
    assert seen["token_laid"] > 500
    assert seen["mid_prefill"] > 100
    assert seen["not_first"] > 50
    if width:
        assert seen["prompt_tail_drafts"] > 20
        assert seen["width_0"] > 50


def _planted_v2(plant: object, message: str) -> None:
    run = V2Run(2, debug=True)
    for _ in range(200):
        try:
            run.step(plant)  # type: ignore[arg-type]
        except RelayDebugError as error:
            assert re.search(message, str(error)), str(error)
            return
    raise AssertionError(f"debug mode never named: {message}")


def _token_always(batch: Namespace, run: V2Run) -> None:
    """The last release's port: the token laid for every row, prefill or not."""
    batch.sampled_ready = torch.ones_like(batch.sampled_ready)


def _swap_v2(batch: Namespace, run: V2Run) -> None:
    """Two rows' slots swapped, their ids not."""
    ready = batch.sampled_ready.nonzero().reshape(-1)
    if ready.numel() >= 2:
        a, b = int(ready[0]), int(ready[1])
        slots = batch.slots.clone()
        slots[a], slots[b] = batch.slots[b], batch.slots[a]
        batch.slots = slots


def _drafts_past_the_step(batch: Namespace, run: V2Run) -> None:
    """A request scheduled more drafts than its row's step proposed."""
    counts = batch.num_draft_tokens
    last = len(batch.req_ids) - 1
    if last < 0 or not bool(batch.sampled_ready[last]):
        return
    made = run.produced[batch.req_ids[last]]
    if made < run.width and int(counts[last]) == made:
        batch.num_draft_tokens = counts.clone()
        batch.num_draft_tokens[last] += 1
        tail = torch.full((1,), -1, dtype=torch.int32)
        batch.input_ids = torch.cat([batch.input_ids, tail])


@pytest.mark.parametrize(
    ("plant", "message"),
    [
        (
            _token_always,
            (
                r"VllmV2DraftsFutureMap\.last_sampled: request 'req-\d+' \(row \d+, "
                r"slot \d+\) would write position \d+, which holds \d+, not a "
                r"placeholder"
            ),
        ),
        (
            _swap_v2,
            (
                r"VllmV2DraftsFutureMap\.last_sampled: slot \d+: resolve_future reads it "
                r"for request 'req-\d+' \(position \d+\), but (stash|seed) wrote it for "
                r"request 'req-\d+'"
            ),
        ),
        (
            _drafts_past_the_step,
            (
                r"draft_tokens: request 'req-\d+' \(row \d+, slot \d+\) reads \d "
                r"value\(s\), but its stash wrote \d"
            ),
        ),
    ],
    ids=["token laid in prefill", "swapped slots", "drafts past the step's"],
)
def test_each_planted_v2_bug_is_named_with_its_cause_and_request(
    plant: object, message: str
) -> None:
    """Planted into V2's schedule, each bug is named with the map, the field, the
    cause and the request's id."""
    _planted_v2(plant, message)


def _example() -> Any:
    """examples/vllm_v2_handover.py, the worked example of docs/integrating.md."""
    path = Path(__file__).parents[2] / "examples" / "vllm_v2_handover.py"
    spec = importlib.util.spec_from_file_location("vllm_v2_handover", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("k", [0, 3], ids=["no-speculation", "K=3"])
def test_the_worked_example_hands_over_what_the_v2_runner_does(k: int) -> None:
    """The docs' V2 glue, driven like V2's runner (chunked prompts, padded prompt
    tails, requests joining and ending, rows in any order, draft widths changing per
    step), builds the input_ids of V2's combine, in debug mode, with no report; and
    it stays within 40 lines of engine glue."""
    source = (
        Path(__file__).parents[2] / "examples" / "vllm_v2_handover.py"
    ).read_text()
    glue = source.split("# -- engine glue", 1)[1].split("# -- end of engine glue")[0]
    assert len([line for line in glue.splitlines()[1:] if line.strip()]) <= 40
    rng = random.Random(k)
    relay = _example().V2Relay("cpu", 8, k, debug=True)
    model = V2Runner(k)
    prompts: dict[str, list[int]] = {}
    done: dict[str, int] = {}
    made: dict[str, int] = {}
    for step in range(300):
        for rid in [r for r in prompts if done[r] >= len(prompts[r])]:
            if rng.random() < 0.1:
                relay.slots.finish([rid])
                model.remove_request(rid)
                del prompts[rid]
        if len(prompts) < 8 and rng.random() < 0.5:
            rid = f"r{step}"
            prompts[rid] = [rng.randrange(1, 99) for _ in range(rng.randint(1, 5))]
            done[rid], made[rid] = 0, k
            relay.add_request(rid)
            model.add_request(rid, len(prompts[rid]))
        rids = [r for r in prompts if rng.random() < 0.8]
        rng.shuffle(rids)
        host: list[int] = []
        ends, seq_lens, drafts = [0], [], []
        for rid in rids:
            prompt, at = prompts[rid], done[rid]
            chunk = rng.randint(1, len(prompt) - at) if at < len(prompt) else 0
            tail = chunk == 0 or at + chunk == len(prompt)
            n = rng.randint(0, made[rid]) if tail else 0
            host += prompt[at : at + chunk] + [-1] * (n + (chunk == 0))
            ends.append(len(host))
            seq_lens.append(at + ends[-1] - ends[-2])
            drafts.append(n)
        want = model.combine(rids, ends, seq_lens, drafts, list(host))
        ids = torch.tensor(host, dtype=torch.int32)
        b = Namespace(
            req_ids=rids,
            query_start_loc=torch.tensor(ends, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            num_draft_tokens=torch.tensor(drafts, dtype=torch.int32),
        )
        prefill = torch.tensor([len(prompts[r]) for r in rids], dtype=torch.int32)
        relay.combine(ids, b, prefill)
        assert ids.tolist() == want
        width = rng.randint(0, k)
        last, n_sampled = [], []
        for rid, s, n in zip(rids, seq_lens, drafts):
            sampled = []
            if s >= len(prompts[rid]):
                sampled = [rng.randrange(99) for _ in range(1 + rng.randint(0, n))]
                model.post_update(rid, sampled)
            done[rid] = s - (n + 1 - len(sampled)) if sampled else s
            last.append(sampled[-1] if sampled else 0)
            n_sampled.append(len(sampled))
        proposed = torch.full((len(rids), k), -1, dtype=torch.int64)
        proposed[:, :width] = torch.randint(0, 99, (len(rids), width))
        for i, rid in enumerate(rids):
            model.set_drafts(rid, proposed[i].tolist(), width)
            made[rid] = width
        relay.post_update(
            b,
            torch.tensor(last, dtype=torch.int64),
            torch.tensor(n_sampled),
            proposed,
            width,
        )


def test_the_docs_show_the_worked_example_as_it_runs() -> None:
    """docs/integrating.md quotes the example's engine glue verbatim."""
    root = Path(__file__).parents[2]
    source = (root / "examples" / "vllm_v2_handover.py").read_text()
    glue = source.split("# -- engine glue", 1)[1].split("# -- end of engine glue")[0]
    body = "\n".join(glue.splitlines()[1:]).strip("\n")
    assert f"```python\n{body}\n```" in (root / "docs" / "integrating.md").read_text()


def _v1_and_v2(debug: bool) -> list[tuple[Any, Namespace]]:
    """Each faithful map with request 'a' stashed in slot 2 and a batch handing it
    over: its token at position 0, one draft after it."""
    from relay.maps.vllm_v1_drafts import VllmV1DraftsFutureMap, VllmV1DraftsPayload
    from relay.maps.vllm_v2_drafts import VllmV2DraftsFutureMap, VllmV2DraftsPayload

    made = []
    for cls, payload, offsets in (
        (VllmV1DraftsFutureMap, VllmV1DraftsPayload, "token_positions"),
        (VllmV2DraftsFutureMap, VllmV2DraftsPayload, "logits_starts"),
    ):
        relay = cls("cpu", 8, num_speculative_tokens=2, debug=debug)
        relay.stash(
            torch.tensor([2]),
            payload(
                sampled_token_ids=torch.tensor([7], dtype=torch.int32),
                draft_token_ids=torch.tensor([[8, 9]]),
                num_draft_tokens=torch.tensor([2]),
            ),
            owners=["a"],
        )
        batch = Namespace(
            slots=torch.tensor([2]),
            req_ids=["a"],
            num_draft_tokens=torch.tensor([1]),
            sampled_ready=torch.tensor([True]),
            query_start_loc=torch.tensor([0, 2]),  # one row: the request's
            token_rows=torch.tensor([0]),
            input_ids=torch.full((2,), -1, dtype=torch.int32),
        )
        setattr(batch, offsets, torch.tensor([0]))
        made.append((relay, batch))
    return made


@pytest.mark.parametrize("read_twice", [False, True], ids=["never stashed", "read"])
def test_a_slot_with_nothing_to_hand_over_is_named_as_such(read_twice: bool) -> None:
    """Both runners' maps: a slot never stashed, or read already, is named as such,
    not as a -1 left by an offset one off (relay's int poison is -1, vLLM's
    placeholder too)."""
    for relay, batch in _v1_and_v2(True):
        if read_twice:
            relay.resolve_future(batch)
            assert batch.input_ids.tolist() == [7, 8]
            batch.input_ids = torch.full((2,), -1, dtype=torch.int32)
            cause = "was not written since it was last consumed"
        else:
            batch.slots = torch.tensor([5])
            cause = "was never written"
        with pytest.raises(RelayDebugError) as raised:
            relay.resolve_future(batch)
        message = str(raised.value)
        assert re.search(r"slot [25]: resolve_future reads a row that ", message)
        assert cause in message, message
        assert "one off" not in message and "still holds" not in message
