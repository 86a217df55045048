"""The per-job step ledger: which steps each trainer has applied, each exactly once.

A mark is one Lua script (HSETNX on the ledger hash + RPUSH on the audit log only when new), so two
consumers racing on a redelivered step cannot both record it. `entries()` is the audit trail that
proves every step was applied once and only once.
"""

from __future__ import annotations

import redis

from shared_store import keys
from shared_store.schemas import LedgerEntry, decode, encode

# KEYS: ledger hash, log list; ARGV: field, entry json
_MARK = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
"""


class StepLedger:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._mark = client.register_script(_MARK)

    @staticmethod
    def _field(role: keys.Role, step: int) -> str:
        return f"{role}:{int(step)}"

    def is_applied(self, job_id: str, role: keys.Role, step: int) -> bool:
        return bool(self.r.hexists(keys.ledger(job_id), self._field(role, step)))

    def mark(self, entry: LedgerEntry) -> bool:
        """Record that `entry.role` applied `entry.step`; False when it was already recorded."""
        args: list[str | bytes] = [self._field(entry.role, entry.step), encode(entry)]
        return bool(self._mark(keys=[keys.ledger(entry.job_id), keys.ledger_log(entry.job_id)], args=args))

    def entries(self, job_id: str) -> list[LedgerEntry]:
        return [decode(LedgerEntry, raw) for raw in self.r.lrange(keys.ledger_log(job_id), 0, -1)]

    def last_step(self, job_id: str, role: keys.Role) -> int:
        """The highest step `role` applied, or -1."""
        steps = [e.step for e in self.entries(job_id) if e.role == role]
        return max(steps, default=-1)
