"""A small decoder-only transformer, its EAGLE-style draft head and the KV cache.

Weights are drawn from a seeded generator, so every process and every run builds
the same model. Nothing is trained; see Note [A model with a predictable core].
Each forward is one call into a TorchScript module (Note [Forwards without the GIL]).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DraftHead", "Forwards", "KVCache", "ModelConfig", "TargetModel"]
__all__ += ["PackedDrafts", "VerifyResult"]


# Note [A model with a predictable core]
# A randomly initialised transformer decodes greedily into something a draft head
# can only guess at random, so speculative decoding would accept nothing. Here each
# layer's residual branch is scaled by ``residual_scale``: the last hidden state is
# dominated by the embedding of the current token, the next token is mostly a fixed
# function of the current one, and attention over the context perturbs it. The draft
# head computes the same embedding-dominated state from (token, previous hidden), so
# it agrees with the target often but not always, and acceptance lengths are
# realistic (about 2 to 3 tokens per verify step with 3 draft steps). The ``eos`` row
# of the output head is scaled up so that a fair share of requests end on EOS.


# Note [Float64 by default]
# Greedy decoding picks an argmax. Two runs that batch the same request with
# different neighbours (overlap and sync under another schedule, or one rank and
# two data-parallel ranks) run kernels of different shapes whose float32 results can
# differ in the last bit, which flips a near-tie now and then. In float64 such
# differences are ~1e-16 relative, and a flip needs a tie that close: the outputs are
# the same in practice. Overlap and sync also run the very same batches (see Note
# [One schedule for both modes] in relay/engine/scheduler.py), so they match exactly
# in any dtype.


# Note [Forwards without the GIL]
# On the CPU the "device" is a worker thread. In eager mode every torch op returns
# to Python and must take the GIL back; while the scheduler thread runs Python, each
# such hand-back waits for the interpreter's switch interval, so a forward of ~50
# small ops crawls exactly when it should overlap. The forwards are therefore
# methods of one TorchScript module: a call runs all of a forward's ops in the
# TorchScript interpreter, which holds no GIL, like a GPU running a launched graph.
#
# One more detail keeps the interpreter off the GIL. A tensor that Python can see
# takes the GIL whenever C++ drops its second-to-last reference to it (its Python
# object changes owner). A tensor passed as an argument is dropped mid-call, after
# its last use, so each argument costs one GIL hand-over. So the module holds the
# weights and caches as attributes, and each call's own tensors go in through the
# ``args`` attribute, which ``Forwards`` clears only after the call returns.
#
# TorchScript is deprecated in recent torch; where it is missing or fails, the same
# module runs eagerly, with the same results and only the contention back.


_Module = TypeVar("_Module", bound=torch.nn.Module)
_T = TypeVar("_T")


def _script(module: _Module) -> _Module:
    """``module`` compiled by TorchScript, or ``module`` itself where TorchScript is unavailable."""
    try:
        script: Any = torch.jit.script  # an AttributeError where TorchScript is gone
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's deprecation notice
            compiled: _Module = script(module)
    except Exception:  # noqa: BLE001 - missing or failing: run eagerly instead
        return module
    return compiled


@attrs.frozen(kw_only=True)
class ModelConfig:
    """Sizes and seed of the target model and its draft head."""

    vocab_size: int = 2048
    hidden: int = 128
    layers: int = 1
    heads: int = 2
    ffn: int = 256
    #: Longest sequence (prompt, output and speculative look-ahead) a slot can hold.
    max_context: int = 192
    seed: int = 0
    #: See Note [A model with a predictable core].
    residual_scale: float = 0.35
    draft_scale: float = 0.35
    eos_token_id: int = 2
    eos_boost: float = 1.6
    #: See Note [Float64 by default].
    dtype: torch.dtype = torch.float64

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads


# -- the forwards, in TorchScript's subset of Python ---------------------------------
# Weights of all layers are stacked on a leading layer dimension: wqkv (layers,
# hidden, 3 * hidden), wo (layers, hidden, hidden), w_up (layers, hidden, 2 * ffn)
# holding gate and up (SwiGLU), w_down (layers, ffn, hidden). KV caches are
# (layers, pool_size, heads, max_context, head_dim).


def _rms_norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _mlp(x: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    gate, up = (_rms_norm(x) @ w_up).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w_down


def _qkv(x: Tensor, wqkv: Tensor, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v of ``x`` (..., hidden), each (..., heads, head_dim)."""
    qkv = (_rms_norm(x) @ wqkv).unflatten(-1, [3, heads, -1])  # type: ignore[no-untyped-call]
    q, k, v = qkv.unbind(-3)
    return q, k, v


