"""Token scopes against real service processes (API-only: nothing trains): admin (jobs), read
(status, metrics), service (trainer to trainer); reads open only when configured; a user's token
cannot write episodes."""

from __future__ import annotations

import httpx
import pytest

from services.launcher import LocalCluster
from tests.services.checks import api_only_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(300)]
ADMIN, READ, SERVICE = "admin-token", "read-token", "service-token"
JOB = {"steps": 1, "prompts_per_step": 1, "rollouts_per_query": 2}


def bearer(token):
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture(scope="module")
def cluster(redis_url, tmp_path_factory):
    with api_only_cluster(
        tmp_path_factory.mktemp("scopes"),
        redis_url,
        ADMIN,
        MGRPO_READ_TOKEN=READ,
        MGRPO_SERVICE_TOKEN=SERVICE,
    ) as c:
        yield c


@pytest.mark.parametrize(
    ("token", "reads", "writes"),
    [(None, 401, 401), ("wrong", 401, 401), (READ, 200, 403), (SERVICE, 200, 403), (ADMIN, 200, 201)],
    ids=["none", "wrong", "read", "service", "admin"],
)
def test_each_token_reaches_its_scope(cluster, token, reads, writes):
    url = cluster.url("controller")
    for path in ("/v1/jobs", "/v1/datasets", "/metrics"):
        assert httpx.get(url + path, headers=bearer(token), timeout=10).status_code == reads, path
    assert (
        httpx.get(f"{cluster.url('planner')}/v1/policy", headers=bearer(token), timeout=10).status_code
        == reads
    )
    r = httpx.post(f"{url}/v1/jobs", json=JOB, headers=bearer(token), timeout=30)
    assert r.status_code == writes, r.text
    if writes == 403:
        assert "lacks the admin scope" in r.json()["detail"]
    for path in ("/healthz", "/readyz"):  # probes stay open
        assert httpx.get(url + path, timeout=10).status_code == 200


def test_a_users_token_cannot_write_episodes(cluster):
    body = {"job_id": "j", "step": 0, "query_id": "q0", "rollout": 0, "call": 0, "subtask": "birth city of X"}
    url = f"{cluster.url('subagent')}/v1/episodes"
    for token in (ADMIN, READ):
        r = httpx.post(url, json=body, headers=bearer(token), timeout=10)
        assert r.status_code == 403 and "service" in r.json()["detail"], r.text
    assert httpx.post(url, json=body, timeout=10).status_code == 401
    # the service token passes the scope; with no job running the service asks to retry (503)
    assert httpx.post(url, json=body, headers=bearer(SERVICE), timeout=10).status_code == 503


def test_reads_can_be_opened_for_local_use(redis_url, tmp_path):
    with LocalCluster(
        tmp_path,
        redis_url=redis_url,
        api_token=ADMIN,
        roles=(),
        extra_env={"MGRPO_RUN_WORKER": "false", "MGRPO_OPEN_READS": "true"},
    ) as c:
        url = c.url("controller")
        assert httpx.get(f"{url}/v1/jobs", timeout=10).status_code == 200
        assert httpx.post(f"{url}/v1/jobs", json=JOB, timeout=10).status_code == 401
