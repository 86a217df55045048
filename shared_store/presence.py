"""Which trainer services are up, per role: each job worker beats every few seconds.

    keys.trainers(role)   ZSET  consumer name → unix time of its last heartbeat

The controller asks it to tell a job whose roles no trainer serves (`missing`): the job is warned
about at submission and failed with the missing roles named once it has waited `queue_timeout_s`,
instead of staying queued forever.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis

from shared_store import keys

BEAT_EVERY_S = 5.0
ALIVE_WITHIN_S = 30.0  # a trainer that has not beaten for this long counts as gone
FORGET_AFTER_S = 24 * 3600.0


class Presence:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def beat(self, role: str, name: str) -> None:
        """`name`'s service for `role` is up now (and old names are forgotten)."""
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(keys.trainers(role), {name: now})
        pipe.zremrangebyscore(keys.trainers(role), "-inf", now - FORGET_AFTER_S)
        pipe.execute()

    def alive(self, role: str, *, within_s: float = ALIVE_WITHIN_S) -> bool:
        return int(self.r.zcount(keys.trainers(role), time.time() - within_s, "+inf")) > 0

    def missing(self, roles: Iterable[str]) -> list[str]:
        """The roles no trainer service serves now."""
        return [r for r in roles if not self.alive(r)]
