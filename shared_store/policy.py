"""Policy versions per role, and the progress marks that drive garbage collection of old steps."""

from __future__ import annotations

import time
from typing import cast

import redis

from shared_store import keys
from shared_store._text import as_str
from shared_store.episodes import EpisodeStore
from shared_store.schemas import PolicyVersion, decode, encode
from shared_store.streams import trim_through_step

# KEYS[1] progress hash; ARGV: role, step. Only ever moves forward.
_ADVANCE = """
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if tonumber(ARGV[2]) > cur then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1 end
return 0
"""


CHECKPOINTS_KEPT = 10_000  # the job's checkpoint records (history, like the metrics stream)


class PolicyTimeoutError(TimeoutError):
    pass


class PolicyRegistry:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def publish(self, version: PolicyVersion) -> None:
        """The role's current version; one with a checkpoint is also recorded in the job's checkpoint list."""
        raw = encode(version)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(keys.policy(version.job_id), version.role, raw)
        if version.checkpoint:
            pipe.rpush(keys.checkpoints(version.job_id), raw)
            pipe.ltrim(keys.checkpoints(version.job_id), -CHECKPOINTS_KEPT, -1)
        pipe.execute()

    def checkpoints(self, job_id: str) -> list[PolicyVersion]:
        return [
            decode(PolicyVersion, raw)
            for raw in cast(list[bytes], self.r.lrange(keys.checkpoints(job_id), 0, -1))
        ]

    def get(self, job_id: str, role: keys.Role) -> PolicyVersion | None:
        raw = self.r.hget(keys.policy(job_id), role)
        return None if raw is None else decode(PolicyVersion, raw)

    def wait_for(
        self, job_id: str, role: keys.Role, min_version: int, *, timeout_s: float, poll_s: float = 0.02
    ) -> PolicyVersion:
        """Block until `role` has published a version >= min_version; PolicyTimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            current = self.get(job_id, role)
            if current is not None and current.version >= min_version:
                return current
            if time.monotonic() >= deadline:
                have = "none" if current is None else current.version
                raise PolicyTimeoutError(
                    f"the {role} trainer published no policy version >= {min_version} within {timeout_s:.0f} s "
                    f"(latest: {have}); is the {role} service running?"
                )
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, 0.05)  # a GET every 50 ms is nothing for Redis; waits end promptly


class Progress:
    """Each role's last completed step; steps every role of the job passed are garbage-collected."""

    def __init__(self, client: redis.Redis, episodes: EpisodeStore) -> None:
        self.r = client
        self.episodes = episodes
        self._advance = client.register_script(_ADVANCE)

    def advance(self, job_id: str, role: keys.Role, step: int) -> None:
        self._advance(keys=[keys.progress(job_id)], args=[role, int(step)])

    def get(self, job_id: str) -> dict[str, int]:
        raw = cast(dict[bytes, bytes], self.r.hgetall(keys.progress(job_id)))
        return {as_str(k): int(v) for k, v in raw.items()}

    def collect(self, job_id: str, *, roles: tuple[keys.Role, ...], keep_steps: int = 1) -> int:
        """Delete the episodes, per-step records and step-stream entries of steps every role finished,
        keeping the last `keep_steps` of them. Returns the number of steps collected this call."""
        prog = self.get(job_id)
        done = min(prog.get(r, -1) for r in roles)
        first = prog.get("gc", -1) + 1
        last = done - keep_steps
        for step in range(first, last + 1):
            self.episodes.delete_step(job_id, step)
            self.r.delete(
                *(keys.step_record(job_id, n, step) for n in keys.step_streams(roles)),
                keys.root_step(job_id, step),
            )
        if last >= first:
            for name in keys.step_streams(roles):  # consumed by every role: the entries are history now
                trim_through_step(self.r, keys.stream(job_id, name), last)
            self.r.hset(keys.progress(job_id), "gc", last)
        return max(0, last - first + 1)
