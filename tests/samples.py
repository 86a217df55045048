"""Hand-made `Sample`s for update tests: transcripts with advantages, some from an older policy."""

from __future__ import annotations

from collections.abc import Sequence

from mgrpo.records import Sample, Transcript


def as_samples(
    transcripts: Sequence[Transcript], advantages: Sequence[float], stale: Sequence[bool] | None = None
) -> tuple[list[Sample], int | None]:
    """One sample per transcript; with `stale` flags, a flagged one comes from policy 0 and the others
    from policy 1, and the version to train is 1 (None without flags: every sample is fresh)."""
    flags = stale if stale is not None else [False] * len(transcripts)
    out = [
        Sample("role", str(i), t, 0.0, advantage=a, policy_version=0 if old else 1)
        for i, (t, a, old) in enumerate(zip(transcripts, advantages, flags, strict=True))
    ]
    return out, (1 if stale is not None else None)
