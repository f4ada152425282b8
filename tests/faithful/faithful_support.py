"""The faithful lockstep: a bundled ``sglang_*`` map beside ``SglangRelay`` (the model
of sglang 0.5.23's relay, ``relay/testing/sglang_reference.py``), driven by the calls an
sglang overlap loop makes, over random steps, and compared on every value handed over.

The driver keeps requests in slots as an engine does: a request is admitted (prefill
publishes its length and stashes its first values), decodes (the scheduler resolves
its lengths, waiting or stream-ordered, the forward resolves its draft input,
verification publishes and stashes again, on some EAGLE runs through buffers a captured
graph wrote), may be stashed again keeping extras, leave a staging area (a stash of its
last token alone and a fresh draft input from ``make_staged_spec_input``), ride in a
mixed batch as a decode tail (EAGLE runs without a staging area only: sglang runs no
mixed batch with n-gram, nor beside its staging area), and
ends (its slot released and reused); batches without a draft input pass by. It draws
only what a correct engine does, so the map may run in debug mode and any report of it
is a failure too. Some EAGLE runs' backends need no host lengths (no host copy, a mixed
batch's host lengths left None); some EAGLE runs' algorithm relays no top-k or no
hidden state although its payloads carry them; each draft input says whether its rows
hold the sparse indices, as sglang sets it. Some EAGLE runs have overlap off: the map
then only hands a mixed batch its running rows' last tokens (``stash_bonus_tokens``).
Each batch holds its requests as sglang's do (``reqs``, one ``Req`` per row), which the
maps read as their owners in debug mode; on half the runs every write names its
requests too (``owners=``), so each read is checked against them. Most plain decoding
runs admit beam-search requests, as sglang runs them under overlap: a leader's prefill
spawns its member slots and stashes the group's selected tokens into all of them; each
decode batch holding the leader carries the members' slots after the rows of its
``reqs``, listed by ``beam_tail``; its stash covers the ``reqs`` rows, then the group's
selection overwrites every row of the group (writes naming the leader for each); the
group's end releases its member slots with the leader's.
"""

from __future__ import annotations

import importlib
import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from relay.testing.sglang_reference import Req, SglangRelay, beam_rows

POOL = 10
MAX_LEN = 512
DIMS = {
    "topk": 2,
    "hidden": 3,
    "vocab": 5,
    "dsa_topk": 2,
    "draft_tokens": 3,
    "draft": 3,
}
#: The extras an EAGLE run carries once its first decode does (prefill may omit them).
EAGLE_EXTRAS = ("topk", "hidden_states", "draft_probs", "dsa_topk_indices")


class Divergence(AssertionError):
    """The map and the model handed a batch different values."""


