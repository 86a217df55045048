"""Which outputs of one agent the next agent works on (MarsRL grouped rollouts, algorithm.md §9).

Each later agent takes `k` (= 2) of the preceding agent's outputs for a problem and generates a group
of G outputs for each, so every GRPO group shares one input. Strategies [ours, algorithm.md §9]:

- `random`: k candidates uniformly without replacement.
- `balanced`: as many reward-1 as reward-0 candidates when both exist (k = 2: one of each), the
  rest at random.
- `adaptive` (default): candidates whose reward equals `prefer` first, then the others, each part
  in random order. The verifier prefers wrong solutions (`prefer=0`); the corrector prefers reports
  that correctly flagged an error (`prefer=1`, among reports with verdict Wrong, which the caller
  filters).

Draws come from one numpy PCG64 stream seeded by `seed` (derive it with `alignment_seed`). Fewer
than `k` candidates: all of them. The returned indices are sorted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

Strategy = Literal["adaptive", "balanced", "random"]
STRATEGIES: tuple[Strategy, ...] = ("adaptive", "balanced", "random")


def select_inputs(
    rewards: Sequence[float], k: int, strategy: Strategy, *, prefer: float, seed: int
) -> list[int]:
    """Indices of the `k` candidates (by their rewards ∈ {0, 1}) the next agent takes."""
    if strategy not in STRATEGIES:
        raise ValueError(f"selection strategy must be one of {STRATEGIES}, got {strategy!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = len(rewards)
    if n <= k:
        return list(range(n))
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(n)]
    if strategy == "random":
        return sorted(order[:k])
    good = [i for i in order if rewards[i] == prefer]
    rest = [i for i in order if rewards[i] != prefer]
    if strategy == "adaptive":
        return sorted((good + rest)[:k])
    ones = [i for i in order if rewards[i] == 1.0]
    zeros = [i for i in order if rewards[i] != 1.0]
    picked: list[int] = []
    while len(picked) < k and (ones or zeros):  # alternate while both pools last
        for pool in (ones, zeros):
            if pool and len(picked) < k:
                picked.append(pool.pop(0))
    return sorted(picked)
