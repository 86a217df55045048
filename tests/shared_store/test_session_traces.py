"""An agent-program run's trace context on a real Redis: what the root stores under a session is what a
serving process reads, per job and session, and it expires."""

from __future__ import annotations

import pytest

from shared_store import Store, keys
from shared_store.session_traces import TRACE_TTL_S

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_sessions_trace_is_read_back_by_another_process_and_expires(redis_url, job_id):
    root, callee = Store.connect(redis_url), Store.connect(redis_url)
    root.session_traces.put(job_id, "3.q1.2", TRACEPARENT)
    assert callee.session_traces.get(job_id, "3.q1.2") == TRACEPARENT
    assert callee.session_traces.get(job_id, "3.q1.1") is None  # another run of the query
    assert callee.session_traces.get(f"{job_id}-other", "3.q1.2") is None  # another job
    assert 0 < root.client.ttl(keys.session_trace(job_id, "3.q1.2")) <= TRACE_TTL_S


def test_a_session_that_is_no_id_is_refused():
    with pytest.raises(ValueError, match="session"):
        keys.session_trace("job-1", "3/../q1")
