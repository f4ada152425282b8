"""One relay step of each faithful ``sglang_*`` map against a lean hand-written map in
sglang's style (``relay bench``'s baselines; n-gram's written here from docs/sglang.md),
debug off: data ops per step and per-step time, interleaved in balanced orders.

    python scripts/sglang_faithful_bench.py [--repeat 40] [--device cpu]

``eagle-graph`` is the faithful EAGLE map on buffers a captured graph wrote (it passes
``None`` to publish and stash) against the baseline, which scatters them.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from relay.bench.baseline import DecodeBaseline, EagleBaseline, PublishReady
from relay.bench.timing import quantile, time_interleaved, timer_for
from relay.maps.sglang_decode import SglangDecodeFutureMap, SglangDecodePayload
from relay.maps.sglang_eagle import SglangEagleFutureMap, SglangEaglePayload
from relay.maps.sglang_ngram import SglangNgramFutureMap, SglangNgramPayload
from relay.opcount import count_ops

Step = Callable[[], None]
SHAPES = [(257, 1, 1, 0), (257, 1, 4, 4096), (513, 32, 4, 4096), (4097, 256, 4, 4096)]


class NgramBaseline:
    """sglang 0.5.23's n-gram relay, written lean: two lazy zero-filled buffers."""

    def __init__(self, device: torch.device, pool: int) -> None:
        self.pool, self.device = pool, device
        self.tokens: torch.Tensor | None = None
        self.lens: torch.Tensor | None = None
        self.new_seq_lens = torch.zeros(pool, dtype=torch.int64, device=device)
        self.ready = PublishReady(device)

    def stash(
        self, idx: torch.Tensor, tokens: torch.Tensor, lens: torch.Tensor
    ) -> None:
        if idx.shape[0] == 0:
            return
        if self.tokens is None or self.lens is None:
            shape = (self.pool, tokens.shape[1])
            self.tokens = torch.zeros(shape, dtype=tokens.dtype, device=self.device)
            self.lens = torch.zeros(self.pool, dtype=lens.dtype, device=self.device)
        self.tokens[idx] = tokens
        self.lens[idx] = lens

    def publish(self, idx: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        if idx.shape[0] == 0:
            return
        self.new_seq_lens[idx] = new_seq_lens.to(torch.int64)
        self.ready.record()

    def resolve_future(self, batch: Any) -> None:
        idx = batch.spec_info.future_indices
        assert self.tokens is not None and self.lens is not None
        batch.spec_info.accept_tokens = self.tokens[idx].flatten()
        batch.spec_info.accept_lens = self.lens[idx]

    def resolve_seq_lens_cpu(self, batch: Any) -> None:
        self.ready.wait()
        batch.seq_lens = self.new_seq_lens[batch.spec_info.future_indices]
        batch.seq_lens_cpu = self.ready.host_rows(
            self.new_seq_lens, batch, batch.seq_lens
        )
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())


def _batch(idx: torch.Tensor) -> SimpleNamespace:
    info = SimpleNamespace(future_indices=idx, bonus_tokens=None, topk_p=None)
    info.__dict__.update(topk_index=None, hidden_states=None, draft_probs=None)
    info.__dict__.update(dsa_topk_indices=None, accept_tokens=None, accept_lens=None)
    return SimpleNamespace(
        req_pool_indices=idx,
        req_pool_indices_cpu=idx.cpu(),
        input_ids=None,
        seq_lens=None,
        seq_lens_cpu=None,
        seq_lens_sum=0,
        spec_info=info,
    )


