"""Experiment trackers through the services (issue 40): a short `co_train` job on the real services
with `tracking: [tensorboard, mlflow]` leaves, for every role, every per-step metric the job's
metrics API shows, read back with TensorBoard's event reader and the MLflow client, grouped by the
job; a tracking server the operator did not allow is a 422."""

from __future__ import annotations

import httpx
import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mgrpo.config import JobConfig
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart
from services.launcher import LocalCluster
from shared_store import Store
from shared_store.schemas import MetricsEvent
from tests.services.checks import stream_messages
from tests.services.test_e2e import CACHE, SMALL, TOKEN, H, wait
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(900)]


def written_of(events: list[str]) -> list[str]:
    return [e for e in events if e.startswith("tracking: ")]


def expected(records: list[dict]) -> dict[str, dict[str, set[int]]]:
    """role → metric → the steps the job's metrics API has a finite value of it for."""
    out: dict[str, dict[str, set[int]]] = {}
    for r in records:
        if r["kind"] != "metrics" or r["role"] not in ("planner", "subagent"):
            continue
        for k, v in r["values"].items():
            if v is not None:
                out.setdefault(r["role"], {}).setdefault(k, set()).add(r["step"])
    return out


def test_every_roles_metrics_of_every_step_reach_tensorboard_and_mlflow(tmp_path, redis_url):
    store = Store.connect(redis_url)
    cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    with LocalCluster(
        tmp_path, redis_url=redis_url, api_token=TOKEN, extra_env={"MGRPO_CACHE_DIR": str(CACHE)}
    ) as cluster:
        controller = cluster.url("controller")
        refused = httpx.post(
            f"{controller}/v1/jobs",
            json={**SMALL, "tracking": [{"name": "mlflow", "tracking_uri": "http://10.0.0.1:5000"}]},
            headers=H,
        )
        assert refused.status_code == 422, refused.text
        assert "MGRPO_ALLOWED_TRACKING_URIS" in refused.text and "tracking" in refused.text
        r = httpx.post(
            f"{controller}/v1/jobs", json={**SMALL, "tracking": ["tensorboard", "mlflow"]}, headers=H
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        job = wait(cluster, job_id)
        assert job["status"] == "succeeded", job["reason"]

        def records() -> list[dict]:
            return httpx.get(f"{controller}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]

        def events() -> list[str]:  # the job's events (the SSE stream's, read from Redis)
            return [
                e.message for e in stream_messages(store, job_id, "events", MetricsEvent) if e.kind == "event"
            ]

        def written() -> list[str]:  # each trainer says so once its trackers wrote everything
            return written_of(events())

        wait_for(lambda: len(written()) == 2, "both roles' trackers report their records written", 60)
        said, told = records(), events()
        tracking = cluster.tracking_dir
    assert sorted(m.split("'")[0] for m in written_of(told)) == ["tracking: planner", "tracking: subagent"]
    want = expected(said)
    assert sorted(want) == ["planner", "subagent"] and all(len(m) > 5 for m in want.values())
    for e in written_of(told):
        assert f"of {SMALL['steps']} steps in tensorboard" in e and "; mlflow sqlite:///" in e, e
    assert not [e for e in told if e.startswith("tracker ")], told  # no tracker failed

    client = MlflowClient(tracking_uri=f"sqlite:///{tracking / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mgrpo").experiment_id
    runs = {r.data.tags["role"]: r for r in client.search_runs([exp], f"tags.job_id = '{job_id}'")}
    assert sorted(runs) == sorted(want), f"mlflow runs of job {job_id}: {sorted(runs)}"
    for role, metrics in want.items():
        acc = EventAccumulator(str(tracking / "tensorboard" / job_id / role))
        acc.Reload()
        board = {tag: {e.step for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
        run = runs[role].info.run_id
        for key, steps in metrics.items():
            assert board.get(key) == steps, (role, key, board.get(key), steps)
            assert {m.step for m in client.get_metric_history(run, key)} == steps, (role, key)
        assert runs[role].data.params["steps"] == str(SMALL["steps"])
