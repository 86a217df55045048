"""The job registry: create (idempotent), get, list, atomic status transitions, cancel.

Status machine: queued → running → succeeded | failed | cancelled, and queued → cancelled | failed.
A transition runs as one Lua script on the job's hash (one key, so Redis Cluster safe): concurrent
writers never lose an update, and a finished job cannot be moved by a late writer. Moving to the
state a job is already in is an idempotent no-op.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import redis

from shared_store import keys
from shared_store._text import as_str
from shared_store.schemas import TERMINAL, JobDispatch, JobRecord, JobStatus, encode

ALLOWED: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "cancelled", "failed"}),
    "running": frozenset({"succeeded", "failed", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset({"queued"}),  # resume (JobRegistry.resume)
    "cancelled": frozenset({"queued"}),
}
DISPATCH_MAXLEN = 10_000
JOB_RETENTION_S = 14 * 24 * 3600.0  # a finished job's keys live this long (MGRPO_JOB_RETENTION_S)
DISPATCH_LOCK_MS = 30_000  # a create that crashed mid-dispatch blocks a retry this long

# KEYS[1] job hash; ARGV: new status, reason, now, allowed-from list (space separated)
_TRANSITION = """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {-1, ''} end
if cur == ARGV[1] then return {1, cur} end
for from in string.gmatch(ARGV[4], '%S+') do
  if from == cur then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3])
    if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'reason', ARGV[2]) end
    return {0, cur}
  end
end
return {-2, cur}
"""

# KEYS[1] job hash; ARGV: now. A failed or cancelled job back to queued, to be dispatched again.
_RESUME = """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return {-1, ''} end
if cur ~= 'failed' and cur ~= 'cancelled' then return {-2, cur} end
redis.call('HSET', KEYS[1], 'status', 'queued', 'reason', '', 'cancel_requested', 0, 'dispatched', 0,
           'updated_at', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'resumes', 1)
return {0, cur}
"""

# KEYS[1] job hash; ARGV: flat field/value pairs. Returns 1 when created, 0 when it existed.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""


class JobNotFoundError(KeyError):
    def __str__(self) -> str:
        return f"job {self.args[0]!r} not found"


class JobCancelled(Exception):
    """Raised by a trainer that saw the job's cancel flag; its worker marks the job cancelled."""


class JobConflictError(ValueError):
    """An illegal status transition, or a create that reuses an id with another config."""