def _attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """Softmax attention written out: for one query per row, faster on the CPU than
    ``scaled_dot_product_attention``."""
    scores = (q @ keys.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ values


# Note [Verifying over a shared prefix]
# The ``topk`` branches of a request share its cached prefix. Attending each branch
# as its own row would copy the prefix's keys and values once per branch (and once
# more to append the branch's own); instead the scores against the prefix are taken
# for all of a request's branch tokens at once, from one gathered copy, and joined
# with each branch's scores against its own tokens in a single softmax. It is the
# same attention, in float64 equal to the per-branch form to rounding.


def _tree_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix_k: Tensor,
    prefix_v: Tensor,
    prefix_ok: Tensor,
    causal: Tensor,
) -> Tensor:
    """Attention of branch tokens over their request's prefix and their own branch:
    ``q`` (rows, width, heads, hd) with rows = n * topk; ``k``, ``v`` (rows, heads,
    width, hd); ``prefix_k``, ``prefix_v`` (n, heads, P, hd); ``prefix_ok`` (n, P);
    ``causal`` (width, width). Returns (rows, width, heads * hd)."""
    rows, width, heads, hd = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    n = prefix_k.shape[0]
    topk = rows // n
    scale = 1.0 / math.sqrt(hd)
    # (n, heads, topk * width, hd): every branch token of a request, against its prefix.
    q_req = q.view(n, topk, width, heads, hd).permute(0, 3, 1, 2, 4)
    q_req = q_req.reshape(n, heads, -1, hd)
    s_prefix = (q_req @ prefix_k.transpose(-1, -2)) * scale  # (n, heads, topk*width, P)
    s_prefix = s_prefix.masked_fill(~prefix_ok[:, None, None, :], float("-inf"))
    q_row = q.transpose(1, 2)  # (rows, heads, width, hd)
    s_branch = (q_row @ k.transpose(-1, -2)) * scale  # (rows, heads, width, width)
    s_branch = s_branch.masked_fill(~causal, float("-inf"))
    # One softmax over [prefix | branch] per query, in the per-request layout.
    s_branch = s_branch.view(n, topk, heads, width, width).transpose(1, 2)
    s_branch = s_branch.reshape(n, heads, topk * width, width)
    p = torch.softmax(torch.cat([s_prefix, s_branch], dim=-1), dim=-1)
    prefix_width = prefix_k.shape[2]
    p_prefix, p_branch = p[..., :prefix_width], p[..., prefix_width:]
    out = p_prefix @ prefix_v  # (n, heads, topk * width, hd)
    p_branch = p_branch.view(n, heads, topk, width, width).transpose(1, 2)
    # (rows, heads, width, hd) both
    out_branch = p_branch.reshape(rows, heads, width, width) @ v
    out = out.view(n, heads, topk, width, hd).transpose(1, 2)
    out = out.reshape(rows, heads, width, hd)
    joined: Tensor = (out + out_branch).transpose(1, 2).reshape(rows, width, heads * hd)
    return joined


