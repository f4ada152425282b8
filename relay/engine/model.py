"""A small decoder-only transformer, its EAGLE-style draft head and the KV cache.

Weights are drawn from a seeded generator, so every process and every run builds
the same model. Nothing is trained; see Note [A model with a predictable core].
"""

from __future__ import annotations

import math

import attrs
import torch
import torch.nn.functional as F

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


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@attrs.define
class _Layer:
    wqkv: torch.Tensor  # (hidden, 3 * hidden)
    wo: torch.Tensor  # (hidden, hidden)
    w_up: torch.Tensor  # (hidden, 2 * ffn): gate and up, SwiGLU
    w_down: torch.Tensor  # (ffn, hidden)


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

    @staticmethod
    def rows(cache: torch.Tensor, layer: int, slots: torch.Tensor, length: int) -> torch.Tensor:
        """The first ``length`` positions of ``slots`` in one layer: (n, heads, length, hd).

        Copies only those positions (``index_select`` of whole rows then a slice
        moves up to ``max_context / length`` times more memory).
        """
        return cache[layer, slots, :, :length]


@attrs.frozen
class VerifyResult:
    """Greedy verification of a batch of draft trees."""

    #: (n, steps + 1): the target's greedy tokens along the chosen branch. The first
    #: ``accept_lens + 1`` of them are this step's output (accepted drafts, then the bonus).
    tokens: torch.Tensor
    #: (n,): drafts accepted, 0..steps.
    accept_lens: torch.Tensor
    #: (n,): the bonus token, the next step's input.
    bonus: torch.Tensor
    #: (n, hidden): the target's last hidden state at the last accepted position.
    hidden: torch.Tensor
    #: (layers, n, heads, steps + 1, head_dim) keys and values of the chosen branch.
    branch_k: torch.Tensor
    branch_v: torch.Tensor


