"""Cancel within seconds, even mid-delegation, with real services: the sub-agent's process is stopped
(SIGSTOP: its kernel still accepts connections, nothing answers), the planner's rollouts wait on
their calls to it, and a cancel ends the job within 2 s (it once waited out each call's 120 s
timeout); the next job starts at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from mgrpo.config import JobConfig
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart
from services.launcher import LocalCluster
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(900)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"
TOKEN = "cancel-token"
H = {"Authorization": f"Bearer {TOKEN}"}
JOB = {"steps": 3, "prompts_per_step": 2, "rollouts_per_query": 4, "partner_timeout_s": 120}


def connections_to(port: int) -> int:
    """Established TCP connections whose local end is `port` (the stopped service's accepted ones)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            for line in Path(table).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                count += state == "01" and int(local.rsplit(":", 1)[1], 16) == port
    return count


def status(url: str, job_id: str) -> str:
    return str(httpx.get(f"{url}/v1/jobs/{job_id}", headers=H, timeout=10).json()["status"])


def test_a_cancel_mid_delegation_to_a_stopped_partner_ends_the_job_within_two_seconds(tmp_path):
    cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    cluster = LocalCluster(tmp_path, api_token=TOKEN, extra_env={"MGRPO_CACHE_DIR": str(CACHE)})
    with cluster:
        url, partner = cluster.url("controller"), cluster.procs["subagent"]
        os.killpg(partner.pid, signal.SIGSTOP)
        try:
            first = httpx.post(f"{url}/v1/jobs", json=JOB, headers=H, timeout=30).json()["job_id"]
            port = cluster.ports["subagent"]
            wait_for(lambda: connections_to(port) > 0, "the planner's calls to the stopped sub-agent")
            assert status(url, first) == "running"
            t0 = time.monotonic()
            assert httpx.post(f"{url}/v1/jobs/{first}/cancel", headers=H, timeout=10).status_code == 200
            wait_for(lambda: status(url, first) == "cancelled", "the cancel", timeout_s=30)
            cancelled_s = time.monotonic() - t0
            second = httpx.post(f"{url}/v1/jobs", json=JOB, headers=H, timeout=30).json()["job_id"]
            wait_for(lambda: status(url, second) == "running", "the next job", timeout_s=30)
            next_s = time.monotonic() - t0
        finally:
            os.killpg(partner.pid, signal.SIGCONT)
        print(
            f"cancel mid-delegation to a stopped partner: cancelled after {cancelled_s:.2f} s, next job running after {next_s:.2f} s"
        )
        assert cancelled_s < 2.0 and next_s < 2.5, (cancelled_s, next_s)
        httpx.post(f"{url}/v1/jobs/{second}/cancel", headers=H, timeout=10)
