"""The trainers' job workers on one real Redis: two roles take jobs submitted at once from the one
dispatch stream and run them in the same order (per-role streams let concurrent submissions reach
the roles in different orders: each ran a different job, waiting on the other's partner)."""

from __future__ import annotations

import threading
import time

import pytest

from mgrpo.config import JobConfig
from services.worker import JobWorker
from shared_store import Store
from shared_store.embedded import RedisServer
from shared_store.schemas import TERMINAL

pytestmark = pytest.mark.redis


@pytest.fixture
def store(tmp_path):
    server = RedisServer(tmp_path / "redis")  # its own: the dispatch stream is global
    server.start()
    try:
        yield Store.connect(server.url)
    finally:
        server.stop()


def test_two_roles_run_concurrent_submissions_in_one_order(store):
    seen: dict[str, list[str]] = {"planner": [], "subagent": []}
    ids = [f"job-{i}" for i in range(30)]
    barrier = threading.Barrier(len(ids) + 1)

    def create(jid, roles=("planner", "subagent")):
        barrier.wait()
        store.jobs.create(JobConfig().model_dump(mode="json"), jid, roles=roles)

    threads = [threading.Thread(target=create, args=(jid,)) for jid in ids]
    threads.append(threading.Thread(target=create, args=("marsrl-job", ("solver", "verifier"))))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    arrived = threading.Condition()

    def run(role, jid, _cfg):
        """A stand-in trainer: like the real ones, each role waits for its partner on the same job
        (here 5 s, then the job fails as a partner timeout would); the root declares success."""
        with arrived:
            seen[role].append(jid)
            arrived.notify_all()
            if not arrived.wait_for(lambda: all(jid in v for v in seen.values()), timeout=5):
                raise TimeoutError(f"{role}: the partner never started {jid}")
        return role == "planner"

    workers = [
        JobWorker(store, role, f"{role}-0", lambda jid, cfg, r=role: run(r, jid, cfg)) for role in seen
    ]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 60
        while not all(store.jobs.get(j).status in TERMINAL for j in ids):
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
    finally:
        for w in workers:
            w.stop.set()
            w.thread.join(5)
    assert seen["planner"] == seen["subagent"] and sorted(seen["planner"]) == sorted(ids)
    assert [store.jobs.get(j).reason for j in ids if store.jobs.get(j).status != "succeeded"] == []
    assert store.jobs.get("marsrl-job").status == "queued"  # neither role runs a job not theirs


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnhandledThreadExceptionWarning"
)  # the thread dies on purpose
def test_liveness_fails_once_the_worker_thread_died(store):
    """A worker whose thread ended (here: an error no handler catches) makes /healthz and /readyz
    a 503 naming it, so the orchestrator restarts the service."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from services.common import install_common

    def run(_jid, _cfg):
        raise SystemExit("boom")  # not an Exception: it ends the thread

    app = FastAPI()
    install_common(app, "planner")
    app.state.store, app.state.worker = store, JobWorker(store, "planner", "planner-0", run)
    client = TestClient(app)
    assert client.get("/healthz").status_code == 200 and not app.state.worker.died  # not started yet
    app.state.worker.start()
    store.jobs.create(JobConfig().model_dump(mode="json"), "dies", roles=("planner",))
    app.state.worker.thread.join(30)
    assert app.state.worker.died
    for path in ("/healthz", "/readyz"):
        r = client.get(path)
        assert r.status_code == 503 and "planner job worker stopped" in r.text, (path, r.text)


LOSE_A_RANK = """
import sys
from mgrpo.config import JobConfig
from mgrpo.parallel.ranks import RankLost
from services.worker import JobWorker
from shared_store import Store

store = Store.connect(sys.argv[1])
store.jobs.create(JobConfig().model_dump(mode="json"), "job-w", roles=("planner", "subagent"))

def run(job_id, cfg):
    raise RankLost("a rank of this role's group of 2 is gone (test)")

JobWorker(store, "subagent", "subagent-0", run)._loop()
"""


def test_a_trainer_that_loses_a_rank_exits_and_leaves_the_job_to_resume(store, tmp_path):
    """Not failed: the process exits (EX_TEMPFAIL) with the dispatch entry still pending, so the
    restarted group takes the job up again."""
    import subprocess
    import sys

    url = store.client.connection_pool.connection_kwargs
    proc = subprocess.run(
        [sys.executable, "-c", LOSE_A_RANK, f"redis://{url['host']}:{url['port']}/0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "lost a rank" in proc.stderr
    assert store.jobs.get("job-w").status == "running"  # not failed
    assert JobWorker(store, "subagent", "subagent-0", lambda *_: True).consumer.read(count=1, block_ms=100)


def test_a_job_that_stops_on_its_cancel_is_cancelled_not_failed(store):
    """A trainer that gives up on set-up because the job was cancelled (a warm-start build) raises what
    it raises; the worker marks the job cancelled, as the user asked."""
    store.jobs.create(JobConfig().model_dump(mode="json"), "stops", roles=("planner",))

    def run(job_id, _cfg):
        store.jobs.request_cancel(job_id)
        raise RuntimeError("the warm-start build stopped at step 3: its job ended")

    worker = JobWorker(store, "planner", "planner-0", run)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while store.jobs.get("stops").status not in TERMINAL:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        worker.stop.set()
        worker.thread.join(5)
    assert store.jobs.get("stops").status == "cancelled"
