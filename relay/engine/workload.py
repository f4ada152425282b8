"""Synthetic workloads: requests with varied prompts and output limits, arriving over time."""

from __future__ import annotations

import random

import attrs

__all__ = ["RequestSpec", "WorkloadConfig", "make_workload"]


@attrs.frozen(kw_only=True)
class RequestSpec:
    """One request as a client sends it."""

    rid: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    #: Scheduler step at which the request arrives. Steps, not seconds, so every
    #: mode and every run sees the same arrivals (see Note [One schedule for both modes]).
    arrival_step: int
    #: Stop strings: the output ends after the token that completes one.
    stop: tuple[str, ...] = ()
    #: The client disconnects at this step (``None``: never): the request is aborted
    #: wherever it is, waiting, prefilling or decoding.
    abort_step: int | None = None
    #: Prefilled elsewhere (prefill/decode disaggregation): the first output token,
    #: which the prefill server sampled; the prompt's KV arrives with it.
    first_token: int | None = None


@attrs.frozen(kw_only=True)
class WorkloadConfig:
    """Shape of a synthetic workload."""

    requests: int = 200
    min_prompt: int = 8
    max_prompt: int = 64
    min_output: int = 8
    max_output: int = 64
    #: Mean number of arrivals per scheduler step.
    arrival_rate: float = 2.0
    seed: int = 0
    #: Share of requests aborted, each at a step drawn after its arrival.
    abort_share: float = 0.0
    #: Share of requests that arrive prebuilt (prompt prefilled elsewhere).
    prebuilt_share: float = 0.0


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("etaoinshrd") for _ in range(rng.randint(3, 5)))


def make_workload(
    config: WorkloadConfig, vocab_size: int, eos_token_id: int
) -> list[RequestSpec]:
    """Deterministic requests for ``config``; prompts never contain EOS."""
    rng = random.Random(config.seed)
    # Aborts and prebuilt requests draw from their own stream, so turning them on
    # leaves every prompt and output limit as it was.
    extra = random.Random(config.seed + 7919)
    specs: list[RequestSpec] = []
    clock = 0.0
    for rid in range(config.requests):
        clock += rng.expovariate(config.arrival_rate)
        length = rng.randint(config.min_prompt, config.max_prompt)
        prompt: list[int] = []
        while len(prompt) < length:
            token = rng.randrange(3, vocab_size)
            if token != eos_token_id:
                prompt.append(token)
        abort = extra.random() < config.abort_share
        abort_after = extra.randint(1, 24)
        prebuilt = extra.random() < config.prebuilt_share
        first = extra.randrange(3, vocab_size)
        if first == eos_token_id:
            first = 3
        specs.append(
            RequestSpec(
                rid=rid,
                prompt=tuple(prompt),
                max_new_tokens=rng.randint(config.min_output, config.max_output),
                arrival_step=int(clock),
                stop=tuple(_word(rng) for _ in range(rng.randint(0, 2))),
                abort_step=int(clock) + abort_after if abort else None,
                first_token=first if prebuilt else None,
            )
        )
    return specs
