"""SIGTERM (`docker stop`, a Kubernetes rollout) stops a service within 2 s, even with a client
holding a server-sent-events stream open (uvicorn waits for in-flight responses unless told how
long: `MGRPO_SHUTDOWN_GRACE_S`). Real processes, real Redis."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from services.launcher import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(300)]
TOKEN = "stop-token"
H = {"Authorization": f"Bearer {TOKEN}"}


def test_sigterm_stops_each_service_within_2_s_with_a_stream_open(redis_url, tmp_path):
    with LocalCluster(
        tmp_path,
        redis_url=redis_url,
        api_token=TOKEN,
        roles=("planner",),
        extra_env={"MGRPO_RUN_WORKER": "false"},
    ) as cluster:
        url = cluster.url("controller")
        job_id = httpx.post(f"{url}/v1/jobs", json={"steps": 1}, headers=H, timeout=30).json()["job_id"]
        opened = threading.Event()

        def follow() -> None:  # the job stays queued (no workers): its stream never ends by itself
            try:
                with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", headers=H, timeout=60) as r:
                    opened.set()
                    for _ in r.iter_lines():
                        pass
            except httpx.HTTPError:
                pass

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert opened.wait(30)
        time.sleep(0.5)
        assert cluster.terminate("controller") < 2.0
        assert cluster.terminate("planner") < 2.0
        reader.join(10)
