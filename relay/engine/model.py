"""A small decoder-only transformer, its EAGLE-style draft head and the KV cache.

Weights are drawn from a seeded generator, so every process and every run builds
the same model. Nothing is trained; see Note [A model with a predictable core].
Each forward is one call of a TorchScript function (Note [Forwards without the GIL]).
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

__all__ = ["DraftHead", "KVCache", "ModelConfig", "TargetModel", "VerifyResult"]


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
# small ops crawls exactly when it should overlap (measured: a 4 ms forward took
# 20 ms beside a busy Python thread). The model's forwards are therefore written as
# TorchScript functions: one call runs all of a forward's ops in the TorchScript
# interpreter, which holds no GIL, like a GPU running a launched graph. TorchScript
# is deprecated in recent torch; where it is missing or fails, the same functions run
# eagerly, with the same results and only the contention back.


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def _script(fn: _Fn) -> _Fn:
    """``fn`` compiled by TorchScript, or ``fn`` itself where TorchScript is unavailable."""
    script = getattr(torch.jit, "script", None)
    if script is None:
        return fn
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's deprecation notice
            compiled: _Fn = script(fn)
    except Exception:  # noqa: BLE001 - any compiler failure: run eagerly instead
        return fn
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

    def check(self) -> None:
        """Raise ``ValueError`` on sizes the model cannot be built with."""
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(f"eos_token_id {self.eos_token_id} is outside the vocabulary")


# -- the forwards, as TorchScript-compatible functions -----------------------------
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


def _greedy(hidden: Tensor, lm_head_t: Tensor) -> Tensor:
    return (_rms_norm(hidden) @ lm_head_t).argmax(-1)


def _prefill(
    tokens: Tensor, prompt_lens: Tensor, slots: Tensor, embed: Tensor, pos_embed: Tensor,
    wqkv: Tensor, wo: Tensor, w_up: Tensor, w_down: Tensor, lm_head_t: Tensor,
    k_cache: Tensor, v_cache: Tensor,
) -> tuple[Tensor, Tensor]:
    m, length = tokens.shape[0], tokens.shape[1]
    heads = k_cache.shape[2]
    x = embed[tokens] + pos_embed[:length]
    for i in range(wqkv.shape[0]):
        q, k, v = _qkv(x, wqkv[i], heads)  # (m, L, heads, head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        k_cache[i, slots, :, :length] = k
        v_cache[i, slots, :, :length] = v
        # Right padding: causal masking alone keeps real queries off padded keys.
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True)
        x = x + o.transpose(1, 2).flatten(-2) @ wo[i]
        x = x + _mlp(x, w_up[i], w_down[i])
    hidden = x[torch.arange(m, device=x.device), prompt_lens - 1]
    return hidden, _greedy(hidden, lm_head_t)


def _decode(
    tokens: Tensor, seq_lens: Tensor, max_seq_len: int, slots: Tensor, embed: Tensor,
    pos_embed: Tensor, wqkv: Tensor, wo: Tensor, w_up: Tensor, w_down: Tensor,
    lm_head_t: Tensor, k_cache: Tensor, v_cache: Tensor,
) -> tuple[Tensor, Tensor]:
    heads = k_cache.shape[2]
    positions = seq_lens - 1
    x = embed.index_select(0, tokens) + pos_embed.index_select(0, positions)
    valid = torch.arange(max_seq_len, device=x.device) < seq_lens[:, None]
    mask = valid[:, None, None, :]  # (n, 1, 1, L)
    for i in range(wqkv.shape[0]):
        q, k, v = _qkv(x, wqkv[i], heads)  # (n, heads, head_dim)
        k_cache[i, slots, :, positions] = k
        v_cache[i, slots, :, positions] = v
        # index_select of a sliced view: a few times faster than advanced indexing.
        keys = k_cache[i, :, :, :max_seq_len].index_select(0, slots)  # (n, heads, L, hd)
        values = v_cache[i, :, :, :max_seq_len].index_select(0, slots)
        o = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=mask)
        x = x + o.flatten(1) @ wo[i]
        x = x + _mlp(x, w_up[i], w_down[i])
    return x, _greedy(x, lm_head_t)


def _draft_and_verify(
    bonus: Tensor, draft_hidden: Tensor, first: Tensor, steps: int, seq_lens: Tensor,
    max_seq_len: int, slots: Tensor, embed: Tensor, pos_embed: Tensor, draft_w: Tensor,
    wqkv: Tensor, wo: Tensor, w_up: Tensor, w_down: Tensor, lm_head_t: Tensor,
    k_cache: Tensor, v_cache: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    # The draft: extend each first candidate greedily to ``steps`` tokens.
    n, topk = first.shape[0], first.shape[1]
    chain = [first]
    h = draft_hidden[:, None, :].expand(n, topk, draft_hidden.shape[-1])
    for _ in range(steps - 1):
        h = embed[chain[-1]] + _rms_norm(h) @ draft_w
        chain.append(_greedy(h, lm_head_t))
    drafts = torch.stack(chain, dim=2)  # (n, topk, steps)

    # Verification: every branch is its own row over the shared cached prefix.
    heads = k_cache.shape[2]
    width = steps + 1
    rows = n * topk
    prefix = seq_lens - 1  # cached tokens
    prefix_width = max_seq_len - 1
    tree = torch.cat([bonus[:, None, None].expand(n, topk, 1), drafts], dim=2)
    positions = prefix[:, None] + torch.arange(width, device=bonus.device)  # (n, width)
    x = (embed[tree] + pos_embed[positions][:, None]).reshape(rows, width, -1)
    prefix_ok = torch.arange(prefix_width, device=x.device) < prefix[:, None]  # (n, P)
    prefix_ok = prefix_ok.repeat_interleave(topk, dim=0)[:, None, None, :]  # (rows, 1, 1, P)
    slots_rows = slots.repeat_interleave(topk)  # each branch reads its request's cache
    causal = torch.ones(width, width, dtype=torch.bool, device=x.device).tril()
    mask = torch.cat(
        [prefix_ok.expand(rows, 1, width, prefix_width), causal.expand(rows, 1, width, width)],
        dim=-1,
    )
    branch_k: list[Tensor] = []
    branch_v: list[Tensor] = []
    for i in range(wqkv.shape[0]):
        q, k, v = _qkv(x, wqkv[i], heads)  # (rows, width, heads, head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        branch_k.append(k)
        branch_v.append(v)
        cached_k = k_cache[i, :, :, :prefix_width].index_select(0, slots_rows)
        cached_v = v_cache[i, :, :, :prefix_width].index_select(0, slots_rows)
        keys = torch.cat([cached_k, k], dim=2)
        values = torch.cat([cached_v, v], dim=2)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + o.transpose(1, 2).flatten(-2) @ wo[i]
        x = x + _mlp(x, w_up[i], w_down[i])

    greedy = _greedy(x, lm_head_t).view(n, topk, width)
    matched = (drafts == greedy[:, :, :steps]).long().cumprod(dim=2).sum(dim=2)  # (n, topk)
    best = matched.argmax(dim=1)  # first maximum: deterministic tie-break
    accept = matched.gather(1, best[:, None]).squeeze(1)
    rows_best = torch.arange(n, device=x.device) * topk + best
    tokens = greedy.view(rows, width)[rows_best]
    hidden = x[rows_best, accept]
    bonus_next = tokens.gather(1, accept[:, None]).squeeze(1)
    stacked_k = torch.stack(branch_k)[:, rows_best]  # (layers, n, heads, width, head_dim)
    stacked_v = torch.stack(branch_v)[:, rows_best]
    return tokens, accept, bonus_next, hidden, stacked_k, stacked_v


def _commit_and_extend(
    branch_k: Tensor, branch_v: Tensor, seq_lens: Tensor, slots: Tensor, hidden: Tensor,
    bonus: Tensor, topk: int, embed: Tensor, draft_w: Tensor, lm_head_t: Tensor,
    k_cache: Tensor, v_cache: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    # Commit: all ``steps + 1`` positions of the chosen branch; those past the
    # accepted ones are beyond the new length, masked and later overwritten.
    width = branch_k.shape[3]
    positions = (seq_lens - 1)[:, None] + torch.arange(width, device=seq_lens.device)
    rows = slots[:, None]
    for i in range(branch_k.shape[0]):
        # Advanced indices split by a slice: the indexed dims come first.
        k_cache[i, rows, :, positions] = branch_k[i].transpose(1, 2)
        v_cache[i, rows, :, positions] = branch_v[i].transpose(1, 2)
    return _extend(hidden, bonus, topk, embed, draft_w, lm_head_t)


def _extend(
    hidden: Tensor, tokens: Tensor, topk: int, embed: Tensor, draft_w: Tensor, lm_head_t: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    h = embed[tokens] + _rms_norm(hidden) @ draft_w
    probs = torch.softmax((_rms_norm(h) @ lm_head_t).float(), dim=-1)
    topk_p, topk_index = probs.topk(topk, dim=-1)
    return topk_p, topk_index, h



@attrs.frozen
class _Kernels:
    prefill: Callable[..., tuple[Tensor, Tensor]]
    decode: Callable[..., tuple[Tensor, Tensor]]
    draft_and_verify: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]]
    commit_and_extend: Callable[..., tuple[Tensor, Tensor, Tensor]]
    extend: Callable[..., tuple[Tensor, Tensor, Tensor]]


_compiled: _Kernels | None = None


def _kernels() -> _Kernels:
    """The forwards, compiled on first use (about a second) and shared by every model."""
    global _compiled
    if _compiled is None:
        _compiled = _Kernels(
            _script(_prefill), _script(_decode), _script(_draft_and_verify),
            _script(_commit_and_extend), _script(_extend),
        )
    return _compiled


class KVCache:
    """Keys and values of every layer, indexed by request-pool slot and position.

    Shape per tensor: ``(layers, pool_size, heads, max_context, head_dim)``. A request
    owns its slot's rows for its whole life, so the cache needs no block table; row 0
    is the scratch slot. Positions at or beyond a request's length hold stale values
    that attention masks out.
    """

    def __init__(self, config: ModelConfig, pool_size: int, device: torch.device) -> None:
        shape = (config.layers, pool_size, config.heads, config.max_context, config.head_dim)
        self.k = torch.zeros(shape, dtype=config.dtype, device=device)
        self.v = torch.zeros(shape, dtype=config.dtype, device=device)


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
    """The target model: embeddings, pre-norm attention + SwiGLU layers, output head."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        config.check()
        self.config = config
        self.kernels = _kernels()
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
        # Stacked on a leading layer dimension (see the forwards above).
        self.wqkv, self.wo, self.w_up, self.w_down = (
            place(torch.stack(ws)) for ws in zip(*layers)
        )
        lm_head = normal(v, h, std=1.0)
        lm_head[config.eos_token_id] *= config.eos_boost
        self.lm_head_t = place(lm_head.t())  # (hidden, vocab)
        self.device = device

    def prefill(self, tokens: Tensor, prompt_lens: Tensor, slots: Tensor, kv: KVCache
                ) -> tuple[Tensor, Tensor]:
        """Run right-padded prompts ``tokens`` (m, L), fill their KV rows from position 0.

        Returns the final hidden state at each prompt's last position (m, hidden) and
        the greedy next token (m,). Padded positions write stale KV entries that later
        steps overwrite or mask.
        """
        return self.kernels.prefill(
            tokens, prompt_lens, slots, self.embed, self.pos_embed, self.wqkv, self.wo,
            self.w_up, self.w_down, self.lm_head_t, kv.k, kv.v,
        )

    def decode(self, tokens: Tensor, seq_lens: Tensor, max_seq_len: int, slots: Tensor,
               kv: KVCache) -> tuple[Tensor, Tensor]:
        """One token per request at position ``seq_lens - 1``: hidden (n, hidden), next (n,).

        ``max_seq_len`` is the host-side maximum of ``seq_lens`` (the attention width).
        """
        return self.kernels.decode(
            tokens, seq_lens, max_seq_len, slots, self.embed, self.pos_embed, self.wqkv,
            self.wo, self.w_up, self.w_down, self.lm_head_t, kv.k, kv.v,
        )


