"""End to end: the three services as separate OS processes, a real Redis, real HTTP, real training —
the workflows' jobs (co_train, main_only, single_agent, pipelined, a plugin's, rollouts through SGLang
servers). The shared cluster and job helpers: `tests/services/e2e/` (`__init__.py`, `conftest.py`); the user's
own data, rewards, models and tools: `test_yours.py`; refusals, cancels, failures and resumes: `test_faults.py`."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from mgrpo.models import load
from mgrpo.workflows import DEEP_RESEARCH
from services.launcher import LocalCluster
from shared_store.schemas import PlannerStepStats
from shared_store.streams import get_step
from tests.services.checks import assert_accounted, final_checkpoint, params_of, stream_messages
from tests.services.e2e import CACHE, SMALL, TOKEN, H, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(1800)]


def test_co_train_two_steps(cluster, store, warm):
    job_id = submit(
        cluster, {**SMALL, "prompts_per_step": 4, "rollouts_per_query": 8}
    )  # rewards vary within groups
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", job["reason"]
    assert job["steps_done"] == {"planner": 1, "subagent": 1} and job["policy_versions"] == {
        "planner": 2,
        "subagent": 2,
    }

    for role, start in (("planner", warm.planner_path), ("subagent", warm.subagent_path)):
        before, after = params_of(start), params_of(final_checkpoint(cluster, role, job_id))
        unchanged = [n for n, p in after.items() if torch.equal(p, before[n])]
        assert not unchanged, f"{role}: parameters the update never moved: {unchanged}"
    assert (
        params_of(warm.planner_path)["model.embed_tokens.weight"].shape
        != params_of(warm.subagent_path)["model.embed_tokens.weight"].shape
    )

    # GC trimmed step 0 from the statistics stream once both trainers had finished it; the latest stays
    (stats,) = stream_messages(store, job_id, "planner_stats", PlannerStepStats)
    assert stats.step == 1 and get_step(store.client, PlannerStepStats, job_id, "planner_stats", 1) == stats
    assert (
        get_step(store.client, PlannerStepStats, job_id, "planner_stats", 0) is None
    )  # older steps collected
    assert len(stats.queries) == 4 and all(len(q.rollouts) == 8 for q in stats.queries)
    with_episodes = [q.query_id for q in stats.queries if any(r.episodes.get("subagent") for r in q.rollouts)]
    assert with_episodes
    ledger = store.ledger.entries(job_id)
    assert sorted((e.role, e.step) for e in ledger) == [
        ("planner", 0),
        ("planner", 1),
        ("subagent", 0),
        ("subagent", 1),
    ]
    metrics = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    planner_values = next(m for m in metrics if m["role"] == "planner")["values"]
    assert {"planner/reward_mean", "timing/rollout", "timing/exchange_redis"} <= set(planner_values)
    # delegations measured their HTTP + Redis time from the sub-agent's Server-Timing header
    assert 0 < planner_values["exchange/delegation_ms_mean"] < 1e3 * planner_values["timing/rollout"]
    assert (
        0
        < planner_values["exchange/delegation_server_queue_ms_mean"]
        < planner_values["exchange/delegation_ms_mean"]
    )
    sub_values = next(m for m in metrics if m["role"] == "subagent" and m["step"] == 1)["values"]
    assert sub_values["timing/subagent_exchange_redis"] > 0
    assert (
        sub_values["subagent/samples"] == len(with_episodes) * 8 * 3
    )  # exactly K·D aligned samples per query
    prom = httpx.get(f"{cluster.url('planner')}/metrics", headers=H).text
    assert 'mgrpo_http_requests_total{code="200",path="/readyz",role="planner"}' in prom
    ckpts = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/checkpoints", headers=H).json()[
        "checkpoints"
    ]
    assert {c["role"] for c in ckpts} == {"planner", "subagent"}
    for c in ckpts:  # every checkpoint is an ordinary HF folder
        assert not Path(c["checkpoint"]).is_absolute()  # shown relative to the role's volume
        assert (
            AutoModelForCausalLM.from_pretrained(cluster.checkpoint_dir(c["role"]) / c["checkpoint"])
            is not None
        )


def test_main_only_freezes_the_subagent(cluster, warm):
    job_id = submit(cluster, {**SMALL, "mode": "main_only", "steps": 1})
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", job["reason"]
    before, after = params_of(warm.subagent_path), params_of(final_checkpoint(cluster, "subagent", job_id))
    assert all(torch.equal(p, before[n]) for n, p in after.items())
    assert job["policy_versions"]["subagent"] == 0


def test_a_plugin_workflow(cluster):
    """`workflow: lookup` from the example plugin (examples/lookup_plugin): the services find it
    through its entry point and run its own root job class on the deep_research engine."""
    job = wait(cluster, submit(cluster, {**SMALL, "workflow": "lookup"}))
    assert job["status"] == "succeeded", job["reason"]
    assert job["latest_metrics"]["planner"]["lookup/one_fact_questions"] == SMALL["prompts_per_step"]
    r = httpx.post(
        f"{cluster.url('controller')}/v1/jobs", json={"workflow": "lookups"}, headers=H, timeout=30
    )
    assert r.status_code == 422 and "unknown workflow 'lookups'" in r.text and "lookup" in r.text


def test_single_agent_runs_without_the_subagent_service(cluster):
    cluster.kill("subagent")
    try:
        small_world = {
            "n_people": 100,
            "warmstart_steps": 5,
        }  # the single-agent warm start is slow; this only checks the path
        job_id = submit(
            cluster,
            {
                **SMALL,
                **small_world,
                "mode": "single_agent",
                "steps": 1,
                "prompts_per_step": 2,
                "rollouts_per_query": 4,
            },
        )
        job = wait(cluster, job_id)
        assert job["status"] == "succeeded", job["reason"]
    finally:
        cluster.start_role("subagent")
        cluster.wait_ready(120, ("subagent",))


def test_pipelined_co_train_accounts_every_sample(cluster, store):
    """max_staleness 1: the planner rolls out step s + 1 while it trains step s, both engines sample from
    their own weights through every update, and stale samples are trained with the correction."""
    job_id = submit(cluster, {**SMALL, "steps": 4, "max_staleness": 1})
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", job["reason"]
    marks = sorted((e.role, e.step) for e in store.ledger.entries(job_id))
    assert marks == sorted((r, s) for r in DEEP_RESEARCH.role_names for s in range(4))
    totals = assert_accounted(store, job_id, DEEP_RESEARCH.role_names)
    assert job["samples"] == totals  # GET /v1/jobs/{id} reports the same accounts
    assert totals["planner"]["dropped"] == 0  # the schedule keeps every sample within the bound
    rows = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    planner = [r["values"] for r in rows if r["role"] == "planner"]
    assert all(v["planner/stale_beyond_bound"] == 0 for v in planner)
    # a step rolled out during the previous update trains stale samples, reweighted
    stale = [v for v in planner if v["planner/staleness_1"] > 0]
    assert stale and all("planner/is_weight_mean" in v for v in stale), planner
    assert all("timing/period" in v and "timing/wait_trainer" in v for v in planner)


def test_rollouts_through_sglang_servers(tmp_path, warm):
    """Both trainers roll out through an SGLang server (MGRPO_SGLANG_URL) and push every new policy
    to it with `update_weights_from_disk`. The servers are stand-ins that speak SGLang's JSON, backed
    by the `hf` engine on their own copy of the weights, since CI has no GPU to run SGLang on; the
    real server is exercised by the `gpu`-marked test in tests/mgrpo/test_engine_sglang.py."""
    from mgrpo.engines.hf import HFEngine
    from tests.mgrpo.sglang_standin import StandIn

    engines = {
        role: HFEngine(*load(path))
        for role, path in (("planner", warm.planner_path), ("subagent", warm.subagent_path))
    }
    servers = {role: StandIn(e) for role, e in engines.items()}
    try:
        urls = {role: s.__enter__() for role, s in servers.items()}
        # its own embedded Redis: the module's cluster also takes jobs from the shared one's dispatch stream
        c = LocalCluster(
            tmp_path,
            api_token=TOKEN,
            extra_env={"MGRPO_CACHE_DIR": str(CACHE)},
            role_env={r: {"MGRPO_SGLANG_URL": u} for r, u in urls.items()},
        )
        with c:
            job_id = submit(c, SMALL)
            job = wait(c, job_id)
            assert job["status"] == "succeeded", job["reason"]
            trained = {r: final_checkpoint(c, r, job_id) for r in ("planner", "subagent")}
        for role, server in servers.items():
            calls = server.calls
            assert sum(calls["generate"]) > 0, role  # every rollout turn went through the server
            # start-up loads the warm start, then each of the 2 steps pushes its checkpoint
            assert len(calls["update"]) == 3 and calls["update"][-1] == str(trained[role]), (
                role,
                calls["update"],
            )
            served = engines[role].model.state_dict()
            assert all(torch.equal(p, served[n]) for n, p in params_of(trained[role]).items() if n in served)
    finally:
        for role, server in servers.items():
            server.__exit__()
            engines[role].close()