class JobRegistry:
    def __init__(self, client: redis.Redis, *, retention_s: float = JOB_RETENTION_S) -> None:
        self.r, self.retention_s = client, retention_s
        self._transition = client.register_script(_TRANSITION)
        self._create = client.register_script(_CREATE)
        self._resume = client.register_script(_RESUME)

    def create(
        self, config: dict[str, Any], job_id: str | None = None, *, roles: tuple[keys.Role, ...]
    ) -> tuple[JobRecord, bool]:
        """Create a queued job and dispatch it to `roles` (the roles that run a trainer, root first; the
        record keeps them). Same id + same config → (existing, False)."""
        roles = tuple(keys.check_role(r) for r in roles)
        jid = keys.check_id("job id", job_id) if job_id else f"job-{uuid.uuid4().hex[:12]}"
        now = time.time()
        config_json = json.dumps(config, sort_keys=True)
        fields = {
            "job_id": jid,
            "status": "queued",
            "config": config_json,
            "created_at": now,
            "updated_at": now,
            "reason": "",
            "cancel_requested": 0,
            "dispatched": 0,
            "roles": json.dumps(roles),
        }
        flat = [str(x) for kv in fields.items() for x in kv]
        created = bool(self._create(keys=[keys.job(jid)], args=flat))
        record = self.get(jid)
        if not created and json.dumps(record.config, sort_keys=True) != config_json:
            raise JobConflictError(f"job id {jid!r} already exists with another config; pick a new id")
        self._dispatch(jid, record.created_at, roles)
        return record, created

    def _dispatch(self, job_id: str, created_at: float, roles: tuple[keys.Role, ...]) -> None:
        """Index and dispatch once, in one stream entry for every role. Concurrent creates of one id
        dispatch once (the one holding the lock does it); a create retried after a crash finishes
        what was left undone once the crashed call's lock has expired."""
        if self.r.hget(keys.job(job_id), "dispatched") == b"1":
            return
        if not self.r.set(keys.dispatch_lock(job_id), "1", nx=True, px=DISPATCH_LOCK_MS):
            return  # another create of this id is dispatching it
        try:
            if self.r.hget(keys.job(job_id), "dispatched") == b"1":
                return
            self.r.zadd(keys.jobs_index(), {job_id: created_at})
            msg = JobDispatch(job_id=job_id, roles=list(roles))
            self.r.xadd(keys.dispatch(), {"data": encode(msg)}, maxlen=DISPATCH_MAXLEN, approximate=True)
            self.r.hset(keys.job(job_id), "dispatched", 1)
        finally:
            self.r.delete(keys.dispatch_lock(job_id))

    def get(self, job_id: str) -> JobRecord:
        raw = self.r.hgetall(keys.job(job_id))
        if not raw:
            raise JobNotFoundError(job_id)
        h = {as_str(k): as_str(v) for k, v in raw.items()}
        return JobRecord(
            job_id=h["job_id"],
            status=h["status"],
            config=json.loads(h["config"]),
            created_at=float(h["created_at"]),
            updated_at=float(h["updated_at"]),
            reason=h.get("reason", ""),
            cancel_requested=h.get("cancel_requested") == "1",
            roles=json.loads(h.get("roles", "[]")),
        )

    def list(self, *, offset: int = 0, limit: int = 50) -> tuple[list[JobRecord], int]:
        """Newest first; returns (page, total)."""
        if not 0 <= offset <= 1_000_000_000 or not 1 <= limit <= 1000:
            raise ValueError(
                f"offset must be in 0..1e9 and limit in 1..1000, got offset={offset} limit={limit}"
            )
        total = int(self.r.zcard(keys.jobs_index()))
        ids = self.r.zrevrange(keys.jobs_index(), offset, offset + limit - 1)
        out = []
        for raw_id in ids:
            try:
                out.append(self.get(as_str(raw_id)))
            except JobNotFoundError:
                self.r.zrem(keys.jobs_index(), cast(bytes, raw_id))  # expired behind the index
                continue
        return out, total

    def transition(self, job_id: str, to: JobStatus, reason: str = "") -> JobRecord:
        """Move a job to `to` atomically. Raises JobNotFoundError or JobConflictError (illegal move).
        A job that finished keeps its keys `retention_s` (`expire`)."""
        allowed_from = " ".join(s for s, nxt in ALLOWED.items() if to in nxt)
        code, cur = self._transition(keys=[keys.job(job_id)], args=[to, reason, time.time(), allowed_from])
        if code == -1:
            raise JobNotFoundError(job_id)
        if code == -2:
            raise JobConflictError(f"job {job_id!r} is {as_str(cur)}; it cannot move to {to}")
        if to in TERMINAL:
            self.expire(job_id, self.retention_s)
        return self.get(job_id)

    def _job_keys(self, job_id: str) -> tuple[bytes, ...]:
        return tuple(cast(Iterator[bytes], self.r.scan_iter(match=keys.job_keys(job_id), count=1000)))

    def expire(self, job_id: str, ttl_s: float) -> int:
        """Every key of the job expires within `ttl_s` (a key that expires sooner keeps its TTL: a
        step's episodes); returns how many keys it set."""
        found = self._job_keys(job_id)
        pipe = self.r.pipeline(transaction=False)
        for k in found:
            pipe.ttl(k)
        ttls = pipe.execute()
        pipe = self.r.pipeline(transaction=False)
        todo = [k for k, t in zip(found, ttls, strict=True) if t == -1 or t > ttl_s]
        for k in todo:
            pipe.expire(k, int(ttl_s))
        pipe.execute()
        return len(todo)

    def _keep(self, job_id: str) -> None:
        """A job running again keeps its record and history (PERSIST; per-step keys keep their TTLs)."""
        pipe = self.r.pipeline(transaction=False)
        for k in self._job_keys(job_id):
            if ":episodes:" not in as_str(k):
                pipe.persist(k)
        pipe.execute()

    def resume(self, job_id: str) -> JobRecord:
        """A failed or cancelled job queued again and dispatched to its roles: each trainer resumes
        it from the job's ledger and its own checkpoint, so finished steps are not trained twice."""
        code, cur = self._resume(keys=[keys.job(job_id)], args=[time.time()])
        if code == -1:
            raise JobNotFoundError(job_id)
        if code == -2:
            raise JobConflictError(f"job {job_id!r} is {as_str(cur)}; only a failed or cancelled job resumes")
        self._keep(job_id)
        record = self.get(job_id)
        self._dispatch(job_id, record.created_at, tuple(record.roles))
        return record

    def request_cancel(self, job_id: str) -> JobRecord:
        """Queued → cancelled at once; running → flag the trainers stop on within one step."""
        record = self.get(job_id)
        if record.status == "cancelled":
            return record
        if record.status in ("succeeded", "failed"):
            raise JobConflictError(f"job {job_id!r} already {record.status}; there is nothing to cancel")
        self.r.hset(keys.job(job_id), "cancel_requested", 1)
        if record.status == "queued":
            try:
                return self.transition(job_id, "cancelled", "cancelled before it started")
            except JobConflictError:
                pass  # a trainer started it meanwhile: the flag stops it
        return self.get(job_id)

    def cancel_requested(self, job_id: str) -> bool:
        return self.r.hget(keys.job(job_id), "cancel_requested") == b"1"

    def ended(self, job_id: str) -> bool:
        """Whether the job's cancel was requested or it finished (one small read, for wait loops)."""
        cancel, status = self.r.hmget(keys.job(job_id), ["cancel_requested", "status"])
        return cancel == b"1" or (status is not None and as_str(status) in TERMINAL)


class JobWatch:
    """Watches one job for the trainer running it: `ended` is set within `every_s` of its cancel being
    requested or of another service finishing it (a callee that failed it), so that a call in flight,
    a retry or a long set-up gives up at once instead of at its own timeout. A store that does not
    answer sets nothing (the job's own calls to it fail on their own)."""

    def __init__(self, jobs: JobRegistry, job_id: str, *, every_s: float = 0.2) -> None:
        self.jobs, self.job_id, self.every_s = jobs, job_id, every_s
        self.ended = threading.Event()
        self.reason = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watch-{job_id}", daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                record = self.jobs.get(self.job_id)
            except Exception:
                continue
            if record.cancel_requested or record.status in TERMINAL:
                self.reason = "cancelled" if record.cancel_requested else f"{record.status}: {record.reason}"
                self.ended.set()
                return

    def __enter__(self) -> JobWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