class TargetModel:
    """The target model: embeddings, pre-norm attention + SwiGLU layers, output head."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        config.check()
        self.config = config
        gen = torch.Generator().manual_seed(config.seed)
        h, f, v = config.hidden, config.ffn, config.vocab_size

        def normal(*shape: int, std: float) -> torch.Tensor:
            w = torch.randn(*shape, generator=gen, dtype=torch.float64) * std
            return w.to(device=device, dtype=config.dtype)

        self.embed = normal(v, h, std=1.0)
        self.pos_embed = normal(config.max_context, h, std=0.1)
        self.layers = [
            _Layer(
                wqkv=normal(h, 3 * h, std=1 / math.sqrt(h)),
                wo=normal(h, h, std=config.residual_scale / math.sqrt(h)),
                w_up=normal(h, 2 * f, std=1 / math.sqrt(h)),
                w_down=normal(f, h, std=config.residual_scale / math.sqrt(f)),
            )
            for _ in range(config.layers)
        ]
        lm_head = normal(v, h, std=1.0)
        lm_head[config.eos_token_id] *= config.eos_boost
        self.lm_head_t = lm_head.t().contiguous()  # (hidden, vocab)
        self.device = device

    # -- pieces ------------------------------------------------------------------
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output-head logits of final hidden states (any leading shape)."""
        return _rms_norm(hidden) @ self.lm_head_t

    def _qkv(self, layer: _Layer, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v of ``x`` (..., hidden), each (..., heads, head_dim)."""
        c = self.config
        qkv = _rms_norm(x) @ layer.wqkv
        return tuple(t.reshape(*t.shape[:-1], c.heads, c.head_dim) for t in qkv.chunk(3, dim=-1))

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = (_rms_norm(x) @ layer.w_up).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ layer.w_down

    # -- forwards ----------------------------------------------------------------
    def prefill(
        self, tokens: torch.Tensor, prompt_lens: torch.Tensor, slots: torch.Tensor, kv: KVCache
    ) -> torch.Tensor:
        """Run right-padded prompts ``tokens`` (m, L), fill their KV rows from position 0.

        Returns the final hidden state at each prompt's last position, (m, hidden).
        Padded positions write stale KV entries that later steps overwrite or mask.
        """
        m, length = tokens.shape
        x = self.embed[tokens] + self.pos_embed[:length]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x)  # (m, L, heads, head_dim)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            kv.k[i, slots, :, :length] = k
            kv.v[i, slots, :, :length] = v
            # Right padding: causal masking alone keeps real queries off padded keys.
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True)
            x = x + o.transpose(1, 2).flatten(-2) @ layer.wo
            x = x + self._mlp(layer, x)
        return x[torch.arange(m, device=x.device), prompt_lens - 1]

    def decode(
        self,
        tokens: torch.Tensor,
        seq_lens: torch.Tensor,
        max_seq_len: int,
        slots: torch.Tensor,
        kv: KVCache,
    ) -> torch.Tensor:
        """One token per request at position ``seq_lens - 1``; returns hidden (n, hidden).

        ``max_seq_len`` is the host-side maximum of ``seq_lens`` (the attention width).
        """
        positions = seq_lens - 1
        x = self.embed[tokens] + self.pos_embed[positions]
        valid = torch.arange(max_seq_len, device=x.device) < seq_lens[:, None]
        mask = valid[:, None, None, :]  # (n, 1, 1, L)
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x)  # (n, heads, head_dim)
            kv.k[i, slots, :, positions] = k
            kv.v[i, slots, :, positions] = v
            keys = kv.rows(kv.k, i, slots, max_seq_len)  # (n, heads, L, head_dim)
            values = kv.rows(kv.v, i, slots, max_seq_len)
            o = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=mask)
            x = x + o.flatten(1) @ layer.wo
            x = x + self._mlp(layer, x)
        return x

    def verify(
        self,
        bonus: torch.Tensor,
        drafts: torch.Tensor,
        seq_lens: torch.Tensor,
        max_seq_len: int,
        slots: torch.Tensor,
        kv: KVCache,
    ) -> VerifyResult:
        """Greedy verification of ``topk`` draft branches per request.

        ``bonus`` (n,) is the last verified token, at position ``seq_lens - 1`` and not
        yet in the cache; ``drafts`` (n, topk, steps) follow it. Every branch is scored
        as its own row over the shared cached prefix. The branch with the longest
        accepted prefix wins (the first on a tie). Nothing is written to the cache:
        the caller writes the chosen branch with ``commit``.
        """
        n, topk, steps = drafts.shape
        width = steps + 1
        rows = n * topk
        prefix = seq_lens - 1  # cached tokens
        prefix_width = max_seq_len - 1
        chain = torch.cat([bonus[:, None, None].expand(n, topk, 1), drafts], dim=2)
        positions = prefix[:, None] + torch.arange(width, device=bonus.device)  # (n, width)
        x = (self.embed[chain] + self.pos_embed[positions][:, None]).reshape(rows, width, -1)

        prefix_ok = torch.arange(prefix_width, device=x.device) < prefix[:, None]  # (n, P)
        prefix_ok = prefix_ok.repeat_interleave(topk, dim=0)[:, None, None, :]  # (rows,1,1,P)
        causal = torch.ones(width, width, dtype=torch.bool, device=x.device).tril()
        mask = torch.cat(
            [prefix_ok.expand(rows, 1, width, prefix_width), causal.expand(rows, 1, width, width)],
            dim=-1,
        )
        branch_k, branch_v = [], []
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x)  # (rows, width, heads, head_dim)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            branch_k.append(k)
            branch_v.append(v)
            cached_k = kv.rows(kv.k, i, slots, prefix_width).repeat_interleave(topk, dim=0)
            cached_v = kv.rows(kv.v, i, slots, prefix_width).repeat_interleave(topk, dim=0)
            keys = torch.cat([cached_k, k], dim=2)
            values = torch.cat([cached_v, v], dim=2)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + o.transpose(1, 2).flatten(-2) @ layer.wo
            x = x + self._mlp(layer, x)

        greedy = self.logits(x).argmax(-1).view(n, topk, width)
        matched = (drafts == greedy[:, :, :steps]).long().cumprod(dim=2).sum(dim=2)  # (n, topk)
        best = matched.argmax(dim=1)  # first maximum: deterministic tie-break
        accept = matched.gather(1, best[:, None]).squeeze(1)
        rows_best = torch.arange(n, device=x.device) * topk + best
        tokens = greedy.view(rows, width)[rows_best]
        hidden = x[rows_best, accept]
        bonus_next = tokens.gather(1, accept[:, None]).squeeze(1)
        stacked_k = torch.stack(branch_k)[:, rows_best]  # (layers, n, heads, width, hd)
        stacked_v = torch.stack(branch_v)[:, rows_best]
        return VerifyResult(tokens, accept, bonus_next, hidden, stacked_k, stacked_v)

    def commit(self, result: VerifyResult, seq_lens: torch.Tensor, slots: torch.Tensor, kv: KVCache) -> None:
        """Write the chosen branches' keys and values from position ``seq_lens - 1``.

        All ``steps + 1`` positions are written; those past the accepted ones are
        beyond the new length, so attention masks them and the next step overwrites.
        """
        width = result.tokens.shape[1]
        positions = (seq_lens - 1)[:, None] + torch.arange(width, device=seq_lens.device)
        rows = slots[:, None]
        for i in range(self.config.layers):
            # Advanced indices split by a slice: the indexed dims come first.
            kv.k[i, rows, :, positions] = result.branch_k[i].transpose(1, 2)
            kv.v[i, rows, :, positions] = result.branch_v[i].transpose(1, 2)


class DraftHead:
    """An EAGLE-style draft head: next hidden from (previous hidden, current token).

    ``step(hidden, token)`` reads the target's hidden state (or its own, further down
    a draft chain) and the embedding of the token after it, and predicts the hidden
    state one position on; the target's output head turns it into logits.
    """

    def __init__(self, target: TargetModel) -> None:
        c = target.config
        gen = torch.Generator().manual_seed(c.seed + 1)
        w = torch.randn(c.hidden, c.hidden, generator=gen, dtype=torch.float64)
        self.w = (w * (c.draft_scale / math.sqrt(c.hidden))).to(target.device, c.dtype)
        self.target = target

    def step(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The draft's hidden state for the position of ``tokens``."""
        return self.target.embed[tokens] + _rms_norm(hidden) @ self.w

    def draft(
        self, hidden: torch.Tensor, first: torch.Tensor, steps: int
    ) -> torch.Tensor:
        """Extend each of the ``topk`` first candidates (n, topk) greedily to ``steps`` tokens.

        ``hidden`` (n, hidden) is the draft state the candidates were drawn from.
        Returns (n, topk, steps).
        """
        n, topk = first.shape
        chain = [first]
        h = hidden[:, None, :].expand(n, topk, hidden.shape[-1])
        for _ in range(steps - 1):
            h = self.step(h, chain[-1])
            chain.append(self.target.logits(h).argmax(-1))
        return torch.stack(chain, dim=2)

    def extend(
        self, hidden: torch.Tensor, tokens: torch.Tensor, topk: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draft extension after verification: the next step's first top-k.

        Returns ``(topk_p, topk_index, draft_hidden)`` for the positions of ``tokens``.
        """
        h = self.step(hidden, tokens)
        probs = torch.softmax(self.target.logits(h).float(), dim=-1)
        topk_p, topk_index = probs.topk(topk, dim=-1)
        return topk_p, topk_index, h
