"""Experiment trackers and traces through the services (issue 40): a short `co_train` job on the
real services with `tracking: [tensorboard, mlflow, wandb]` leaves, for every role, every per-step
metric the job's metrics API shows, read back with TensorBoard's event reader, the MLflow client and
the W&B offline run's file, grouped by the job; a tracking server the operator did not allow is a
422. With MGRPO_TRACE_DIR set, each rollout is one trace whose spans come from the planner's and the
sub-agent's processes, linked across the HTTP hop by the delegation's `traceparent`."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
from tests.services.checks import spans_of, stream_messages
from tests.services.e2e import CACHE, SMALL, TOKEN, H, wait
from tests.waiting import wait_for
from tests.wandb_files import finished, history, run_info, summary

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.fixture(scope="module")
def tracked_job(tmp_path_factory):
    """One short co_train job with both trackers and traces on: (its run folder, job id, metrics
    records, events)."""
    tmp_path = tmp_path_factory.mktemp("tracked")
    cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    traces = tmp_path / "traces"
    env = {"MGRPO_CACHE_DIR": str(CACHE), "MGRPO_TRACE_DIR": str(traces)}
    # a Redis of its own: the session's shared one may still hold other modules' queued jobs, which
    # these trainers would run too (their spans and records are not this job's)
    with LocalCluster(tmp_path, api_token=TOKEN, extra_env=env) as cluster:
        store = Store.connect(cluster.redis_url)
        controller = cluster.url("controller")
        refused = httpx.post(
            f"{controller}/v1/jobs",
            json={**SMALL, "tracking": [{"name": "mlflow", "tracking_uri": "http://10.0.0.1:5000"}]},
            headers=H,
        )
        assert refused.status_code == 422, refused.text
        assert "MGRPO_ALLOWED_TRACKING_URIS" in refused.text and "tracking" in refused.text
        r = httpx.post(
            f"{controller}/v1/jobs", json={**SMALL, "tracking": ["tensorboard", "mlflow", "wandb"]}, headers=H
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
        wait_for(lambda: traced(traces, job_id)[1], "every delegation's episode span written", 30)
        exported = {  # the metric families the trainers' /metrics export (the dashboard's source)
            line.split()[2]
            for role in ("planner", "subagent")
            for line in httpx.get(f"{cluster.url(role)}/metrics", headers=H).text.splitlines()
            if line.startswith("# TYPE ")
        }
        return tmp_path, job_id, records(), events(), exported


def test_every_roles_metrics_of_every_step_reach_tensorboard_mlflow_and_wandb(tracked_job):
    run_dir, job_id, said, told, _ = tracked_job
    tracking = run_dir / "tracking"
    assert sorted(m.split("'")[0] for m in written_of(told)) == ["tracking: planner", "tracking: subagent"]
    want = expected(said)
    assert sorted(want) == ["planner", "subagent"] and all(len(m) > 5 for m in want.values())
    for e in written_of(told):
        assert f"of {SMALL['steps']} steps in tensorboard" in e and "; mlflow sqlite:///" in e, e
        assert "; wandb " in e and "offline" in e, e
    assert not [e for e in told if e.startswith("tracker ")], told  # no tracker failed

    wait_for(lambda: finished(tracking / "wandb", 2), "W&B's writer wrote both roles' runs to their end", 60)
    wandb_files = finished(tracking / "wandb", 2)
    client = MlflowClient(tracking_uri=f"sqlite:///{tracking / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mgrpo").experiment_id
    runs = {r.data.tags["role"]: r for r in client.search_runs([exp], f"tags.job_id = '{job_id}'")}
    assert sorted(runs) == sorted(want), f"mlflow runs of job {job_id}: {sorted(runs)}"
    for role, metrics in want.items():
        acc = EventAccumulator(str(tracking / "tensorboard" / job_id / role))
        acc.Reload()
        board = {tag: {e.step for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
        run = runs[role].info.run_id
        (wandb_run,) = [f for f in wandb_files if run_info(f).display_name == f"{job_id}/{role}"]
        assert run_info(wandb_run).run_group == job_id
        offline = history(wandb_run)
        for key, steps in metrics.items():
            assert board.get(key) == steps, (role, key, board.get(key), steps)
            assert {m.step for m in client.get_metric_history(run, key)} == steps, (role, key)
            assert set(offline.get(key, {})) == steps, (role, key)
        assert runs[role].data.params["steps"] == str(SMALL["steps"])
        # at the job's end: the role's final checkpoint and its reward curve, in each tracker
        (final,) = sorted((run_dir / "checkpoints" / role / job_id / role).glob("step-*"))[-1:]
        assert runs[role].data.tags["checkpoint"] == str(final) == summary(wandb_run)["checkpoint"]
        assert [a.path for a in client.list_artifacts(run)] == ["reward_curve.png"]
        assert acc.Tags()["images"] == ["reward_curve"] and "reward_curve/format" in offline


def traced(traces: Path, job_id: str) -> tuple[list[dict], bool]:
    """The job's rollout spans, and whether every delegate span has its episode span yet and every
    tool span its parent (a child ends, and may be written, before its parent)."""
    every = spans_of(traces)
    spans = [s for s in every if s["attributes"].get("mgrpo.job_id") == job_id]
    delegates = {s["context"]["span_id"] for s in spans if s["name"] == "delegate"}
    children = {s["parent_id"] for s in spans if s["name"] == "episode"}
    written = {s["context"]["span_id"] for s in every}
    tools_parented = all(s["parent_id"] in written for s in every if s["name"] == "tool")
    return [s for s in spans if s["name"] == "rollout"], bool(
        delegates
    ) and delegates <= children and tools_parented


def test_each_rollout_is_one_trace_across_the_planner_and_the_subagent(tracked_job):
    run_dir, job_id, _, _, _ = tracked_job
    spans = [s for s in spans_of(run_dir / "traces") if s["attributes"].get("mgrpo.job_id") == job_id]
    by_id = {s["context"]["span_id"]: s for s in spans}
    rollouts = [s for s in spans if s["name"] == "rollout"]
    assert len(rollouts) == SMALL["steps"] * SMALL["prompts_per_step"] * SMALL["rollouts_per_query"]
    assert len({r["context"]["trace_id"] for r in rollouts}) == len(rollouts)  # one trace per rollout
    crossed = 0
    for r in rollouts:
        mine = [s for s in spans if s["context"]["trace_id"] == r["context"]["trace_id"]]
        for ep in (s for s in mine if s["name"] == "episode"):
            delegate = by_id[ep["parent_id"]]  # the episode's parent: the root's HTTP call
            assert delegate["name"] == "delegate" and delegate["parent_id"] == r["context"]["span_id"]
            assert (ep["service"], delegate["service"], r["service"]) == (
                "mgrpo-subagent",
                "mgrpo-planner",
                "mgrpo-planner",
            )
            assert ep["attributes"]["mgrpo.query_id"] == r["attributes"]["mgrpo.query_id"]
        crossed += any(s["service"] == "mgrpo-subagent" for s in mine)
    assert crossed >= len(rollouts) // 2, f"only {crossed} of {len(rollouts)} rollouts reached the sub-agent"
    every = {(f"mgrpo-{r}", step) for r in ("planner", "subagent") for step in range(SMALL["steps"])}
    for phase in ("update", "adv", "checkpoint", "exchange_redis"):  # each role's step phases
        got = {(s["service"], s["attributes"]["mgrpo.step"]) for s in spans if s["name"] == f"step/{phase}"}
        assert got == every, phase
    episodes = {s["context"]["span_id"] for s in spans if s["name"] == "episode"}
    traces = {r["context"]["trace_id"] for r in rollouts}
    tools = [
        s for s in spans_of(run_dir / "traces") if s["name"] == "tool" and s["context"]["trace_id"] in traces
    ]
    assert tools and all(t["parent_id"] in episodes for t in tools if t["service"] == "mgrpo-subagent")
    assert {t["attributes"]["mgrpo.tool"] for t in tools} >= {"search"}


def test_the_dashboards_queries_name_only_what_the_services_export(tracked_job):
    """Every metric family a panel of the shipped Grafana dashboard queries is on the trainers' live
    /metrics, and every `name=~"…"` filter matches metrics a job really records: no panel is empty
    by construction."""
    _, _, said, _, exported = tracked_job
    dashboard = json.loads((ROOT / "k8s" / "mgrpo" / "dashboards" / "mgrpo.json").read_text())
    names = {k for r in said if r["kind"] == "metrics" for k in r["values"]}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for family in re.findall(r"\b(mgrpo_[a-z_]+)", expr):
                assert family in exported, (panel["title"], family)
            for pattern in re.findall(r'name=~"([^"]+)"', expr):
                assert any(re.fullmatch(pattern, n) for n in names), (panel["title"], pattern)
