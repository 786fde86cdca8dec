"""The deterministic prompt suite, aimed at the places a graph goes stale: bucket edges and packed batches.

Each case is one generate() call, so each is one packed prefill batch followed by decode steps.
"""

from __future__ import annotations

import torch


def prompt_suite(ladder: list[int], vocab_size: int, seed: int = 0, packed_sizes: tuple[int, ...] = (8,)) -> dict[str, list[list[int]]]:
    """Cases: one token, an exact bucket, bucket+1, above the largest bucket, packed batches of mixed lengths."""
    gen = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, vocab_size, (n,), generator=gen).tolist()

    max_tokens = ladder[-1]
    exact = ladder[min(len(ladder) // 3, len(ladder) - 1)]
    cases = {
        "one_token": [tokens(1)],
        f"exact_bucket_{exact}": [tokens(exact)],
        f"bucket_plus_one_{exact + 1}": [tokens(exact + 1)],
        f"above_max_{max_tokens + 1}": [tokens(max_tokens + 1)],
    }
    for n in packed_sizes:
        lengths = torch.randint(1, max(2, min(48, max_tokens // max(n, 1))), (n,), generator=gen).tolist()
        lengths[0] = 1  # a one-token sequence inside a packed batch
        cases[f"packed_{n}_mixed"] = [tokens(length) for length in lengths]
    return cases


def latency_token_counts(max_tokens: int) -> list[int]:
    return [n for n in (8, 32, 128, 512, 2048) if n <= max_tokens]