def same(a: Any, b: Any) -> bool:
    """Equal values, dtypes and shapes (NaN equal to NaN); or equal plain values."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point:
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    return type(a) is type(b) and a == b


def map_class(name: str) -> type[Any]:
    """The bundled faithful map ``relay.maps.sglang_<name>``."""
    module = importlib.import_module(f"relay.maps.sglang_{name}")
    cls: type[Any] = getattr(module, f"Sglang{name.capitalize()}FutureMap")
    return cls


def payload_class(name: str) -> type[Any]:
    module = importlib.import_module(f"relay.maps.sglang_{name}")
    cls: type[Any] = getattr(module, f"Sglang{name.capitalize()}Payload")
    return cls


class Run:
    """One lockstep run of one algorithm (``decode``, ``eagle`` or ``ngram``)."""

    def __init__(self, algorithm: str, seed: int, *, debug: bool) -> None:
        self.algorithm = algorithm
        self.speculative = algorithm != "decode"
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.table = torch.randint(0, 10_000, (POOL, MAX_LEN), generator=self.gen)
        #: EAGLE: half the runs hand the map buffers a captured graph writes.
        self.adopted: dict[str, Tensor] = {}
        if algorithm == "eagle" and self.rng.random() < 0.5:
            self.adopted = {
                "output_tokens_buf": torch.empty(POOL, dtype=torch.int64),
                "new_seq_lens_buf": torch.empty(POOL, dtype=torch.int64),
            }
        #: EAGLE: which extras the algorithm relays (sglang's ``need_topk()`` and
        #: ``spec_need_hidden_states()``), whatever its payloads carry.
        switches: dict[str, bool] = {}
        if algorithm == "eagle":
            switches = {
                "need_topk": self.rng.random() < 0.75,
                "need_hidden_states": self.rng.random() < 0.75,
            }
        self.switched_off = not all(switches.values())
        self.map = map_class(algorithm)(
            "cpu", POOL, debug=debug, **self.adopted, **switches
        )
        self.payload = payload_class(algorithm)
        self.confidence = algorithm == "eagle" and self.rng.random() < 0.5
        #: EAGLE: some runs' attention backends need no host lengths
        #: (``needs_cpu_seq_lens=False``); n-gram always needs them.
        self.host = algorithm != "eagle" or self.rng.random() < 0.7
        #: EAGLE: some runs have overlap off (the map only relays mixed batches' tokens).
        self.overlap = algorithm != "eagle" or self.rng.random() < 0.85
        self.model = SglangRelay(
            algorithm,
            req_to_token=self.table,
            confidence=self.confidence,
            host_lengths=self.host,
            **switches,
        )
        self.free = list(range(1, POOL))
        #: The request holding each slot (sglang's ``Req``), and how many were admitted.
        self.reqs: dict[int, Req] = {}
        self.admitted = 0
        #: EAGLE and n-gram: whether this run's writes name their requests (a
        #: generator of its own, so the run's other draws stay as they were).
        self.named = random.Random(seed + 1_000_003).random() < 0.5
        #: Plain decoding: whether this run admits beam-search requests, and each
        #: leader's member slots (sglang's ``group.member_rows``).
        self.beam = algorithm == "decode" and self.rng.random() < 0.75
        self.members: dict[int, list[int]] = {}
        #: Slots whose request has values written and not yet read (its next step).
        self.pending: set[int] = set()
        #: EAGLE: the extras this run carries from its first decode on, and whether
        #: a decode has carried them yet (prefill before then omits them).
        self.extras = [e for e in EAGLE_EXTRAS if self.rng.random() < 0.7]
        self.decoded = False
        self.lengths: dict[int, int] = {}
        #: Per slot: whether the step that stashed its rows carried the sparse
        #: indices (sglang's per-draft-input flag).
        self.dsa: dict[int, bool] = {}
        self.history: list[str] = []
        #: What the run exercised (non-empty steps by kind), so a test can tell that a
        #: method was really compared and not only drawn.
        self.seen: Counter[str] = Counter()
        self.kinds = ["admit", "decode", "decode", "decode", "finish"]
        if self.speculative:
            self.kinds += ["no_draft_input", "no_future_indices"]
        if algorithm == "eagle":
            # sglang's staging area and mixed chunked prefill exclude each other.
            self.kinds += ["restash", "stage" if self.rng.random() < 0.4 else "mixed"]
        if not self.overlap:
            self.kinds = ["admit", "sync_mixed", "sync_mixed", "finish"]

    # -- values ------------------------------------------------------------------------
    def _ints(self, n: int, *shape: int, low: int = 0, dtype: torch.dtype) -> Tensor:
        return torch.randint(low, 1000, (n, *shape), generator=self.gen).to(dtype)

    def _floats(self, n: int, *shape: int, dtype: torch.dtype) -> Tensor:
        return torch.randn((n, *shape), generator=self.gen).to(dtype)

    def _payload(self, n: int, carry: bool) -> dict[str, Tensor | None]:
        """One step's payload for ``n`` rows, as sglang's worker builds it."""
        if self.algorithm == "ngram":
            lens = self._ints(n, low=0, dtype=torch.int32) % (DIMS["draft"] + 1)
            return {
                "accept_tokens": self._ints(n, DIMS["draft"], dtype=torch.int64),
                "accept_lens": lens,
            }
        bonus = self._ints(n, dtype=self.rng.choice([torch.int64, torch.int32]))
        values: dict[str, Tensor | None] = {"bonus_tokens": bonus}
        if self.algorithm == "decode":
            return values
        for name in ("topk_p", "topk_index", "hidden_states", "draft_probs"):
            values[name] = None
        values["dsa_topk_indices"] = None
        if not (carry and self.extras):
            return values
        if "topk" in self.extras:
            values["topk_p"] = self._floats(n, DIMS["topk"], dtype=torch.float32)
            values["topk_index"] = self._ints(n, DIMS["topk"], dtype=torch.int64)
        if "hidden_states" in self.extras:
            values["hidden_states"] = self._floats(
                n, DIMS["hidden"], dtype=torch.bfloat16
            )
        # Some runs stash draft probabilities without top-k: sglang hands None.
        if "draft_probs" in self.extras:
            values["draft_probs"] = self._floats(n, DIMS["vocab"], dtype=torch.float32)
        if "dsa_topk_indices" in self.extras:
            values["dsa_topk_indices"] = self._ints(
                n, DIMS["dsa_topk"], dtype=torch.int32
            )
        return values

    # -- batches -----------------------------------------------------------------------
    def _batch(self, slots: list[int]) -> SimpleNamespace:
        indices = torch.tensor(slots, dtype=torch.int64)
        batch = SimpleNamespace(
            req_pool_indices=indices,
            reqs=[self.reqs[slot] for slot in slots],
            beam_tail=None,
            input_ids=None,
            seq_lens=None,
            seq_lens_cpu=None,
            seq_lens_sum=None,
            confidence=None,
            confidence_cpu=None,
            spec_info=None,
            req_to_token=self.table,
        )
        if not slots:
            # sglang's idle batch (an idle data-parallel rank) comes with empty input
            # ids and lengths, which its resolves gather again (relay's leave alone).
            batch.input_ids = torch.empty((0,), dtype=torch.int64)
            batch.seq_lens = torch.empty((0,), dtype=torch.int64)
            if self.host:
                batch.seq_lens_cpu = torch.empty((0,), dtype=torch.int64)
                batch.seq_lens_sum = 0
        if self.speculative:
            batch.spec_info = SimpleNamespace(
                future_indices=indices.clone(),
                bonus_tokens=None,
                topk_p=None,
                topk_index=None,
                hidden_states=None,
                draft_probs=None,
                dsa_topk_indices=None,
                accept_tokens=None,
                accept_lens=None,
                # As sglang sets it per draft input: whether the step that
                # stashed each slot's rows carried the indices, and-ed over the
                # merged slots (an empty input takes the other's).
                future_dsa_topk_indices_available=all(
                    self.dsa.get(slot, False) for slot in slots
                ),
            )
        return batch

    def _pair(self, slots: list[int]) -> tuple[SimpleNamespace, SimpleNamespace]:
        return self._batch(slots), self._batch(slots)

    def _staged_pair(self, slots: list[int]) -> tuple[SimpleNamespace, SimpleNamespace]:
        """Batches whose draft input is a fresh one for staged requests: the map fills
        one, the model builds its own, and both must say the same."""
        got, want = self._pair(slots)
        indices = torch.tensor(slots, dtype=torch.int64)
        got.spec_info.future_indices = None
        got.spec_info.future_dsa_topk_indices_available = False
        self.map.make_staged_spec_input(indices, got.spec_info)
        staged = self.model.make_staged_spec_input(indices)
        want.spec_info.future_indices = staged.future_indices
        flag = staged.future_dsa_topk_indices_available
        want.spec_info.future_dsa_topk_indices_available = flag
        paths = [
            "spec_info.future_indices",
            "spec_info.future_dsa_topk_indices_available",
        ]
        self.compare("make_staged_spec_input", got, want, paths)
        self.seen["staged_dsa_flag"] += flag and bool(slots)
        return got, want

    def compare(self, what: str, got: Any, want: Any, paths: list[str]) -> None:
        for path in paths:
            a, b = got, want
            for part in path.split("."):
                a, b = getattr(a, part), getattr(b, part)
            if not same(a, b):
                recent = "\n  ".join(self.history[-10:])
                raise Divergence(
                    f"sglang_{self.algorithm}: after {what}, batch.{path} differs\n"
                    f"  map:   {a!r}\n  model: {b!r}\n"
                    f"recent steps (oldest first):\n  {recent}"
                )

    def _ready(self, most: int | None = None) -> list[int]:
        """Some pending slots whose every row is defined, in random order."""
        ready = sorted(s for s in self.pending if self._defined(s))
        k = self.rng.randint(0, len(ready) if most is None else min(most, len(ready)))
        return self.rng.sample(ready, k)

    def _defined(self, slot: int) -> bool:
        """Whether every buffer the model holds has a defined row for ``slot``: a
        request stashed before an extra's buffer existed has an uninitialised row
        there, which sglang would hand over as garbage (never drawn)."""
        rows = self.model.rows
        return all(slot in rows[name] or name in self.model.zeros for name in rows)

    # -- the engine's writes -----------------------------------------------------------
    def _lengths(self, slots: list[int], dtype: torch.dtype) -> Tensor:
        grown = [self.lengths.get(s, 0) + self.rng.randint(1, 3) for s in slots]
        self.lengths.update(zip(slots, grown))
        return torch.tensor(grown, dtype=dtype)

    def _write(self, slots: list[int], carry: bool) -> None:
        """Verification's publish (speculative), then the end-of-step stash; on a run
        with adopted buffers, sometimes the captured graph writes the lengths and
        bonus tokens itself and both calls skip them."""
        n = len(slots)
        indices = torch.tensor(slots, dtype=torch.int64)
        payload = self._payload(n, carry)
        graph = bool(self.adopted) and n > 0 and self.rng.random() < 0.5
        if graph:
            lens = self._lengths(slots, torch.int64)
            payload["bonus_tokens"] = bonus = self._ints(n, dtype=torch.int64)
            self.adopted["new_seq_lens_buf"][indices] = lens
            self.adopted["output_tokens_buf"][indices] = bonus
            self.map.graph_wrote(indices, **self._owners(slots))
            self.model.graph_writes(slots, lens, bonus)
        if self.speculative:
            if not graph:
                lens = self._lengths(slots, self.rng.choice([torch.int64, torch.int32]))
            confidence = None
            if self.confidence:
                confidence = self._floats(n, DIMS["draft_tokens"], dtype=torch.float32)
            self.model.publish(slots, lens, confidence)
            keywords: dict[str, Any] = self._owners(slots)
            if self.confidence:
                keywords["confidence"] = confidence
            self.map.publish(indices, None if graph else lens, **keywords)
        self.model.stash(slots, payload)
        self._carried_dsa(slots, payload)
        if graph:
            payload = {**payload, "bonus_tokens": None}
        self.map.stash(indices, self.payload(**payload), **self._owners(slots))
        self.history.append(f"write {slots} (extras: {carry}, graph: {graph})")
        self.seen["graph_wrote"] += graph

    def _owners(self, slots: list[int]) -> dict[str, Any]:
        """``owners=`` for a write of ``slots``, on runs whose writes name them."""
        if not self.named:
            return {}
        self.seen["owners_written"] += bool(slots)
        return {"owners": [self.reqs[slot] for slot in slots]}

    def _carried_dsa(self, slots: list[int], payload: dict[str, Tensor | None]) -> None:
        """sglang's flag for the draft input this stash makes: its indices or none."""
        for slot in slots:
            self.dsa[slot] = payload.get("dsa_topk_indices") is not None

    # -- the engine's steps ------------------------------------------------------------
    def admit(self) -> None:
        """A prefill of up to three waiting requests: their first values."""
        slots = self._admitted(self.rng.randint(0, 3))
        if self.overlap:  # overlap off, the forward hands its values over directly
            self._write(slots, carry=self.decoded)
        self.pending.update(slots)
        for slot in slots if self.beam else ():
            if self.rng.random() < 0.5:
                self._spawn(slot)

    def _spawn(self, leader: int) -> None:
        """A beam leader's prefill selection: its member slots are allocated and the
        group's selected tokens stashed into all its rows (sglang's
        ``select_leader_prefill``), overwriting the leader's sampled token."""
        width = min(len(self.free), self.rng.randint(1, 3))
        if width == 0:
            return
        picked = [
            self.free.pop(self.rng.randrange(len(self.free))) for _ in range(width)
        ]
        self.members[leader] = picked
        self.history.append(f"beam {leader} spawns {picked}")
        self._select(leader)

    def _select(self, leader: int) -> None:
        """The group's selected tokens into every row of it (leader first), each
        row named by the leader (``_stash_next_tokens(group.all_rows, ...)``)."""
        rows = [leader, *self.members[leader]]
        tokens = self._ints(len(rows), dtype=torch.int64)
        self.model.stash(rows, {"bonus_tokens": tokens})
        owners = {"owners": [self.reqs[leader]] * len(rows)} if self.named else {}
        indices = torch.tensor(rows, dtype=torch.int64)
        self.map.stash(indices, self.payload(bonus_tokens=tokens), **owners)

    def _admitted(self, most: int) -> list[int]:
        k = min(len(self.free), most)
        slots = [self.free.pop(self.rng.randrange(len(self.free))) for _ in range(k)]
        for slot in slots:
            self.lengths[slot] = self.rng.randint(1, 50)
            self.admitted += 1
            self.reqs[slot] = Req(f"req{self.admitted}")
        return slots

    def decode(self, staged: list[int] | None = None) -> None:
        """One decode step of some pending requests (none: an idle rank), or of the
        ``staged`` ones leaving a staging area: the scheduler resolves their lengths,
        the forward its inputs, then writes."""
        slots = self._ready() if staged is None else staged
        self.history.append(f"decode {slots}")
        self.seen["decode"] += bool(slots)
        if self.speculative:
            got, want = self._pair(slots)
            ordered = self.rng.random() < 0.5
            keywords = {} if self.algorithm == "ngram" else {"host": self.host}
            self.map.resolve_seq_lens_cpu(got, stream_ordered=ordered, **keywords)
            self.seen["stream_ordered"] += ordered and bool(slots)
            self.seen["no_host_lengths"] += not self.host and bool(slots)
            self.model.resolve_seq_lens_cpu(want, stream_ordered=ordered)
            paths = ["seq_lens", "seq_lens_cpu", "seq_lens_sum"]
            self.compare("resolve_seq_lens_cpu", got, want, paths)
            if self.confidence:
                self.map.resolve_confidence_cpu(got)
                self.seen["resolve_confidence_cpu"] += bool(slots)
                want.confidence_cpu = self.model.resolve_confidence_cpu(want)
                self.compare("resolve_confidence_cpu", got, want, ["confidence_cpu"])
        if staged is not None:
            got, want = self._staged_pair(slots)
        elif self.beam:
            got, want = self._beam_pair(slots)
        else:
            got, want = self._pair(slots)
        if self.speculative and "dsa_topk_indices" in self.model.rows and slots:
            gated = not got.spec_info.future_dsa_topk_indices_available
            self.seen["dsa_gated_off"] += gated
        rows = self.model.rows
        if slots and "draft_probs" in rows and "topk_p" not in rows:
            self.seen["draft_probs_without_topk"] += 1
        self.seen["switched_off"] += self.switched_off and bool(slots)
        self.map.resolve_future(got)
        self.model.resolve_forward_inputs(want)
        self.compare("resolve_future", got, want, self._forward_paths())
        self.decoded = True
        self._write(slots, carry=True)
        for leader in slots:
            if leader in self.members:  # select_and_relay_decode
                self._select(leader)
        self.pending.update(slots)

    def _beam_pair(self, slots: list[int]) -> tuple[SimpleNamespace, SimpleNamespace]:
        """A decode batch of ``slots`` with its beam members' slots after them, as
        sglang's ``append_beam_tail`` builds it (``reqs`` still one per leading row)."""
        got, want = self._pair(slots)
        rows, tail = beam_rows(slots, self.members)
        for batch in (got, want):
            batch.req_pool_indices = torch.tensor(rows, dtype=torch.int64)
            batch.beam_tail = tail
        self.seen["beam_tail"] += tail is not None
        if tail is not None:
            self.history.append(f"  beam tail {rows[len(slots) :]}")
        return got, want

    def _forward_paths(self) -> list[str]:
        if self.algorithm == "decode":
            return ["input_ids"]
        if self.algorithm == "ngram":
            return ["spec_info.accept_tokens", "spec_info.accept_lens"]
        names = ["bonus_tokens", "topk_p", "topk_index", "hidden_states"]
        names += ["draft_probs", "dsa_topk_indices"]
        return [f"spec_info.{name}" for name in names]

    def stage(self) -> None:
        """Requests leave the sparse-attention staging area: the scheduler stashes
        each one's last token alone (the extras its prefill stashed are kept), gives
        the batch a fresh draft input, and the batch decodes. Where the sparse
        indices' buffer exists, sglang's fresh input says every row holds them: only
        requests whose last stash carried them are staged (another would be handed
        the slot's earlier rows, which debug mode reports)."""
        dsa = "dsa_topk_indices" in self.model.rows
        slots = [s for s in self._ready() if not dsa or self.dsa.get(s, False)]
        bonus = self._ints(len(slots), dtype=torch.int64)
        self.history.append(f"stage {slots}")
        self.seen["staged"] += bool(slots)
        self.model.stash(slots, {"bonus_tokens": bonus})
        self.map.stash(
            torch.tensor(slots, dtype=torch.int64),
            self.payload(bonus_tokens=bonus),
            **self._owners(slots),
        )
        self.decode(staged=slots)

    def restash(self) -> None:
        """Pending requests stashed again before any read, some extras left out: the
        rows of an omitted extra keep what the earlier stash wrote."""
        if not (self.decoded and self.extras):
            return
        slots = self._ready()
        payload = self._payload(len(slots), carry=True)
        for name in ("topk_p", "hidden_states", "draft_probs", "dsa_topk_indices"):
            if self.rng.random() < 0.5:
                payload[name] = None
                if name == "topk_p":
                    payload["topk_index"] = None
        self.history.append(f"restash {slots} keeping {sorted(payload)}")
        self.seen["kept"] += bool(slots)
        self.model.stash(slots, payload)
        self._carried_dsa(slots, payload)
        indices = torch.tensor(slots, dtype=torch.int64)
        self.map.stash(indices, self.payload(**payload), **self._owners(slots))

    def mixed(self) -> None:
        """A mixed batch: a prefill chunk of new requests with running decode rows
        appended, built with lagging lengths; the forward late-binds the tails."""
        running = self._ready()
        prefill = self._admitted(self.rng.randint(0, 2))
        slots = prefill + running
        self.history.append(f"mixed {prefill} + tails {running}")
        self.seen["resolve_tails"] += bool(running)
        got, want = self._pair(slots)
        lagging = [self.lengths[s] - self.rng.randint(0, 2) for s in slots]
        for batch in (got, want):
            batch.mix_running_indices = torch.tensor(running, dtype=torch.int64)
            batch.seq_lens = torch.tensor(lagging, dtype=torch.int64)
            # Built by a scheduler whose backends may need no host lengths.
            batch.seq_lens_cpu = batch.seq_lens.clone() if self.host else None
            batch.seq_lens_sum = sum(lagging) if self.host else None
            batch.out_cache_loc = torch.full((len(slots),), -5, dtype=torch.int64)
            batch.prefix_lens = [length - 1 for length in lagging]
        self.map.resolve_tails(got)
        self.model.resolve_mixed_spec_tails(want)
        paths = ["seq_lens", "out_cache_loc", "seq_lens_cpu", "seq_lens_sum"]
        self.compare("resolve_tails", got, want, [*paths, "prefix_lens"])
        if running and self.algorithm == "eagle":
            self._mixed_tokens(running)
        self._write(slots, carry=self.decoded)
        self.pending.update(slots)

    def sync_mixed(self) -> None:
        """Overlap off: a mixed batch of new requests' prefill and running decode
        rows, whose last tokens the scheduler stashes alone for the mixed batch's
        token gather; no tails are late-bound and no extra is read."""
        running = self._ready()
        prefill = self._admitted(self.rng.randint(0, 2))
        bonus = self._ints(
            len(running), dtype=self.rng.choice([torch.int64, torch.int32])
        )
        self.history.append(f"mixed, overlap off {prefill} + tails {running}")
        self.seen["stash_partial"] += bool(running)
        self.model.stash_bonus_tokens(running, bonus)
        indices = torch.tensor(running, dtype=torch.int64)
        self.map.stash_partial(indices, bonus, **self._owners(running))
        if running:
            self._mixed_tokens(running)
        self.pending.update(prefill)

    def _mixed_tokens(self, running: list[int]) -> None:
        """The mixed batch's decode tokens, gathered by the running rows' slots: sglang
        reads no extra there (its mixed batch has no draft input), so the engine asks
        for a partial read, which hands the extras None and leaves their rows."""
        tokens = self._batch(running)
        self.map.resolve_future(tokens, partial=True)
        want = self.model.gather("output_tokens", running)
        if not same(tokens.spec_info.bonus_tokens, want):
            raise Divergence(f"mixed decode tokens {tokens.spec_info.bonus_tokens}")
        extras = ["topk_p", "topk_index", "hidden_states", "draft_probs"]
        handed = [
            e
            for e in [*extras, "dsa_topk_indices"]
            if getattr(tokens.spec_info, e) is not None
        ]
        if handed:
            raise Divergence(f"a mixed batch's partial read handed {handed}")
        self.seen["mixed_tokens"] += 1

    def no_draft_input(self) -> None:
        """A batch without a draft input (a prefill): every resolve leaves it alone."""
        got, want = self._pair(sorted(self.pending))
        got.spec_info = want.spec_info = None
        self.map.resolve_seq_lens_cpu(got)
        self.model.resolve_seq_lens_cpu(want)
        self.map.resolve_future(got)
        self.model.resolve_forward_inputs(want)
        self.compare("a batch without spec_info", got, want, ["seq_lens", "spec_info"])
        self.seen["no_draft_input"] += 1

    def no_future_indices(self) -> None:
        """A draft input with no ``future_indices`` yet: the schedule read and the
        n-gram extras leave the batch alone in sglang; its EAGLE extras read would
        raise, where the faithful map skips it as well (docs/sglang.md)."""
        got, want = self._pair(sorted(self.pending))
        got.spec_info.future_indices = want.spec_info.future_indices = None
        self.map.resolve_seq_lens_cpu(got)
        self.model.resolve_seq_lens_cpu(want)
        self.map.resolve_future(got)
        if self.algorithm == "ngram":
            self.model.resolve_forward_inputs(want)
        self.compare(
            "a draft input without future_indices", got, want, ["seq_lens", "spec_info"]
        )
        self.seen["no_future_indices"] += 1

    def finish(self) -> None:
        """Some pending requests end: their slots are released and reused later."""
        slots = self.rng.sample(sorted(self.pending), min(2, len(self.pending)))
        slots = slots[: self.rng.randint(0, len(slots))]
        self.history.append(f"finish {slots}")
        self.map.release(torch.tensor(slots, dtype=torch.int64))
        self.pending.difference_update(slots)
        self.free.extend(slots)
        for leader in slots:  # the group ends: its member slots are freed
            members = self.members.pop(leader, [])
            self.map.release(torch.tensor(members, dtype=torch.int64))
            self.free.extend(members)

    def step(self) -> None:
        getattr(self, self.rng.choice(self.kinds))()


def run(algorithm: str, seed: int, steps: int, *, debug: bool) -> Run:
    """``steps`` random steps of one lockstep run; raises ``Divergence`` on the first
    value the map and the model disagree on."""
    lockstep = Run(algorithm, seed, debug=debug)
    for _ in range(steps):
        lockstep.step()
    return lockstep
