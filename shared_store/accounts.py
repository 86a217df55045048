"""Each role's training queue, accounted per step: what its producer handed it and what its trainer
did with it. The root trainer writes `produced` (its own samples of a step; for a callee role, the
episodes the step's message hands it), each trainer writes `trained`, `dropped` (beyond the
staleness bound, `stale_samples: drop`) and `unaligned` (episodes trajectory alignment left out).
Counts are set per step, never added. A root that restarts trains a step it had published as it was
(`shared_store.root_steps`) and sets the same counts again; a callee's `produced` keeps the first
message's (`first_wins`). Summed over a finished job, produced = trained + dropped + unaligned for
every role."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from shared_store import keys

KINDS = ("produced", "trained", "dropped", "unaligned")


@dataclass
class SampleAccounts:
    client: redis.Redis

    def record(self, job_id: str, role: str, step: int, *, first_wins: bool = False, **counts: int) -> None:
        """Set `counts` (kind → n) of one role's step (`first_wins`: keep counts already set)."""
        bad = [k for k in counts if k not in KINDS]
        if bad:
            raise ValueError(f"sample count kinds are {KINDS}, got {bad}")
        fields = {f"{keys.check_role(role)}:{k}:{int(step)}": int(n) for k, n in counts.items()}
        if first_wins:
            for name, n in fields.items():
                self.client.hsetnx(keys.sample_counts(job_id), name, n)
        elif fields:
            self.client.hset(keys.sample_counts(job_id), mapping=fields)  # type: ignore[arg-type]

    def totals(self, job_id: str) -> dict[str, dict[str, int]]:
        """role → kind → count summed over the job's steps."""
        out: dict[str, dict[str, int]] = {}
        raw: dict[bytes, bytes] = self.client.hgetall(keys.sample_counts(job_id))  # type: ignore[assignment]
        for field, value in raw.items():
            role, kind, _ = field.decode().split(":")
            per = out.setdefault(role, dict.fromkeys(KINDS, 0))
            per[kind] += int(value)
        return out