def sides(kind: str, dev: torch.device, shape: tuple[int, ...]) -> tuple[Step, Step]:
    """The baseline's step and the faithful map's, primed."""
    pool, b, k, h = shape
    g = torch.Generator().manual_seed(0)
    idx = (torch.randperm(pool - 1, generator=g)[:b] + 1).to(dev)
    tok = torch.randint(0, 150_000, (b,), generator=g).to(dev)
    lens = torch.randint(1, 30_000, (b,), generator=g).to(dev)
    p = torch.rand(b, k, generator=g).to(dev)
    ti = torch.randint(0, 150_000, (b, k), generator=g).to(dev)
    hid = torch.randn(b, h, generator=g).to(torch.bfloat16).to(dev) if h else None
    bb, bg = _batch(idx), _batch(idx)
    if kind == "decode":
        dbase, dgen = DecodeBaseline(dev, pool), SglangDecodeFutureMap(dev, pool)
        dpay = SglangDecodePayload(bonus_tokens=tok)

        def base() -> None:
            dbase.stash(idx, next_token_ids=tok)
            dbase.resolve_future(bb)

        def gen() -> None:
            dgen.stash(idx, dpay)
            dgen.resolve_future(bg)

    elif kind.startswith("eagle"):
        graph = kind == "eagle-graph"
        ebase = EagleBaseline(dev, pool, topk=k)

        def adopted() -> torch.Tensor | None:
            return torch.zeros(pool, dtype=torch.int64, device=dev) if graph else None

        egen = SglangEagleFutureMap(
            dev, pool, output_tokens_buf=adopted(), new_seq_lens_buf=adopted()
        )
        epay = SglangEaglePayload(
            bonus_tokens=None if graph else tok,
            topk_p=p,
            topk_index=ti,
            hidden_states=hid,
        )

        def base() -> None:
            ebase.resolve_seq_lens_cpu(bb)
            ebase.resolve_future(bb)
            ebase.publish(idx, lens)
            ebase.stash(
                idx, bonus_tokens=tok, topk_p=p, topk_index=ti, hidden_states=hid
            )

        def gen() -> None:
            egen.resolve_seq_lens_cpu(bg)
            egen.resolve_future(bg)
            if graph:
                egen.graph_wrote(idx)
            egen.publish(idx, None if graph else lens)
            egen.stash(idx, epay)

    else:
        nbase, ngen = NgramBaseline(dev, pool), SglangNgramFutureMap(dev, pool)
        at = torch.randint(0, 150_000, (b, k), generator=g).to(dev)
        al = torch.randint(0, k + 1, (b,), generator=g).to(torch.int32).to(dev)
        npay = SglangNgramPayload(accept_tokens=at, accept_lens=al)
        nbase.stash(idx, at, al)
        nbase.publish(idx, lens)
        ngen.stash(idx, npay)
        ngen.publish(idx, lens)

        def base() -> None:
            nbase.resolve_seq_lens_cpu(bb)
            nbase.resolve_future(bb)
            nbase.publish(idx, lens)
            nbase.stash(idx, at, al)

        def gen() -> None:
            ngen.resolve_seq_lens_cpu(bg)
            ngen.resolve_future(bg)
            ngen.publish(idx, lens)
            ngen.stash(idx, npay)

    for _ in range(2):
        base()
        gen()
    return base, gen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    dev = torch.device(args.device)
    for kind in ("decode", "eagle", "eagle-graph", "ngram"):
        for shape in SHAPES:
            base, gen = sides(kind, dev, shape)
            ops = len(count_ops(gen).data), len(count_ops(base).data)
            samples = time_interleaved(
                [base, gen],
                timer_for(dev),
                repeat=args.repeat,
                warmup=50,
                target_ns=2_000_000,
            )
            ratios = [g / b for b, g in zip(samples[0], samples[1])]
            pool, b, k, h = shape
            print(
                f"{kind:11} P={pool} B={b} K={k} H={h}: data ops {ops[0]}/{ops[1]}, "
                f"time {statistics.median(ratios):.2f}x "
                f"(q10 {quantile(ratios, 0.1):.2f}, q90 {quantile(ratios, 0.9):.2f})"
            )


if __name__ == "__main__":
    main()
