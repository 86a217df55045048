"""End to end when things go wrong: refused requests and forged episodes, concurrent submissions,
cancels, a partner that is down, `kill -9` of each trainer and the resume that trains every step once
(the cluster and helpers: `tests/services/e2e/`)."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mgrpo.workflows import DEEP_RESEARCH
from shared_store import keys
from shared_store.capabilities import call_scope
from shared_store.keys import episode_id
from shared_store.schemas import JobDispatch, PlannerStepStats, decode
from shared_store.streams import get_step
from tests.services.checks import assert_accounted, wait_ledger
from tests.services.e2e import SMALL, H, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(1800)]


def test_auth_validation_and_missing_jobs(cluster, store):
    url = cluster.url("controller")
    assert httpx.post(f"{url}/v1/jobs", json=SMALL).status_code == 401
    assert (
        httpx.post(f"{url}/v1/jobs", json=SMALL, headers={"Authorization": "Bearer wrong"}).status_code == 401
    )
    before = store.jobs.list(limit=1)[1]
    r = httpx.post(f"{url}/v1/jobs", json={**SMALL, "roles": {"planner": {"optim": {"lr": -1}}}}, headers=H)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == [
        "body",
        "roles",
        "planner",
        "optim",
        "lr",
    ]
    r = httpx.post(f"{url}/v1/jobs", json={**SMALL, "roles": {"judge": {}}}, headers=H)
    assert r.status_code == 422 and "roles.judge" in r.text and "planner, subagent" in r.text
    r = httpx.post(f"{url}/v1/jobs", json={**SMALL, "nonsense": 1}, headers=H)
    assert r.status_code == 422 and "nonsense" in r.text
    assert store.jobs.list(limit=1)[1] == before  # nothing written
    assert httpx.get(f"{url}/v1/jobs/no-such-job", headers=H).status_code == 404
    assert (
        httpx.get(f"{url}/v1/jobs", headers=H, params={"offset": 2**70}).status_code == 422
    )  # was a 500 (schemathesis)
    assert httpx.post(f"{url}/v1/jobs/no-such-job/cancel", headers=H).status_code == 404
    assert httpx.post(f"{cluster.url('subagent')}/v1/episodes", json={}).status_code == 401


def test_episode_injection_is_refused_and_writes_nothing(cluster, store):
    """During a running job: a user's token, or the service token with the capability of another
    rollout, call or subtask (or none), is refused before anything runs or is recorded; the job trains
    on as before."""
    job_id = submit(cluster, {**SMALL, "steps": 3})
    url, deadline = cluster.url("subagent"), time.monotonic() + 300
    while httpx.get(f"{url}/v1/policy", headers=H, timeout=10).json()["job_id"] != job_id:
        assert time.monotonic() < deadline, "the sub-agent never took the job"
        time.sleep(0.2)
    body = {
        "job_id": job_id,
        "step": 2,
        "query_id": "forged",
        "rollout": 0,
        "call": 0,
        "subtask": "birth city of X",
    }
    service = {"Authorization": f"Bearer {cluster.service_token}"}
    sign = store.capabilities.sign
    own = call_scope(0, "birth city of X")
    attempts = [
        (H, sign(job_id, 2, "forged", 0, own)),  # a user's token, even with the call's capability
        (service, sign(job_id, 2, "forged", 1, own)),  # another rollout's capability
        (service, sign(job_id, 2, "forged", 0, call_scope(1, "birth city of X"))),  # another call's
        (service, sign(job_id, 2, "forged", 0, call_scope(0, "a subtask of my own"))),  # another subtask's
        (service, sign(job_id, 2, "forged", 0)),  # the rollout's, as it was before calls had scopes
        (service, ""),
    ]
    for headers, capability in attempts:
        r = httpx.post(
            f"{url}/v1/episodes", json={**body, "capability": capability}, headers=headers, timeout=30
        )
        assert r.status_code == 403, r.text
    assert store.episodes.get_one(job_id, 2, episode_id(2, "forged", 0, 0)) is None
    assert wait(cluster, job_id)["status"] == "succeeded"


def test_concurrent_submissions_all_succeed(cluster, store):
    """Six distinct jobs submitted at once: both trainers take them in one order (one dispatch
    stream), so none waits on a partner running another job (with a dispatch per role, two
    interleaved submissions could reach the planner and the sub-agent in different orders)."""
    configs = [
        {**SMALL, "steps": 1, "prompts_per_step": 1, "rollouts_per_query": 2, "run_seed": i} for i in range(6)
    ]
    with ThreadPoolExecutor(len(configs)) as pool:
        ids = list(pool.map(lambda c: submit(cluster, c), configs))
    same, same_id = {**configs[0], "run_seed": 99}, f"same-{uuid.uuid4().hex[:8]}"  # 50 submissions of one id
    with ThreadPoolExecutor(50) as pool:
        assert set(pool.map(lambda _: submit(cluster, same, job_id=same_id), range(50))) == {same_id}
    jobs = [wait(cluster, job_id, timeout_s=300) for job_id in [*ids, same_id]]
    assert [(j["status"], j["reason"]) for j in jobs] == [("succeeded", "")] * (len(ids) + 1)
    dispatched = [decode(JobDispatch, f[b"data"]).job_id for _, f in store.client.xrange(keys.dispatch())]
    assert dispatched.count(same_id) == 1  # one job, one dispatch


def test_cancel_stops_within_a_step(cluster, store):
    job_id = submit(cluster, {**SMALL, "steps": 50})
    deadline = time.monotonic() + 300
    while store.ledger.last_step(job_id, "planner") < 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    prom = httpx.get(
        f"{cluster.url('planner')}/metrics", headers=H
    ).text  # the running job's training metrics as gauges
    assert f'mgrpo_train{{job_id="{job_id}",name="planner/reward_mean"}}' in prom
    r = httpx.post(f"{cluster.url('controller')}/v1/jobs/{job_id}/cancel", headers=H)
    assert r.status_code == 200 and r.json()["cancel_requested"]
    job = wait(cluster, job_id, timeout_s=120)
    assert job["status"] == "cancelled"
    assert max(job["steps_done"].values()) <= store.ledger.last_step(job_id, "planner") <= 2
    assert httpx.post(f"{cluster.url('controller')}/v1/jobs/{job_id}/cancel", headers=H).status_code == 200


def test_partner_down_fails_the_job_with_a_reason_and_it_resumes(cluster, store):
    """The job fails naming the partner; once the partner is back, POST /v1/jobs/{id}/resume runs
    it to the end, each step trained once."""
    cluster.kill("subagent")
    try:
        job_id = submit(cluster, {**SMALL, "steps": 1, "partner_timeout_s": 3})
        job = wait(cluster, job_id, timeout_s=120)
        assert job["status"] == "failed" and "subagent" in job["reason"], job  # names the partner
    finally:
        cluster.start_role("subagent")
        cluster.wait_ready(120, ("subagent",))
    r = httpx.post(f"{cluster.url('controller')}/v1/jobs/{job_id}/resume", headers=H, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "queued", r.text
    job = wait(cluster, job_id, timeout_s=300)
    assert job["status"] == "succeeded", job["reason"]
    assert sorted((e.role, e.step) for e in store.ledger.entries(job_id)) == [("planner", 0), ("subagent", 0)]
    again = httpx.post(f"{cluster.url('controller')}/v1/jobs/{job_id}/resume", headers=H, timeout=30)
    assert again.status_code == 409 and "only a failed or cancelled job resumes" in again.text


def test_kill_9_each_trainer_and_resume_exactly_once(cluster, store):
    """Pipelined (max_staleness 1): a killed trainer resumes after its last ledger step; a step the
    planner had published but not trained is trained as it was (the sub-agent already holds its
    statistics), not rolled again; every step is trained once, nothing is lost."""
    job_id = submit(cluster, {**SMALL, "steps": 5, "max_staleness": 1})
    wait_ledger(store, job_id, "subagent", 0)
    cluster.kill("subagent")  # SIGKILL mid-job: the planner's delegations fail until it is back
    cluster.start_role("subagent")
    cluster.wait_ready(120, ("subagent",))
    wait_ledger(store, job_id, "planner", 2)
    deadline = time.monotonic() + 300  # step 3 published (its rollout ran ahead of the update)
    while get_step(store.client, PlannerStepStats, job_id, "planner_stats", 3) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cluster.kill("planner")
    trained = store.ledger.last_step(job_id, "planner")  # 2, or 3 if it trained step 3 in the meantime
    published = {
        s
        for s in range(trained + 1, 5)
        if get_step(store.client, PlannerStepStats, job_id, "planner_stats", s)
    }
    cluster.start_role("planner")
    cluster.wait_ready(120, ("planner",))
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", job["reason"]
    marks = [(e.role, e.step) for e in store.ledger.entries(job_id)]
    assert sorted(marks) == sorted((r, s) for r in DEEP_RESEARCH.role_names for s in range(5)), (
        marks
    )  # every step exactly once
    assert job["policy_versions"] == {"planner": 5, "subagent": 5}
    assert_accounted(store, job_id, DEEP_RESEARCH.role_names)
    rows = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    reused = {r["step"] for r in rows if r["role"] == "planner" and r["values"].get("planner/step_reused")}
    assert reused == published and (trained == 3 or 3 in reused), (reused, published, trained)
