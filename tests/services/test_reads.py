"""One bad metric never breaks the job API, against a real controller process and a real Redis: a
trainer that records a non-finite value (NaN, ±Infinity: e.g. the std of a role's advantages in a step
where it had no samples), or a record written as null by an older version, leaves every read endpoint,
the SSE stream and a cancel answering 200 with the value as null."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from services.launcher import LocalCluster
from shared_store import Store, keys
from shared_store.schemas import MetricsEvent
from shared_store.streams import publish_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(300)]
TOKEN = "reads-token"
H = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A controller on a Redis of its own (the jobs queued here must reach no other test's trainers)."""
    with LocalCluster(tmp_path_factory.mktemp("reads"), api_token=TOKEN, roles=()) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def controller(cluster):
    return cluster.url("controller")


def test_a_non_finite_metric_leaves_every_read_working(controller, cluster):
    store = Store.connect(cluster.redis_url)
    r = httpx.post(f"{controller}/v1/jobs", json={"steps": 2}, headers=H, timeout=30)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    values = {
        "planner/adv_std": math.nan,
        "planner/up": math.inf,
        "planner/down": -math.inf,
        "planner/ok": 0.5,
    }
    publish_metrics(store.client, MetricsEvent(job_id=job_id, step=0, role="planner", values=values))
    old = {"job_id": job_id, "step": 1, "role": "subagent", "values": {"subagent/adv_std": None}}
    publish_metrics(store.client, MetricsEvent.model_validate(old))  # as an older writer stored it
    raw = store.client.hget(keys.metrics(job_id), "planner")
    assert b"NaN" not in raw and b"Infinity" not in raw  # stored as JSON every reader parses

    with httpx.Client(base_url=controller, headers=H, timeout=30) as http:
        listed = http.get("/v1/jobs")
        assert listed.status_code == 200, listed.text
        job = http.get(f"/v1/jobs/{job_id}")
        assert job.status_code == 200, job.text
        latest = job.json()["latest_metrics"]
        assert latest["planner"] == {
            "planner/adv_std": None,
            "planner/up": None,
            "planner/down": None,
            "planner/ok": 0.5,
        }
        assert latest["subagent"] == {"subagent/adv_std": None}
        metrics = http.get(f"/v1/jobs/{job_id}/metrics")
        assert metrics.status_code == 200 and len(metrics.json()["records"]) == 2, metrics.text
        with http.stream("GET", f"/v1/jobs/{job_id}/events") as events:
            assert events.status_code == 200
            data = [json.loads(line[6:]) for line in _lines(events, 3)]  # and the warning: no trainers here
        assert [d["values"] for d in data if d["kind"] == "metrics"] == [
            latest["planner"],
            latest["subagent"],
        ]
        cancel = http.post(f"/v1/jobs/{job_id}/cancel")
        assert cancel.status_code == 200 and cancel.json()["cancel_requested"], cancel.text
        assert http.get(f"/v1/jobs/{job_id}").json()["cancel_requested"]


def _lines(response: httpx.Response, n: int) -> list[str]:
    """The first `n` `data:` lines of a server-sent event stream."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            out.append(line)
            if len(out) == n:
                return out
    raise AssertionError(f"the stream ended after {len(out)} events")


def test_the_checkpoint_list_shows_what_the_trainers_kept(controller, cluster):
    """A trainer keeps its newest two checkpoints and every N-th (`checkpoint_keep_every_steps`) and
    deletes the rest: the list shows those, not every checkpoint ever recorded (80 of which 76 were
    gone, once)."""
    from shared_store.schemas import PolicyVersion

    store = Store.connect(cluster.redis_url)
    r = httpx.post(
        f"{controller}/v1/jobs", json={"steps": 10, "checkpoint_keep_every_steps": 4}, headers=H, timeout=30
    )
    job_id = r.json()["job_id"]
    for role in ("planner", "subagent"):
        for step in range(10):
            ckpt = f"{job_id}/{role}/step-{step:06d}"
            store.policies.publish(
                PolicyVersion(job_id=job_id, role=role, version=step + 1, step=step, checkpoint=ckpt)
            )
    listed = httpx.get(f"{controller}/v1/jobs/{job_id}/checkpoints", headers=H, timeout=30).json()[
        "checkpoints"
    ]
    assert sorted((c["role"], c["step"]) for c in listed) == sorted(
        (r, s) for r in ("planner", "subagent") for s in (3, 7, 8, 9)
    )


def test_a_job_whose_roles_no_trainer_serves_fails_naming_them(tmp_path):
    """A marsrl job on a cluster with no marsrl trainers once stayed queued forever with no reason:
    it is warned about at once and fails with its missing roles named after MGRPO_QUEUE_TIMEOUT_S,
    while a job whose trainers are up (their heartbeats) waits in the queue as before."""
    import threading
    import time

    env = {"MGRPO_QUEUE_TIMEOUT_S": "2"}
    with LocalCluster(tmp_path, api_token=TOKEN, roles=(), extra_env=env) as cluster:  # a Redis of its own
        store = Store.connect(cluster.redis_url)
        url, stop = cluster.url("controller"), threading.Event()

        def trainers_up():  # planner and sub-agent services beat, as their job workers do
            while not stop.is_set():
                for role in ("planner", "subagent"):
                    store.presence.beat(role, f"{role}-test")
                stop.wait(1.0)

        beating = threading.Thread(target=trainers_up)
        beating.start()
        try:
            served = httpx.post(f"{url}/v1/jobs", json={"steps": 2}, headers=H, timeout=30).json()["job_id"]
            mars = httpx.post(
                f"{url}/v1/jobs", json={"workflow": "marsrl", "steps": 2}, headers=H, timeout=30
            )
            job_id = mars.json()["job_id"]
            events = store.client.xrange(keys.stream(job_id, "events"))
            assert any(
                b"no trainer serves role(s) solver, verifier, corrector yet" in f[b"data"] for _, f in events
            )
            deadline = time.monotonic() + 30
            while (job := httpx.get(f"{url}/v1/jobs/{job_id}", headers=H, timeout=10).json())[
                "status"
            ] == "queued":
                assert time.monotonic() < deadline, "the unserved job never failed"
                time.sleep(0.2)
            assert (
                job["status"] == "failed"
                and "no trainer serves role(s) solver, verifier, corrector" in job["reason"]
            )
            assert httpx.get(f"{url}/v1/jobs/{served}", headers=H, timeout=10).json()["status"] == "queued"
        finally:
            stop.set()
            beating.join()
