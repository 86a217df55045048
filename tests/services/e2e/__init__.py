"""What the end-to-end modules share: a local cluster of the three services as OS processes on the
session's real Redis (with the example workflow plugin on its import path), the default warm start
(the one `tests/mgrpo/test_warmstart.py` checks, shared through the repository's `.cache/mgrpo`, so the
models already act and rewards vary), a small job and the REST calls that submit and wait for it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from mgrpo.config import JobConfig
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_warmstart import WarmstartResult, cached_warmstart
from services.launcher import LocalCluster
from tests.plugin_path import plugin_dist

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "mgrpo"
TOKEN = "test-token"
H = {"Authorization": f"Bearer {TOKEN}"}
SMALL: dict[str, Any] = {
    "steps": 2,
    "prompts_per_step": 2,
    "rollouts_per_query": 4,
    "subagent_slots_per_rollout": 3,
    "partner_timeout_s": 120,
    "roles": {"planner": {"optim": {"lr": 1e-3}}, "subagent": {"optim": {"lr": 1e-3}}},
}


def default_warm_start() -> WarmstartResult:
    return cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)


@contextmanager
def e2e_cluster(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The controller and both trainers, the example plugin discoverable as if pip-installed."""
    paths = [
        *plugin_dist(tmp_path_factory.mktemp("plugin")),
        ROOT,
        *filter(None, [os.environ.get("PYTHONPATH")]),
    ]
    c = LocalCluster(
        tmp_path_factory.mktemp("cluster"),
        redis_url=redis_url,
        api_token=TOKEN,
        extra_env={"MGRPO_CACHE_DIR": str(CACHE), "PYTHONPATH": os.pathsep.join(map(str, paths))},
    )
    with c:
        yield c


def submit(cluster: LocalCluster, config: dict[str, Any], **params: Any) -> str:
    r = httpx.post(f"{cluster.url('controller')}/v1/jobs", json=config, headers=H, params=params, timeout=30)
    assert r.status_code == 201, r.text
    return str(r.json()["job_id"])


def wait(
    cluster: LocalCluster,
    job_id: str,
    timeout_s: float = 600,
    until: tuple[str, ...] = ("succeeded", "failed", "cancelled"),
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}", headers=H, timeout=10).json()
        if job["status"] in until:
            return dict(job)
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {job['status']} after {timeout_s} s: {job}")
