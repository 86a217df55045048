"""`mgrpo local up` keeps its cluster up (`LocalCluster.supervise`): a service or the embedded Redis
killed with SIGKILL comes back (Redis with its append-only data), and one that keeps dying waits a
growing backoff. Real processes."""

from __future__ import annotations

import time

import httpx
import pytest

from services.launcher import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(300)]
H = {"Authorization": "Bearer sup"}


def supervise_until_ready(cluster, timeout_s=60):
    deadline, restarted = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        restarted += cluster.supervise()
        try:
            if httpx.get(f"{cluster.url('controller')}/readyz", timeout=2).status_code == 200:
                return restarted
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not ready after {timeout_s} s (restarted {restarted})")


def test_a_killed_service_and_redis_come_back(tmp_path):
    with LocalCluster(
        tmp_path, api_token="sup", roles=(), extra_env={"MGRPO_RUN_WORKER": "false"}
    ) as cluster:
        url = cluster.url("controller")
        job_id = httpx.post(f"{url}/v1/jobs", json={"steps": 1}, headers=H, timeout=30).json()["job_id"]
        assert cluster.supervise() == []  # nothing died
        cluster.redis.kill()
        cluster.procs["controller"].kill()
        assert sorted(supervise_until_ready(cluster)) == ["controller", "redis"]
        assert httpx.get(f"{url}/v1/jobs/{job_id}", headers=H, timeout=10).json()["status"] == "queued"
        # it died right after its restart: the next one waits a second, then comes
        cluster.procs["controller"].kill()
        cluster.procs["controller"].wait()
        t0 = time.monotonic()
        assert supervise_until_ready(cluster) == ["controller"]
        assert time.monotonic() - t0 >= 1.0
        assert cluster.restarts == {"redis": 1, "controller": 2}
