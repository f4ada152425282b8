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


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("etaoinshrd") for _ in range(rng.randint(3, 5)))


def make_workload(
    config: WorkloadConfig, vocab_size: int, eos_token_id: int
) -> list[RequestSpec]:
    """Deterministic requests for ``config``; prompts never contain EOS."""
    rng = random.Random(config.seed)
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
        specs.append(
            RequestSpec(
                rid=rid,
                prompt=tuple(prompt),
                max_new_tokens=rng.randint(config.min_output, config.max_output),
                arrival_step=int(clock),
                stop=tuple(_word(rng) for _ in range(rng.randint(0, 2))),
            )
        )
    return specs
