"""Where an agent-program run's chat calls join its trace (issue 40).

    keys.session_trace(job, session)   STRING  the run's `traceparent`; set by the root, 1 h

The user's agent program calls each role's OpenAI-compatible endpoint with its own HTTP client, which
sends no trace context. The root trainer therefore stores its run's `rollout` span context under the
run's session when tracing is on, and a service serving a session's call without a `traceparent`
header reads it there, so its `chat` span is a child of the run's rollout span in the same trace."""

from __future__ import annotations

from typing import cast

import redis

from shared_store import keys

TRACE_TTL_S = 3600  # a run's calls come within its step; a crashed root leaves nothing for long


class SessionTraces:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def put(self, job_id: str, session: str, traceparent: str) -> None:
        self.r.set(keys.session_trace(job_id, session), traceparent, ex=TRACE_TTL_S)

    def get(self, job_id: str, session: str) -> str | None:
        raw = cast(bytes | None, self.r.get(keys.session_trace(job_id, session)))
        return None if raw is None else raw.decode()
