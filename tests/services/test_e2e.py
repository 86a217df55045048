"""End to end: the three services as separate OS processes, a real Redis, real HTTP, real training.

The jobs use the default warm start (the one `tests/mgrpo/test_warmstart.py` checks), shared through
the repository's `.cache/mgrpo`, so the models already act and rewards vary.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from mgrpo.agents.chat import ChatFormat, tool_schemas
from mgrpo.config import JobConfig
from mgrpo.models import load
from mgrpo.tasks.deep_research import make_questions
from mgrpo.workflows import DEEP_RESEARCH, job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart, job_task
from services.launcher import LocalCluster
from shared_store import Store, keys
from shared_store.capabilities import call_scope
from shared_store.keys import episode_id
from shared_store.schemas import JobDispatch, PlannerStepStats, decode
from shared_store.streams import get_step
from tests.mgrpo.chat_models import TEMPLATES, chat_model_folder
from tests.plugin_path import plugin_dist
from tests.services.checks import assert_accounted, final_checkpoint, params_of, stream_messages, wait_ledger
from tests.services.loopback import FlakyToolServer, RewardServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "mgrpo"
TOKEN = "test-token"
H = {"Authorization": f"Bearer {TOKEN}"}
SMALL = {
    "steps": 2,
    "prompts_per_step": 2,
    "rollouts_per_query": 4,
    "subagent_slots_per_rollout": 3,
    "partner_timeout_s": 120,
    "roles": {"planner": {"optim": {"lr": 1e-3}}, "subagent": {"optim": {"lr": 1e-3}}},
}


@pytest.fixture(scope="module")
def warm():
    return cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)


@pytest.fixture(scope="module")
def cluster(redis_url, tmp_path_factory, warm):
    # the example workflow plugin, discoverable by every service as if pip-installed
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


@pytest.fixture(scope="module")
def store(redis_url):
    return Store.connect(redis_url)


def submit(cluster, config, **params):
    r = httpx.post(f"{cluster.url('controller')}/v1/jobs", json=config, headers=H, params=params, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["job_id"]


def wait(cluster, job_id, timeout_s=600, until=("succeeded", "failed", "cancelled")):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}", headers=H, timeout=10).json()
        if job["status"] in until:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {job['status']} after {timeout_s} s: {job}")


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


def test_train_on_an_uploaded_dataset_with_an_http_reward(cluster, store, warm):
    """The user's rows (questions about the built-in world, so the warm-started models can answer
    some), uploaded over REST; the user's reward endpoint scores every answer; the held-out split is
    evaluated before and after; both roles train."""
    world = job_task(JobConfig()).world
    rows = [
        {"query": q.text, "answer": q.answer, "split": split, "metadata": {"kind": q.kind}}
        for split, qs in (
            ("train", make_questions(world, "train", 2, 16, seed=5)),
            ("test", make_questions(world, "heldout", 2, 6, seed=5)),
        )
        for q in qs
    ]
    up = httpx.post(
        f"{cluster.url('controller')}/v1/datasets",
        content="\n".join(json.dumps(r) for r in rows),
        headers=H,
        params={"name": "my-questions"},
        timeout=30,
    )
    assert up.status_code in (200, 201), up.text
    reward = RewardServer()
    try:
        job_id = submit(
            cluster,
            {
                **SMALL,
                "prompts_per_step": 4,
                "rollouts_per_query": 8,
                "dataset": {"source": up.json()["dataset_id"], "eval_split": "test"},
                "reward": {"kind": "http", "url": reward.url},
            },
        )
        job = wait(cluster, job_id)
    finally:
        reward.server.shutdown()
    assert job["status"] == "succeeded", job["reason"]
    ev = job["latest_metrics"]["eval"]
    assert ev["queries_after"] == ev["queries_before"] == 6 and 0 <= ev["success_after"] <= 1
    assert ev["success_gain"] == pytest.approx(ev["success_after"] - ev["success_before"])
    references = {i["reference"] for batch in reward.batches for i in batch}
    train_answers = {r["answer"] for r in rows if r["split"] == "train"}
    test_answers = {r["answer"] for r in rows if r["split"] == "test"}
    assert references <= train_answers | test_answers and references & train_answers
    assert job["latest_metrics"]["planner"]["planner/reward_errors"] == 0
    for role, start in (("planner", warm.planner_path), ("subagent", warm.subagent_path)):
        before, after = params_of(start), params_of(final_checkpoint(cluster, role, job_id))
        assert any(not torch.equal(p, before[n]) for n, p in after.items()), f"{role} never moved"


def test_a_sub_agent_on_a_chat_model_and_a_judge_reward(cluster, store, warm, tmp_path):
    """The sub-agent on a random tiny chat model given by path (a Qwen2.5-style template, Hermes tool
    calls), the planner warm-started and rewarded by a judge (another random chat model the planner's
    trainer loads): the job succeeds, both roles train, the rewards are the judge's probabilities,
    and every recorded episode starts with the template's prompt and the role's tool schemas."""
    path = chat_model_folder(tmp_path / "chat", TEMPLATES["qwen2.5"], seed=1, eos_logit=10)
    judge = chat_model_folder(tmp_path / "judge", TEMPLATES["qwen3"], seed=7)
    job_id = submit(
        cluster,
        {
            **SMALL,
            "prompts_per_step": 4,
            "reward": {"kind": "judge", "judge_path": str(judge)},
            "roles": {
                **SMALL["roles"],
                "subagent": {
                    "model": {"path": str(path), "max_new_tokens_per_turn": 48, "max_context_tokens": 1024},
                    "optim": {"lr": 1e-3},
                    "tools": [{"name": "search"}, {"name": "open"}, {"name": "calculator"}],
                },
            },
        },
    )
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", job["reason"]
    records = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    planner = [r["values"] for r in records if r["role"] == "planner" and "planner/success" in r["values"]]
    assert len(planner) == SMALL["steps"]
    assert all(v["planner/reward_rejected"] == v["planner/reward_errors"] == 0 for v in planner)
    # a judge's p(yes) is no multiple of 1/n, as 0/1 scores would be. Some step has one: a step whose
    # rollouts are all malformed (nothing judged, success 0; seen once after the lr-1e-3 update) has none.
    n = 4 * SMALL["rollouts_per_query"]
    assert any(
        0 < v["planner/success"] < 1 and abs(v["planner/success"] * n % 1 - 0.5) < 0.5 - 1e-6 for v in planner
    )
    for role, start in (("planner", warm.planner_path), ("subagent", path)):
        before, after = params_of(start), params_of(final_checkpoint(cluster, role, job_id))
        assert any(not torch.equal(p, before[n]) for n, p in after.items()), f"{role} never moved"
    assert all(0 <= r["values"]["subagent/retokenize_drift"] <= 1 for r in records if r["role"] == "subagent")
    (stats,) = stream_messages(store, job_id, "planner_stats", PlannerStepStats)
    fmt = ChatFormat(
        load(path)[1], tool_schemas([("search", "builtin"), ("open", "builtin"), ("calculator", "builtin")])
    )
    ids = [e for q in stats.queries for r in q.rollouts for e in r.episodes.get("subagent", [])]
    assert ids
    for eid in ids[:5]:
        meta, arrays = store.episodes.get_one(job_id, stats.step, eid)
        prompt = fmt.prompt_ids(meta.subtask)
        assert (
            arrays.token_ids[: len(prompt)].tolist() == prompt and not arrays.loss_mask[: len(prompt)].any()
        )
        assert arrays.loss_mask[len(prompt)] == 1


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


def test_http_tools_that_fail_are_counted_and_the_job_goes_on(cluster):
    tools = FlakyToolServer(alive_calls=60)
    spec = {"kind": "http", "url": tools.url, "timeout_s": 0.5, "retries": 0}
    job_id = submit(
        cluster,
        {
            **SMALL,
            "prompts_per_step": 4,
            "rollouts_per_query": 4,
            "roles": {
                **SMALL["roles"],
                "subagent": {
                    **SMALL["roles"]["subagent"],
                    "tools": [{"name": "search", **spec}, {"name": "open", **spec}],
                },
            },
        },
    )
    job = wait(cluster, job_id)
    tools.server.shutdown()
    assert job["status"] == "succeeded", job["reason"]
    records = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    sub = [r["values"] for r in records if r["role"] == "subagent"]
    calls, errors = sum(v["subagent/tool_calls"] for v in sub), sum(v["subagent/tool_errors"] for v in sub)
    assert tools.calls >= 60 and calls >= tools.calls  # every call counted, including those after the kill
    n = tools.calls  # the calls that reached the server: every 5th timed out, every 7th was garbage
    assert (
        errors >= (calls - n) + n // 5 + n // 7 - n // 35 and errors < calls
    )  # dead, slow, garbage; good too


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


def test_rollouts_through_sglang_servers(tmp_path, warm):
    """Both trainers roll out through an SGLang server (MGRPO_SGLANG_URL) and push every new policy
    to it with `update_weights_from_disk`. The servers are stand-ins that speak SGLang's JSON, backed
    by the `hf` engine on their own copy of the weights, since CI has no GPU to run SGLang on; the
    real server is exercised by the `gpu`-marked test in tests/mgrpo/test_engine_sglang.py."""
    from mgrpo.engines.hf import HFEngine
    from mgrpo.models import load
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