class DraftHead:
    """An EAGLE-style draft head: next hidden from (previous hidden, current token).

    A draft step reads the target's hidden state (or its own, further down a draft
    chain) and the embedding of the token after it, and predicts the hidden state one
    position on; the target's output head turns it into logits.
    """

    def __init__(self, target: TargetModel) -> None:
        c = target.config
        gen = torch.Generator().manual_seed(c.seed + 1)
        w = torch.randn(c.hidden, c.hidden, generator=gen, dtype=torch.float64)
        self.w = (w * (c.draft_scale / math.sqrt(c.hidden))).to(target.device, c.dtype)
        self.target = target

    def draft_and_verify(
        self, bonus: Tensor, draft_hidden: Tensor, first: Tensor, steps: int, seq_lens: Tensor,
        max_seq_len: int, slots: Tensor, kv: KVCache,
    ) -> VerifyResult:
        """Draft ``topk`` branches of ``steps`` tokens, then verify them greedily.

        ``first`` (n, topk) are the branches' first tokens, drawn from the draft state
        ``draft_hidden`` (n, hidden). ``bonus`` (n,) is the last verified token, at
        position ``seq_lens - 1`` and not yet in the cache. Every branch is scored as its
        own row over the shared cached prefix; the one with the longest accepted prefix
        wins (the first on a tie). Nothing is written to the cache: see
        ``commit_and_extend``.
        """
        t = self.target
        return VerifyResult(*t.kernels.draft_and_verify(
            bonus, draft_hidden, first, steps, seq_lens, max_seq_len, slots, t.embed,
            t.pos_embed, self.w, t.wqkv, t.wo, t.w_up, t.w_down, t.lm_head_t, kv.k, kv.v,
        ))

    def commit_and_extend(
        self, result: VerifyResult, seq_lens: Tensor, slots: Tensor, kv: KVCache, topk: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Write the chosen branches to the cache, then draft the next step's top-k.

        Returns ``(topk_p, topk_index, draft_hidden)`` after each bonus token.
        """
        t = self.target
        return t.kernels.commit_and_extend(
            result.branch_k, result.branch_v, seq_lens, slots, result.hidden, result.bonus,
            topk, t.embed, self.w, t.lm_head_t, kv.k, kv.v,
        )

    def extend(self, hidden: Tensor, tokens: Tensor, topk: int) -> tuple[Tensor, Tensor, Tensor]:
        """The first draft after a prefill: ``(topk_p, topk_index, draft_hidden)``."""
        t = self.target
        return t.kernels.extend(hidden, tokens, topk, t.embed, self.w, t.lm_head_t)
