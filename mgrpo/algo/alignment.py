"""Trajectory alignment to fixed-size sub-agent batches (algorithm.md §3; M-GRPO paper §4.1).

A query has K rollouts; rollout k made d_k delegations (sub-agent episodes), d_k varies and may be 0.
Alignment gives every rollout exactly D slots, each slot a (rollout index, episode index) pair:

- d_k == D: the rollout's own episodes, in order.
- d_k > D: D of its episodes drawn uniformly **without replacement**, original order kept.
- 0 < d_k < D: all its episodes in order, then D − d_k copies drawn uniformly **with replacement**
  from its own episodes [decision].
- d_k == 0: D draws uniformly with replacement from the query's pooled episodes (all rollouts)
  [decision]. A query with no episode at all yields an empty list for every rollout.
- mode "none" (ablation; what the authors' public code does): every rollout keeps exactly its own
  episodes, nothing duplicated or dropped.

Duplicates are real samples: they count in the group mean, std and loss (the caller's job).
Draws come from one numpy PCG64 stream seeded by `seed`; trainers derive it with
`alignment_seed(job_seed, step, query_id)` so a run is reproducible [decision].
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

import numpy as np

AlignMode = Literal["duplicate_drop", "none"]
Slot = tuple[int, int]


def alignment_seed(job_seed: int, step: int, query_id: str | int) -> int:
    """A stable 63-bit seed from (job seed, step, query id); the same on every machine and Python."""
    digest = hashlib.blake2b(f"{job_seed}:{step}:{query_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _check(episode_counts: Sequence[int], slots: int, mode: str) -> list[int]:
    if mode not in ("duplicate_drop", "none"):
        raise ValueError(f"mode must be 'duplicate_drop' or 'none', got {mode!r}")
    if isinstance(slots, bool) or not isinstance(slots, int | np.integer) or slots < 1:
        raise ValueError(f"slots (D) must be an integer >= 1, got {slots!r}")
    counts = [int(c) for c in episode_counts]
    if any(c < 0 for c in counts):
        raise ValueError(f"episode_counts must be >= 0, got {list(episode_counts)!r}")
    return counts


def _align_rollout(k: int, d: int, slots: int, pool: list[Slot], rng: np.random.Generator) -> list[Slot]:
    if d == slots:
        return [(k, i) for i in range(d)]
    if d > slots:
        keep = np.sort(rng.choice(d, size=slots, replace=False))
        return [(k, int(i)) for i in keep]
    if d > 0:
        extra = rng.integers(0, d, size=slots - d)
        return [(k, i) for i in range(d)] + [(k, int(i)) for i in extra]
    picks = rng.integers(0, len(pool), size=slots)
    return [pool[int(i)] for i in picks]


def align_episodes(
    episode_counts: Sequence[int],
    slots: int,
    *,
    seed: int,
    mode: AlignMode = "duplicate_drop",
) -> list[list[Slot]]:
    """Align one query's episodes to `slots` (D) per rollout.

    Args:
        episode_counts: d_1 … d_K, the number of episodes of each rollout of one query.
        slots: D, the target number of sub-agent samples per rollout.
        seed: seed of the draws (see `alignment_seed`).
        mode: "duplicate_drop" (paper) or "none" (ablation).

    Returns:
        A list of K lists; list k holds (rollout index, episode index) pairs. With "duplicate_drop"
        each has exactly D pairs (or all are empty when the query has no episode at all).
    """
    counts = _check(episode_counts, slots, mode)
    if mode == "none":
        return [[(k, i) for i in range(d)] for k, d in enumerate(counts)]
    pool = [(k, i) for k, d in enumerate(counts) for i in range(d)]
    if not pool:
        return [[] for _ in counts]
    rng = np.random.default_rng(seed)
    return [_align_rollout(k, d, slots, pool, rng) for k, d in enumerate(counts)]