class _Program(torch.nn.Module):
    """The forwards over one model's weights, draft head and KV cache; each method
    reads its tensors from ``args`` (Note [Forwards without the GIL])."""

    def __init__(self, target: TargetModel, kv: KVCache, draft_w: Tensor) -> None:
        super().__init__()
        t = target
        self.embed, self.pos_embed, self.lm_head_t = t.embed, t.pos_embed, t.lm_head_t
        self.wqkv, self.wo, self.w_up, self.w_down = t.wqkv, t.wo, t.w_up, t.w_down
        self.draft_w = draft_w
        self.k_cache, self.v_cache, self.history = kv.k, kv.v, kv.tokens
        self.history_lens = kv.lengths
        self.row_width = kv.k.shape[3]  # Note [The request-to-token table]
        self.heads = t.config.heads
        # Not empty: TorchScript infers the attribute's type, List[Tensor], from it.
        self.args: list[Tensor] = [self.embed]

    def _greedy(self, hidden: Tensor) -> Tensor:
        return (_rms_norm(hidden) @ self.lm_head_t).argmax(-1)

    def _draft_step(self, hidden: Tensor, tokens: Tensor) -> Tensor:
        """The draft head's hidden state for the positions of ``tokens``."""
        return self.embed[tokens] + _rms_norm(hidden) @ self.draft_w

    @torch.jit.export
    def prefill(self) -> tuple[Tensor, Tensor]:
        tokens, prompt_lens, slots = self.args[0], self.args[1], self.args[2]
        m, length = tokens.shape[0], tokens.shape[1]
        self.history[slots, :length] = tokens
        self.history_lens[slots] = prompt_lens
        x = self.embed[tokens] + self.pos_embed[:length]
        for i in range(self.wqkv.shape[0]):
            q, k, v = _qkv(x, self.wqkv[i], self.heads)  # (m, L, heads, head_dim)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            self.k_cache[i, slots, :, :length] = k
            self.v_cache[i, slots, :, :length] = v
            # Right padding: causal masking alone keeps real queries off padded keys.
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True)
            x = x + o.transpose(1, 2).flatten(-2) @ self.wo[i]
            x = x + _mlp(x, self.w_up[i], self.w_down[i])
        hidden = x[torch.arange(m, device=x.device), prompt_lens - 1]
        return hidden, self._greedy(hidden)

    def _cell(self, locations: Tensor) -> tuple[Tensor, Tensor]:
        """The slot row and position of each KV location (Note [The request-to-token
        table])."""
        rows = torch.div(locations, self.row_width, rounding_mode="floor")
        return rows, locations - rows * self.row_width

    @torch.jit.export
    def decode(self, max_seq_len: int) -> tuple[Tensor, Tensor]:
        tokens, seq_lens, slots = self.args[0], self.args[1], self.args[2]
        positions = seq_lens - 1
        locations = self.args[3]
        if locations.numel() == 0:
            rows, columns = slots, positions
        else:
            rows, columns = self._cell(locations)
        x = self.embed.index_select(0, tokens)
        x = x + self.pos_embed.index_select(0, positions)
        valid = torch.arange(max_seq_len, device=x.device) < seq_lens[:, None]
        mask = valid[:, None, None, :]  # (n, 1, 1, L)
        for i in range(self.wqkv.shape[0]):
            q, k, v = _qkv(x, self.wqkv[i], self.heads)  # (n, heads, head_dim)
            self.k_cache[i, rows, :, columns] = k
            self.v_cache[i, rows, :, columns] = v
            # (n, heads, L, hd); index_select of a sliced view: a few times faster
            # than advanced indexing.
            keys = self.k_cache[i, :, :, :max_seq_len].index_select(0, slots)
            values = self.v_cache[i, :, :, :max_seq_len].index_select(0, slots)
            o = _attend(q[:, :, None, :], keys, values, mask)
            x = x + o.flatten(1) @ self.wo[i]
            x = x + _mlp(x, self.w_up[i], self.w_down[i])
        return x, self._greedy(x)

    @torch.jit.export
    def prefill_chunk(self, max_end: int) -> tuple[Tensor, Tensor]:
        tokens, starts = self.args[0], self.args[1]
        lens, slots = self.args[2], self.args[3]
        m, length = tokens.shape[0], tokens.shape[1]
        offsets = torch.arange(length, device=tokens.device)
        positions = starts[:, None] + offsets  # (m, L)
        valid = offsets[None, :] < lens[:, None]
        rows = slots[:, None].expand(m, length)[valid]
        cols = positions[valid]
        self.history[rows, cols] = tokens[valid]
        self.history_lens[slots] = starts + lens
        last_position = self.pos_embed.shape[0] - 1
        x = self.embed[tokens] + self.pos_embed[positions.clamp(max=last_position)]
        keys_at = torch.arange(max_end, device=tokens.device)
        # (m, 1, L, E)
        mask = (keys_at[None, None, :] <= positions[:, :, None])[:, None]
        for i in range(self.wqkv.shape[0]):
            q, k, v = _qkv(x, self.wqkv[i], self.heads)  # (m, L, heads, head_dim)
            # Only the chunk's real positions: a padded one could land on a kept entry.
            self.k_cache[i, rows, :, cols] = k[valid]
            self.v_cache[i, rows, :, cols] = v[valid]
            keys = self.k_cache[i, :, :, :max_end].index_select(0, slots)
            values = self.v_cache[i, :, :, :max_end].index_select(0, slots)
            o = _attend(q.transpose(1, 2), keys, values, mask)  # (m, heads, L, hd)
            x = x + o.transpose(1, 2).flatten(-2) @ self.wo[i]
            x = x + _mlp(x, self.w_up[i], self.w_down[i])
        hidden = x[torch.arange(m, device=x.device), lens - 1]
        return hidden, self._greedy(hidden)

    @torch.jit.export
    def draft_and_verify(
        self, steps: int, max_seq_len: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        bonus, draft_hidden, first = self.args[0], self.args[1], self.args[2]
        seq_lens, slots = self.args[3], self.args[4]
        # The draft: extend each first candidate greedily to ``steps`` tokens.
        n, topk = first.shape[0], first.shape[1]
        chain = [first]
        h = draft_hidden[:, None, :].expand(n, topk, draft_hidden.shape[-1])
        for _ in range(steps - 1):
            h = self._draft_step(h, chain[-1])
            chain.append(self._greedy(h))
        drafts = torch.stack(chain, dim=2)  # (n, topk, steps)
        return self._verify(bonus, drafts, seq_lens, max_seq_len, slots)

    @torch.jit.export
    def ngram_verify(
        self, draft_num: int, max_seq_len: int, variable: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        bonus, packed, starts = self.args[0], self.args[1], self.args[2]
        accept_lens, seq_lens, slots = self.args[3], self.args[4], self.args[5]
        # The previous step's accepted drafts, then its bonus, join the context.
        n = bonus.shape[0]
        last = seq_lens - 1
        j = torch.arange(draft_num, device=bonus.device)
        counts = accept_lens.long()[:, None]
        taken = j[None, :] < counts
        # Row i's drafts lie packed from starts[i]; a draft not taken reads position
        # 0 and writes at ``last``, which the bonus overwrites next: no boolean mask,
        # whose data-dependent shape a CUDA graph cannot capture.
        accept_tokens = packed[torch.where(taken, starts[:, None] + j[None, :], 0)]
        positions = torch.where(
            taken, last[:, None] - counts + j[None, :], last[:, None]
        )
        rows = slots[:, None].expand(n, draft_num)
        self.history[rows, positions] = accept_tokens
        self.history[slots, last] = bonus
        self.history_lens[slots] = seq_lens
        drafts, found = self._ngram_drafts(slots, seq_lens, draft_num, max_seq_len)
        limit: Tensor | None = None
        if variable != 0:
            limit = found  # a request verifies only the drafts its match found
        return self._verify(
            bonus, drafts[:, None, :], seq_lens, max_seq_len, slots, limit
        )

    def _ngram_drafts(
        self, slots: Tensor, seq_lens: Tensor, draft_num: int, width: int
    ) -> tuple[Tensor, Tensor]:
        """For each row, the ``draft_num`` tokens that followed the latest earlier
        occurrence of its context's last 3, else 2, else 1 tokens; without one, its
        last token repeated. And how many of them the match really found (0 to
        ``draft_num``; 0 without one): the rest repeat the context's last token."""
        context = self.history.index_select(0, slots)[:, :width]  # (n, W)
        n = context.shape[0]
        found = torch.zeros(n, dtype=torch.bool, device=context.device)
        follow = seq_lens - 1  # where the drafts start reading
        for g in [3, 2, 1]:
            if width >= g + 1:
                tail = seq_lens[:, None] - g + torch.arange(g, device=context.device)
                tail = tail.clamp(min=0)
                key = context.gather(1, tail)  # (n, g)
                windows = context.unfold(1, g, 1)  # (n, W - g + 1, g)
                starts = torch.arange(windows.shape[1], device=context.device)
                hit = (windows == key[:, None, :]).all(-1)
                hit = hit & (starts[None, :] + g < seq_lens[:, None])
                hit = hit & (seq_lens[:, None] > g)
                best = torch.where(hit, starts[None, :], -1).max(1).values
                new = (best >= 0) & ~found
                follow = torch.where(new, best + g, follow)
                found = found | new
        at = follow[:, None] + torch.arange(draft_num, device=context.device)
        at = torch.minimum(at, (seq_lens - 1)[:, None])
        real = torch.where(found, (seq_lens - follow).clamp(max=draft_num), 0)
        return context.gather(1, at), real

    def _verify(
        self,
        bonus: Tensor,
        drafts: Tensor,
        seq_lens: Tensor,
        max_seq_len: int,
        slots: Tensor,
        limit: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Verify ``drafts`` (n, topk, steps) after ``bonus`` greedily (``Forwards.draft_and_verify``),
        accepting at most ``limit`` (n,) drafts of a row where it is given."""
        n, topk, steps = drafts.shape[0], drafts.shape[1], drafts.shape[2]
        # Verification: each branch is a row of ``width`` tokens after the request's
        # cached prefix, which all its branches share (Note [Verifying over a shared prefix]).
        width = steps + 1
        rows = n * topk
        prefix = seq_lens - 1  # cached tokens
        prefix_width = max_seq_len - 1
        tree = torch.cat([bonus[:, None, None].expand(n, topk, 1), drafts], dim=2)
        positions = prefix[:, None] + torch.arange(width, device=bonus.device)
        x = self.embed[tree] + self.pos_embed[positions][:, None]
        x = x.reshape(rows, width, -1)
        prefix_ok = torch.arange(prefix_width, device=x.device) < prefix[:, None]
        causal = torch.ones(width, width, dtype=torch.bool, device=x.device).tril()
        branch_k: list[Tensor] = []
        branch_v: list[Tensor] = []
        for i in range(self.wqkv.shape[0]):
            q, k, v = _qkv(x, self.wqkv[i], self.heads)  # (rows, width, heads, hd)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # (rows, heads, width, hd)
            branch_k.append(k)
            branch_v.append(v)
            prefix_k = self.k_cache[i, :, :, :prefix_width].index_select(0, slots)
            prefix_v = self.v_cache[i, :, :, :prefix_width].index_select(0, slots)
            o = _tree_attention(q, k, v, prefix_k, prefix_v, prefix_ok, causal)
            x = x + o @ self.wo[i]
            x = x + _mlp(x, self.w_up[i], self.w_down[i])

        greedy = self._greedy(x).view(n, topk, width)
        # (n, topk) drafts accepted along each branch
        matched = (drafts == greedy[:, :, :steps]).long().cumprod(dim=2).sum(dim=2)
        if limit is not None:
            matched = torch.minimum(matched, limit[:, None])
        best = matched.argmax(dim=1)  # first maximum: deterministic tie-break
        accept = matched.gather(1, best[:, None]).squeeze(1)
        rows_best = torch.arange(n, device=x.device) * topk + best
        tokens = greedy.view(rows, width)[rows_best]
        hidden = x[rows_best, accept]
        bonus_next = tokens.gather(1, accept[:, None]).squeeze(1)
        stacked_k = torch.stack(branch_k)[:, rows_best]  # (layers, n, heads, width, hd)
        stacked_v = torch.stack(branch_v)[:, rows_best]
        return tokens, accept, bonus_next, hidden, stacked_k, stacked_v

    @torch.jit.export
    def commit_and_extend(self, topk: int) -> tuple[Tensor, Tensor, Tensor]:
        branch_k, branch_v, locations = self.args[0], self.args[1], self.args[2]
        hidden, bonus = self.args[3], self.args[4]
        # Commit: all ``steps + 1`` positions of the chosen branch; those past the
        # accepted ones are beyond the new length, masked and later overwritten.
        self._commit(branch_k, branch_v, locations)
        return self._extend(hidden, bonus, topk)

    @torch.jit.export
    def commit(self) -> None:
        self._commit(self.args[0], self.args[1], self.args[2])

    def _commit(self, branch_k: Tensor, branch_v: Tensor, locations: Tensor) -> None:
        # A branch's tokens follow its first one in the slot's row (Note [The
        # request-to-token table]).
        offsets = torch.arange(branch_k.shape[3], device=locations.device)
        rows, positions = self._cell(locations[:, None] + offsets)
        for i in range(branch_k.shape[0]):
            # Advanced indices split by a slice: the indexed dims come first.
            self.k_cache[i, rows, :, positions] = branch_k[i].transpose(1, 2)
            self.v_cache[i, rows, :, positions] = branch_v[i].transpose(1, 2)

    @torch.jit.export
    def extend(self, topk: int) -> tuple[Tensor, Tensor, Tensor]:
        return self._extend(self.args[0], self.args[1], topk)

    def _extend(
        self, hidden: Tensor, tokens: Tensor, topk: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        h = self._draft_step(hidden, tokens)
        probs = torch.softmax((_rms_norm(h) @ self.lm_head_t).float(), dim=-1)
        topk_p, topk_index = probs.topk(topk, dim=-1)
        return topk_p, topk_index, h


# Note [The request-to-token table]
# A request owns its slot's rows of the cache for its whole life, so the table that
# maps (slot, position) to a KV location is the cache's own layout: location
# ``slot * max_context + position``, the flat index of that position in one layer's
# (pool_size, max_context) rows. A decode forward writes each row's new token's keys
# and values at the batch's ``out_cache_loc`` and a verify's further tokens at the
# locations after it, the next positions of the same row; the forward reads the slot
# and position back from the location, never from the row's slot or length. The
# locations are read from the table at the row's length (``seq_lens - 1``): by the
# forward, or, in a mixed batch whose lengths are bound late, by the map's
# ``resolve_tails`` from the published lengths (Note [Late-bound tails] in
# relay/engine/runner.py). A wrong location writes another position's or another
# slot's cache, and the outputs change. One exception: a plain decode whose lengths
# the forward has itself passes no locations (an empty tensor), and writes at its
# rows' slots and lengths, which is where the table points by construction; the
# table's gather and the round trip back would be five small ops on the overlap
# loop's critical path every step (about a tenth of the tiny model's step on a CPU).


class KVCache:
    """Keys and values of every layer, ``(layers, pool_size, heads, max_context,
    head_dim)``, and the request-to-token table of their locations: a request owns
    its slot's rows for its whole life (Note [The request-to-token table]); row 0 is
    the scratch slot. Positions at or beyond a request's length hold stale values
    that attention masks out."""

    def __init__(
        self, config: ModelConfig, pool_size: int, device: torch.device
    ) -> None:
        c = config
        shape = (c.layers, pool_size, c.heads, c.max_context, c.head_dim)
        self.k = torch.zeros(shape, dtype=c.dtype, device=device)
        self.v = torch.zeros(shape, dtype=c.dtype, device=device)
        #: (pool_size, max_context) each slot's tokens, where n-gram drafts are matched.
        self.tokens = torch.zeros(
            (pool_size, c.max_context), dtype=torch.int64, device=device
        )
        #: (pool_size,) how many of each slot's context tokens ``tokens`` holds: a
        #: prefill's prompt (or chunk end), an n-gram verify's length with its bonus.
        self.lengths = torch.zeros(pool_size, dtype=torch.int64, device=device)
        #: (pool_size, max_context) int64: each slot's positions' KV locations.
        self.req_to_token = torch.arange(
            pool_size * c.max_context, dtype=torch.int64, device=device
        ).view(pool_size, c.max_context)

    def accepted(self, seq_lens: Tensor, slots: Tensor) -> Tensor:
        """N-gram speculation: how many drafts each row's previous verify accepted,
        from its length now (``seq_lens``, the bonus included) and the context its
        history holds (Note [Packed accepted drafts] in relay/engine/runner.py)."""
        return seq_lens - self.lengths.index_select(0, slots) - 1


@attrs.frozen
class PackedDrafts:
    """N-gram speculation: the previous verify's accepted drafts as the next verify
    reads them, packed (Note [Packed accepted drafts] in relay/engine/runner.py)."""

    #: (n * width,): row i's drafts from ``starts[i]``, ``lens[i]`` of them.
    tokens: Tensor
    #: (n,) int64 each row's start in ``tokens`` and its count, 0 to ``width``.
    starts: Tensor
    lens: Tensor
    #: Drafts per verify.
    width: int


@attrs.frozen
class VerifyResult:
    """Greedy verification of a batch of draft trees."""

    #: (n, steps + 1): the target's greedy tokens along the chosen branch. The first
    #: ``accept_lens + 1`` of them are this step's output (accepted drafts, then the bonus).
    tokens: Tensor
    #: (n,): drafts accepted, 0..steps.
    accept_lens: Tensor
    #: (n,): the bonus token, the next step's input.
    bonus: Tensor
    #: (n, hidden): the target's last hidden state at the last accepted position.
    hidden: Tensor
    #: (layers, n, heads, steps + 1, head_dim) keys and values of the chosen branch.
    branch_k: Tensor
    branch_v: Tensor


class TargetModel:
    """The target model's weights: embeddings, pre-norm attention + SwiGLU layers, output head."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        c = config
        if c.hidden % c.heads:
            raise ValueError(
                f"hidden ({c.hidden}) must be a multiple of heads ({c.heads})"
            )
        if not 0 <= c.eos_token_id < c.vocab_size:
            raise ValueError(f"eos_token_id {c.eos_token_id} is outside the vocabulary")
        self.config = config
        gen = torch.Generator().manual_seed(config.seed)
        h, f, v = config.hidden, config.ffn, config.vocab_size

        def normal(*shape: int, std: float) -> Tensor:
            return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

        def place(w: Tensor) -> Tensor:
            return w.to(device=device, dtype=config.dtype).contiguous()

        self.embed = place(normal(v, h, std=1.0))
        self.pos_embed = place(normal(config.max_context, h, std=0.1))
        layers = [
            (
                normal(h, 3 * h, std=1 / math.sqrt(h)),
                normal(h, h, std=config.residual_scale / math.sqrt(h)),
                normal(h, 2 * f, std=1 / math.sqrt(h)),
                normal(f, h, std=config.residual_scale / math.sqrt(f)),
            )
            for _ in range(config.layers)
        ]
        stacked = [place(torch.stack(ws)) for ws in zip(*layers)]  # (layers, ...)
        self.wqkv, self.wo, self.w_up, self.w_down = stacked
        lm_head = normal(v, h, std=1.0)
        lm_head[config.eos_token_id] *= config.eos_boost
        self.lm_head_t = place(lm_head.t())  # (hidden, vocab)
        self.device = device


class DraftHead:
    """An EAGLE-style draft head: from a hidden state (the target's, or its own further
    down a draft chain) and the next token's embedding, the hidden state one position
    on; the target's output head turns it into logits."""

    def __init__(self, target: TargetModel) -> None:
        c = target.config
        gen = torch.Generator().manual_seed(c.seed + 1)
        w = torch.randn(c.hidden, c.hidden, generator=gen, dtype=torch.float64)
        self.w = (w * (c.draft_scale / math.sqrt(c.hidden))).to(target.device, c.dtype)


class Forwards:
    """The forwards of a target model (and draft head) over one KV cache;
    ``compiled=False`` runs them eagerly, as where TorchScript is unavailable."""

    def __init__(
        self,
        target: TargetModel,
        kv: KVCache,
        draft: DraftHead | None = None,
        *,
        compiled: bool = True,
    ) -> None:
        self.draft = draft
        #: The KV cache's request-to-token table (Note [The request-to-token table]).
        self.req_to_token = kv.req_to_token
        draft_w = draft.w if draft is not None else target.embed.new_empty(0)
        program = _Program(target, kv, draft_w)
        self.program = _script(program) if compiled else program
        self.program.args = []
        #: Whether the forwards run in TorchScript (without the GIL).
        self.compiled = self.program is not program

    def _call(self, args: list[Tensor], method: Callable[..., _T], *sizes: int) -> _T:
        """``method`` with ``args`` handed over in the module (Note [Forwards without
        the GIL]), cleared once it returns."""
        self.program.args = args
        try:
            return method(*sizes)
        finally:
            self.program.args = []

    def prefill(
        self, tokens: Tensor, prompt_lens: Tensor, slots: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Run right-padded prompts ``tokens`` (m, L), fill their KV rows from position
        0: the hidden state at each prompt's last position (m, hidden) and the greedy
        next token (m,). Padded positions write stale entries, overwritten or masked."""
        return self._call([tokens, prompt_lens, slots], self.program.prefill)

    def prefill_chunk(
        self, tokens: Tensor, starts: Tensor, lens: Tensor, slots: Tensor, max_end: int
    ) -> tuple[Tensor, Tensor]:
        """Run chunks ``tokens`` (m, L), right-padded, row i at positions ``starts[i]``
        on, ``lens[i]`` long, after the ``starts[i]`` tokens already cached; ``max_end``
        is the host maximum of ``starts + lens``. Returns what ``prefill`` does, at
        each chunk's last position."""
        args = [tokens, starts, lens, slots]
        return self._call(args, self.program.prefill_chunk, max_end)

    def decode(
        self,
        tokens: Tensor,
        seq_lens: Tensor,
        max_seq_len: int,
        slots: Tensor,
        locations: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """One token per request at position ``seq_lens - 1``, its keys and values
        written at ``locations`` (n,), or at that position of each slot's row when
        ``locations`` is empty (Note [The request-to-token table]): hidden (n, hidden)
        and next (n,); ``max_seq_len``, the host maximum of ``seq_lens``, is the
        attention width."""
        args = [tokens, seq_lens, slots, locations]
        return self._call(args, self.program.decode, max_seq_len)

    def draft_and_verify(
        self,
        bonus: Tensor,
        draft_hidden: Tensor,
        first: Tensor,
        steps: int,
        seq_lens: Tensor,
        max_seq_len: int,
        slots: Tensor,
    ) -> VerifyResult:
        """Draft ``topk`` branches of ``steps`` tokens from ``first`` (n, topk) and the
        draft state ``draft_hidden`` (n, hidden) after ``bonus`` (n,), the last
        verified token (at ``seq_lens - 1``, uncached); verify them greedily: the
        longest accepted prefix wins, the first on a tie. Writes no cache
        (``commit_and_extend`` does)."""
        args = [bonus, draft_hidden, first, seq_lens, slots]
        method = self.program.draft_and_verify
        return VerifyResult(*self._call(args, method, steps, max_seq_len))

    def ngram_verify(
        self,
        bonus: Tensor,
        drafts: PackedDrafts,
        seq_lens: Tensor,
        max_seq_len: int,
        slots: Tensor,
        variable: bool = False,
    ) -> VerifyResult:
        """N-gram speculation: append the previous step's accepted drafts (row i's
        ``drafts.lens[i]`` of them, packed from ``drafts.starts[i]``) and ``bonus`` to
        each slot's context, draft ``drafts.width`` tokens from its n-gram matches, and
        verify them as one branch (``draft_and_verify``). ``variable``: each request
        verifies only the drafts its match found, 0 to ``drafts.width`` (none without
        a match), so draft counts vary."""
        d = drafts
        args = [bonus, d.tokens, d.starts, d.lens, seq_lens, slots]
        method, sizes = self.program.ngram_verify, (d.width, max_seq_len, int(variable))
        return VerifyResult(*self._call(args, method, *sizes))

    def commit(self, result: VerifyResult, locations: Tensor) -> None:
        """Write the chosen branches to the cache (``commit_and_extend`` without the draft)."""
        args = [result.branch_k, result.branch_v, locations]
        self._call(args, self.program.commit)

    def commit_and_extend(
        self, result: VerifyResult, locations: Tensor, topk: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Write the chosen branches to the cache, each row's first token at
        ``locations`` (n,) and the rest after it (Note [The request-to-token table]),
        then draft the next step's top-k: ``(topk_p, topk_index, draft_hidden)`` after
        each bonus token."""
        r = result
        args = [r.branch_k, r.branch_v, locations, r.hidden, r.bonus]
        return self._call(args, self.program.commit_and_extend, topk)

    def extend(
        self, hidden: Tensor, tokens: Tensor, topk: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The first draft after a prefill: ``(topk_p, topk_index, draft_hidden)``."""
        return self._call([hidden, tokens], self.program.extend, topk)
