"""A Redis outage longer than the client's retries (~9 s), with real redis-server processes: a
trainer's job worker waits it out instead of dying (the job it was running fails with the reason
once the store is back, the next job runs), and a real controller answers a fast 503 on /readyz
and a 503 (never a 500) on the API while the store is away."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from mgrpo.config import JobConfig
from services.launcher import LocalCluster
from services.worker import JobWorker
from shared_store import Store
from shared_store.embedded import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]
CONFIG = JobConfig().model_dump(mode="json")


def wait_status(store, job_id, statuses, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while (status := store.jobs.get(job_id).status) not in statuses:
        assert time.monotonic() < deadline, f"{job_id} still {status}"
        time.sleep(0.1)
    return store.jobs.get(job_id)


def test_a_worker_waits_out_an_outage_and_runs_the_next_job(tmp_path):
    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.start()
    store = Store.connect(server.url)
    ran = []

    def run(job_id, _cfg):
        ran.append(job_id)
        while job_id == "during":  # a trainer using the store until it goes away
            store.jobs.get(job_id)
            time.sleep(0.1)
        return True

    worker = JobWorker(store, "planner", "planner-0", run)
    waiting_out = threading.Semaphore(0)  # released each time the worker starts waiting out the store
    pause = worker._pause

    def noted_pause(*args):
        waiting_out.release()
        return pause(*args)

    worker._pause = noted_pause
    worker.start()
    try:
        store.jobs.create(CONFIG, "during", roles=("planner",))
        wait_status(store, "during", ("running",))
        deadline = time.monotonic() + 10  # "running" is written before the trainer starts: wait for it too
        while not ran and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()
        # past the client's retries: the job raised, and the worker, unable to mark it failed, waits
        assert waiting_out.acquire(timeout=60), "the worker never started waiting out the outage"
        assert worker.thread.is_alive()
        server.start()
        failed = wait_status(store, "during", ("failed",))
        assert "the store (Redis) did not answer" in failed.reason, failed.reason
        while waiting_out.acquire(blocking=False):  # the pauses of the first outage
            pass
        server.kill()  # and once more while the worker is idle, blocked reading the dispatch stream
        assert waiting_out.acquire(timeout=60), "the idle worker never noticed the outage"
        assert worker.thread.is_alive()
        server.start()
        store.jobs.create(CONFIG, "after", roles=("planner",))
        assert wait_status(store, "after", ("succeeded", "failed")).status == "succeeded"
        assert ran == ["during", "after"]
    finally:
        worker.stop.set()
        worker.thread.join(15)
        server.stop()


@pytest.mark.e2e
def test_the_api_answers_503_while_the_store_is_away(tmp_path):
    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.start()
    cluster = LocalCluster(
        tmp_path / "api", redis_url=server.url, roles=(), extra_env={"MGRPO_RUN_WORKER": "false"}
    )
    try:
        with cluster:
            url = cluster.url("controller")
            assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
            server.kill()
            t0 = time.monotonic()
            r = httpx.get(f"{url}/readyz", timeout=10)
            assert r.status_code == 503 and time.monotonic() - t0 < 2.5, r.text
            r = httpx.get(f"{url}/v1/jobs/some-job", timeout=60)
            assert r.status_code == 503 and r.headers.get("retry-after") and "Redis" in r.text, r.text
            assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200  # alive, only not ready
            server.start()
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/readyz", timeout=10).status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert httpx.get(f"{url}/v1/jobs/some-job", timeout=30).status_code == 404
    finally:
        server.stop()


@pytest.mark.e2e
def test_a_store_that_does_not_answer_is_a_503_within_seconds(tmp_path):
    """Redis paused (SIGSTOP: its port accepts, nothing answers), as an overloaded or frozen server
    would be: an API call answers 503 within 5 s, not after minutes, and works again once it resumes."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    cluster = LocalCluster(
        tmp_path / "api", redis_url=server.url, roles=(), extra_env={"MGRPO_RUN_WORKER": "false"}
    )
    try:
        with cluster:
            url = cluster.url("controller")
            assert httpx.get(f"{url}/v1/jobs", timeout=10).status_code == 200
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                r = httpx.get(f"{url}/v1/jobs/some-job", timeout=60)
                took = time.monotonic() - t0
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            print(f"a paused Redis: {r.status_code} after {took:.2f} s")
            assert r.status_code == 503 and "Redis" in r.text and took < 5.0, (r.status_code, took, r.text)
            assert httpx.get(f"{url}/v1/jobs/some-job", timeout=30).status_code == 404
    finally:
        server.stop()
