"""Speculative decoding's settings: a leaf the runner, the relays and the graphs share."""

from __future__ import annotations

import attrs

__all__ = ["SpecConfig"]


@attrs.frozen(kw_only=True)
class SpecConfig:
    """Speculative decoding: ``method`` ``eagle`` drafts ``topk`` branches of ``steps``
    tokens with a draft head; ``ngram`` drafts one branch of ``steps`` tokens from
    n-gram matches in the request's own context (``topk`` unused). ``variable_drafts``
    (n-gram only): each request verifies 0 to ``steps`` drafts, as many as its match
    found, instead of padding a short match with its last token."""

    steps: int = 3
    topk: int = 2
    method: str = "eagle"
    variable_drafts: bool = False

    def __attrs_post_init__(self) -> None:
        if self.method not in ("eagle", "ngram"):
            raise ValueError(f"method must be eagle or ngram (got {self.method!r})")
        if self.variable_drafts and self.method != "ngram":
            raise ValueError("variable_drafts needs method='ngram'")
