import threading

import pytest

from shared_store import keys
from shared_store.jobs import JobConflictError, JobNotFoundError, JobWatch
from shared_store.schemas import JobDispatch, decode

pytestmark = pytest.mark.redis
ROLES = ("planner", "subagent")


def test_create_is_idempotent_by_id(store, job_id):
    rec, created = store.jobs.create({"steps": 2}, job_id, roles=ROLES)
    again, created_again = store.jobs.create({"steps": 2}, job_id, roles=ROLES)
    assert created and not created_again and again.created_at == rec.created_at
    with pytest.raises(JobConflictError, match="another config"):
        store.jobs.create({"steps": 3}, job_id, roles=ROLES)
    assert store.jobs.get(job_id).config == {"steps": 2}  # nothing overwritten


def dispatched(store, job_id):
    return [
        m
        for _, f in store.client.xrange(keys.dispatch())
        if (m := decode(JobDispatch, f[b"data"])).job_id == job_id
    ]


def test_create_dispatches_once_to_all_roles(store, job_id):
    store.jobs.create({"x": 1}, job_id, roles=ROLES)
    store.jobs.create({"x": 1}, job_id, roles=ROLES)
    assert [m.roles for m in dispatched(store, job_id)] == [list(ROLES)]


def test_concurrent_creates_of_one_id_dispatch_once(store, job_id):
    barrier = threading.Barrier(50)

    def create():
        barrier.wait()
        store.jobs.create({"x": 2}, job_id, roles=("solver", "verifier"))

    threads = [threading.Thread(target=create) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [m.roles for m in dispatched(store, job_id)] == [["solver", "verifier"]]


def test_generated_id_and_listing(store):
    ids = [store.jobs.create({"i": i}, roles=ROLES)[0].job_id for i in range(3)]
    page, total = store.jobs.list(limit=2)
    assert total >= 3 and len(page) == 2
    assert page[0].job_id == ids[-1]  # newest first
    with pytest.raises(ValueError, match="limit"):
        store.jobs.list(limit=0)
    with pytest.raises(ValueError, match="offset"):
        store.jobs.list(offset=2**64)  # Redis would fail on it: found by schemathesis


def test_legal_and_illegal_transitions(store, job_id):
    store.jobs.create({}, job_id, roles=ROLES)
    assert store.jobs.transition(job_id, "running").status == "running"
    assert store.jobs.transition(job_id, "running").status == "running"  # idempotent
    assert store.jobs.transition(job_id, "succeeded").status == "succeeded"
    for late in ("running", "failed", "queued"):
        with pytest.raises(JobConflictError, match="succeeded"):
            store.jobs.transition(job_id, late)
    assert store.jobs.get(job_id).status == "succeeded"
    with pytest.raises(JobNotFoundError):
        store.jobs.transition("no-such-job", "running")


def test_failure_reason_is_kept(store, job_id):
    store.jobs.create({}, job_id, roles=ROLES)
    store.jobs.transition(job_id, "running")
    rec = store.jobs.transition(job_id, "failed", "subagent service did not answer for 60 s")
    assert rec.status == "failed" and "subagent" in rec.reason


def test_cancel(store, job_id):
    store.jobs.create({}, job_id, roles=ROLES)
    assert store.jobs.request_cancel(job_id).status == "cancelled"  # queued: at once
    other = job_id + "-b"
    store.jobs.create({}, other, roles=ROLES)
    store.jobs.transition(other, "running")
    rec = store.jobs.request_cancel(other)
    assert rec.status == "running" and rec.cancel_requested and store.jobs.cancel_requested(other)
    store.jobs.transition(other, "succeeded")
    with pytest.raises(JobConflictError, match="nothing to cancel"):
        store.jobs.request_cancel(other)


def test_concurrent_writers_one_winner(store, job_id):
    store.jobs.create({}, job_id, roles=ROLES)
    store.jobs.transition(job_id, "running")
    outcomes: list[str] = []
    barrier = threading.Barrier(12)

    def writer(target: str) -> None:
        barrier.wait()
        try:
            store.jobs.transition(job_id, target, f"by {target}")
            outcomes.append(target)
        except JobConflictError:
            outcomes.append("refused")

    targets = ["succeeded", "failed", "cancelled"] * 4
    threads = [threading.Thread(target=writer, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = {o for o in outcomes if o != "refused"}
    assert len(winners) == 1  # exactly one terminal state won; the others were refused
    final = store.jobs.get(job_id)
    assert final.status in winners and final.reason == f"by {final.status}"
    assert outcomes.count("refused") == 12 - outcomes.count(final.status)  # same-state writers are no-ops


def test_a_failed_or_cancelled_job_resumes_once_dispatched_again(store, job_id):
    store.jobs.create({"x": 3}, job_id, roles=("solver",))
    store.jobs.transition(job_id, "running")
    with pytest.raises(JobConflictError, match="only a failed or cancelled job resumes"):
        store.jobs.resume(job_id)
    store.jobs.request_cancel(job_id)
    store.jobs.transition(job_id, "failed", "solver trainer: PartnerError: the verifier did not answer")
    again = store.jobs.resume(job_id)
    assert (again.status, again.reason, again.cancel_requested) == ("queued", "", False)
    assert [m.roles for m in dispatched(store, job_id)] == [["solver"], ["solver"]]  # once more
    store.jobs.transition(job_id, "cancelled", "cancelled before it started")
    assert store.jobs.resume(job_id).status == "queued" and len(dispatched(store, job_id)) == 3
    store.jobs.transition(job_id, "running")
    store.jobs.transition(job_id, "succeeded")
    with pytest.raises(JobConflictError, match="succeeded"):
        store.jobs.resume(job_id)
    with pytest.raises(JobNotFoundError):
        store.jobs.resume("no-such-job")


@pytest.mark.parametrize("how", ["cancel", "failed elsewhere"])
def test_a_job_watch_sees_the_jobs_end(store, job_id, how):
    """A trainer's watch on its job: set by a cancel, or by another service failing the job."""
    store.jobs.create({}, job_id, roles=ROLES)
    store.jobs.transition(job_id, "running")
    with JobWatch(store.jobs, job_id, every_s=0.05) as watch:
        assert not watch.ended.wait(0.2)  # a running job: nothing yet
        if how == "cancel":
            store.jobs.request_cancel(job_id)
        else:
            store.jobs.transition(job_id, "failed", "subagent trainer: boom")
        assert watch.ended.wait(5), "the watch never saw the end"
    assert watch.reason == ("cancelled" if how == "cancel" else "failed: subagent trainer: boom")


def test_a_finished_jobs_keys_expire_with_its_retention_and_a_resumed_jobs_stay(redis_url, job_id):
    """Every key of a finished job gets the retention as its TTL (they once stayed forever: ~10 keys,
    45–70 KB a 10-step job); a shorter TTL (a step's episodes) is kept; a resumed job's keys stay."""
    from shared_store import Store
    from shared_store.schemas import MetricsEvent, PolicyVersion
    from shared_store.streams import publish_metrics

    store = Store.connect(redis_url, job_retention_s=3600)
    store.jobs.create({"steps": 1}, job_id, roles=ROLES)
    store.jobs.transition(job_id, "running")
    publish_metrics(store.client, MetricsEvent(job_id=job_id, step=0, role="planner", values={"x": 1.0}))
    store.policies.publish(PolicyVersion(job_id=job_id, role="planner", version=1, step=0, checkpoint="c"))
    store.client.set(keys.step_episodes(job_id, 0), b"e", ex=60)
    every = [k for k in store.client.scan_iter(match=keys.job_keys(job_id))]
    assert len(every) >= 5
    store.jobs.transition(job_id, "failed", "boom")
    ttls = {k: store.client.ttl(k) for k in every}
    assert ttls.pop(keys.step_episodes(job_id, 0).encode()) <= 60  # its own, shorter TTL kept
    assert all(0 < t <= 3600 for t in ttls.values()), ttls
    store.jobs.resume(job_id)
    assert store.client.ttl(keys.job(job_id)) == -1 and store.client.ttl(keys.metrics(job_id)) == -1
