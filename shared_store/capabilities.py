"""Delegation capabilities: an episode is written only for a delegation the job's root trainer made.

    keys.delegation_secret(job)   STRING  32 random bytes, hex; SET NX by the root, read by callees

The root signs each call it delegates: `capability = HMAC-SHA256(secret, "<job>/<step>/<query>/
<rollout>/<scope>")`, hex, where the scope of a delegation is its call index and its subtask's hash
(`call_scope`), so a capability opens that one call and no other; an `openai_agents` run's
capability (the agent program's API key) has the empty scope and opens its run's session. A callee
service checks the capability of every `POST /v1/episodes` (and every recorded chat call of a
session) before it runs or records anything. The secret lives only in Redis and in the trainers'
memory: an API token, even the service one, cannot forge a capability.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import cast

import redis

from shared_store import keys

SECRET_TTL_S = 30 * 24 * 3600  # outlives any job it signs (a resumed job gets the same secret back)


class CapabilityError(PermissionError):
    """A delegation without a valid capability: refused, nothing written."""


def capability(secret: bytes, job_id: str, step: int, query_id: str, rollout: int, scope: str = "") -> str:
    msg = f"{job_id}/{int(step)}/{query_id}/{int(rollout)}/{scope}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def call_scope(call: int, subtask: str) -> str:
    """The scope of one delegated call: its index in the rollout and its subtask (hashed)."""
    return f"call={int(call)}/{hashlib.sha256(subtask.encode()).hexdigest()[:32]}"


class Capabilities:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._secrets: dict[str, bytes] = {}  # job → secret, once read (it never changes)

    def issue_secret(self, job_id: str) -> bytes:
        """The job's secret, created on first call (the root trainer's, at job start)."""
        key = keys.delegation_secret(job_id)
        self.r.set(key, secrets.token_hex(32), nx=True, ex=SECRET_TTL_S)
        return self._read(job_id)

    def _read(self, job_id: str) -> bytes:
        if job_id not in self._secrets:
            raw = cast(bytes | None, self.r.get(keys.delegation_secret(job_id)))
            if raw is None:
                raise CapabilityError(
                    f"job {job_id} has no delegation secret yet: its root trainer has not started it"
                )
            self._secrets[job_id] = bytes.fromhex(raw.decode())
        return self._secrets[job_id]

    def sign(self, job_id: str, step: int, query_id: str, rollout: int, scope: str = "") -> str:
        return capability(self._read(job_id), job_id, step, query_id, rollout, scope)

    def check(
        self, token: str | None, job_id: str, step: int, query_id: str, rollout: int, scope: str = ""
    ) -> None:
        """Raise CapabilityError unless `token` is the capability of this rollout and scope."""
        expected = self.sign(job_id, step, query_id, rollout, scope)
        if not token or not hmac.compare_digest(token, expected):
            raise CapabilityError(
                f"no valid capability for job {job_id}, step {step}, query {query_id}, rollout {rollout}"
                f"{', ' + scope.split('/')[0] if scope else ''}: episodes are written only for the calls "
                "the job's root trainer made"
            )
