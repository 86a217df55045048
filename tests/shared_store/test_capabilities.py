"""Delegation capabilities on a real Redis: the root's secret is made once, a capability opens its
own rollout only, and nothing opens a job whose root never started."""

from __future__ import annotations

import pytest

from shared_store import Store, keys
from shared_store.capabilities import Capabilities, CapabilityError, call_scope


@pytest.fixture
def caps(redis_url):
    return Store.connect(redis_url).capabilities


def test_the_secret_is_made_once_and_read_by_every_process(caps, redis_url, job_id):
    first = caps.issue_secret(job_id)
    again = Capabilities(Store.connect(redis_url).client)  # another process: a callee service
    assert again.issue_secret(job_id) == first and len(first) == 32
    assert again.sign(job_id, 3, "q1", 2) == caps.sign(job_id, 3, "q1", 2)
    assert caps.issue_secret(f"{job_id}-other") != first


def test_a_capability_opens_its_own_rollout_only(caps, job_id):
    caps.issue_secret(job_id)
    token = caps.sign(job_id, 3, "q1", 2)
    caps.check(token, job_id, 3, "q1", 2)
    for job, step, query, rollout in [
        (job_id, 4, "q1", 2),
        (job_id, 3, "q2", 2),
        (job_id, 3, "q1", 1),
        (f"{job_id}-other", 3, "q1", 2),
    ]:
        caps.issue_secret(job)
        with pytest.raises(CapabilityError, match="only for the calls"):
            caps.check(token, job, step, query, rollout)
    for bad in ("", None, token[:-1] + ("0" if token[-1] != "0" else "1")):
        with pytest.raises(CapabilityError):
            caps.check(bad, job_id, 3, "q1", 2)


def test_a_delegations_capability_opens_its_own_call_only(caps, job_id):
    """A delegation is signed for its call index and subtask: the same rollout's other calls, another
    subtask, or the rollout's own unscoped capability (a session's) do not open it."""
    caps.issue_secret(job_id)
    own = call_scope(0, "birth city of X")
    token = caps.sign(job_id, 3, "q1", 2, own)
    caps.check(token, job_id, 3, "q1", 2, own)
    for scope in (call_scope(1, "birth city of X"), call_scope(0, "birth city of Y"), ""):
        with pytest.raises(CapabilityError, match="only for the calls"):
            caps.check(token, job_id, 3, "q1", 2, scope)
    with pytest.raises(CapabilityError):
        caps.check(caps.sign(job_id, 3, "q1", 2), job_id, 3, "q1", 2, own)


def test_no_capability_before_the_root_started_the_job(caps, job_id):
    with pytest.raises(CapabilityError, match="has no delegation secret"):
        caps.sign(job_id, 0, "q0", 0)
    assert not caps.r.exists(keys.delegation_secret(job_id))
