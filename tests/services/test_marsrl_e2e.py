"""End to end, MarsRL: the solver's, verifier's and corrector's trainer services as separate OS
processes (or the solver's alone, holding one model for every role), a real Redis, real HTTP, real
training. The warm start is a short one (150 SFT steps, cached in the repository's `.cache/mgrpo`),
so the roles already write turns and rewards vary."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import httpx
import pytest
import torch

from mgrpo.config import JobConfig
from mgrpo.models import load
from mgrpo.workflows import job_spec
from mgrpo.workflows.marsrl_warmstart import cached_warmstart
from services.launcher import LocalCluster
from shared_store import Store, keys
from shared_store.schemas import RoleBatch, decode
from tests.services.checks import assert_updated, final_checkpoint, moved, spans_of
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(1800)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"
TOKEN = "test-token"
H = {"Authorization": f"Bearer {TOKEN}"}
ROLES = ("solver", "verifier", "corrector")
JOB = {
    "workflow": "marsrl",
    "steps": 2,
    "prompts_per_step": 2,
    "rollouts_per_query": 4,
    "warmstart_steps": 150,
    "partner_timeout_s": 120,
    "roles": {r: {"optim": {"lr": 1e-3}} for r in ROLES},
}
SHARED = {
    **JOB,
    "roles": {
        "solver": {"optim": {"lr": 1e-3}},
        "verifier": {"share_model_with": "solver"},
        "corrector": {"share_model_with": "solver"},
    },
}


@pytest.fixture(scope="module")
def warm():
    return cached_warmstart(job_spec(JobConfig.model_validate(JOB)).warmstart_config(), CACHE)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, warm):
    # its own embedded Redis: the roles' dispatch streams are global, and another module's cluster may
    # also serve a solver
    run_dir = tmp_path_factory.mktemp("marsrl")
    c = LocalCluster(
        run_dir,
        api_token=TOKEN,
        roles=ROLES,
        extra_env={"MGRPO_CACHE_DIR": str(CACHE), "MGRPO_TRACE_DIR": str(run_dir / "traces")},
    )
    with c:
        yield c


@pytest.fixture(scope="module")
def store(cluster):
    return Store.connect(cluster.redis_url)


def submit(cluster, config):
    r = httpx.post(f"{cluster.url('controller')}/v1/jobs", json=config, headers=H, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["job_id"]


def wait(cluster, job_id, timeout_s=900):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}", headers=H, timeout=10).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {job['status']} after {timeout_s} s: {job}")


def test_three_models_three_trainers(cluster, store, warm):
    # 4 problems a step; still, every solver group of both steps can draw equal rewards (no gradient):
    # assert_updated checks a move exactly where there was a gradient
    job_id = submit(cluster, {**JOB, "prompts_per_step": 4})
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", job["reason"]
    assert job["roles"] == list(ROLES) and job["steps_done"] == dict.fromkeys(ROLES, 1)
    records = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    trained = [assert_updated(r, warm.path(r), final_checkpoint(cluster, r, job_id), records) for r in ROLES]
    assert any(trained), "no role had a gradient in either step"  # ~1e-4 at this warm start's accuracies
    for role in ("verifier", "corrector"):  # every group of a later agent shares one input
        (entry,) = [
            decode(RoleBatch, f[b"data"])
            for _, f in store.client.xrange(keys.stream(job_id, keys.batch_stream(role)))
        ]
        assert entry.step == 1 and entry.groups, role  # GC trimmed step 0
        for g in entry.groups:
            metas = store.episodes.get_many(job_id, 1, [e.episode_id for e in g.episodes])
            assert len({m.subtask for m, _ in metas}) == 1 and len(g.episodes) == 4, (role, g.group)
            assert all(e.reward in (0.0, 1.0) for e in g.episodes)
    assert {r["role"] for r in records} == set(ROLES)
    ckpts = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/checkpoints", headers=H).json()[
        "checkpoints"
    ]
    assert sorted((c["role"], c["step"]) for c in ckpts) == sorted((r, s) for r in ROLES for s in (0, 1))

    # traces (MGRPO_TRACE_DIR): one trace per problem and step, its chain's delegations to the
    # verifier's and corrector's services inside it, each with the callee's episode as its child
    traces = cluster.run_dir / "traces"

    def spans() -> list[dict]:
        return [s for s in spans_of(traces) if s["attributes"].get("mgrpo.job_id") == job_id]

    def complete() -> bool:
        got = spans()
        delegates = {s["context"]["span_id"] for s in got if s["name"] == "delegate"}
        return bool(delegates) and delegates <= {s["parent_id"] for s in got if s["name"] == "episode"}

    wait_for(complete, "every delegation's episode span written", 30)
    got = spans()
    rollouts = {s["context"]["span_id"]: s for s in got if s["name"] == "rollout"}
    assert len(rollouts) == 2 * 4 and len({s["context"]["trace_id"] for s in rollouts.values()}) == 8
    assert {(s["attributes"]["mgrpo.step"], s["service"]) for s in rollouts.values()} == {
        (0, "mgrpo-solver"),
        (1, "mgrpo-solver"),
    }
    by_id = {s["context"]["span_id"]: s for s in got}
    episodes = [s for s in got if s["name"] == "episode"]
    assert {e["service"] for e in episodes} == {"mgrpo-verifier", "mgrpo-corrector"}
    for ep in episodes:
        delegate = by_id[ep["parent_id"]]
        rollout = rollouts[delegate["parent_id"]]  # the delegation sits in its problem's rollout span
        assert ep["context"]["trace_id"] == rollout["context"]["trace_id"]
        assert ep["attributes"]["mgrpo.query_id"].startswith(rollout["attributes"]["mgrpo.query_id"])


def test_one_model_for_every_role(cluster, store, warm):
    job_id = submit(cluster, SHARED)
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", job["reason"]
    assert job["roles"] == ["solver"] and job["steps_done"] == {"solver": 1}
    assert moved(warm.path("shared"), final_checkpoint(cluster, "solver", job_id))
    last = job["latest_metrics"]["solver"]
    assert last["solver/samples"] == 8 and last["verifier/samples"] >= 8  # one update on every role's samples
    assert not store.client.exists(keys.stream(job_id, keys.batch_stream("verifier")))  # nothing for a callee


def test_every_role_its_own_adapter_on_one_base(cluster, store, warm):
    """Roles on one base: the solver's trainer holds the shared warm start once, frozen, and each role
    trains its own LoRA adapter on it with its own update; each role's checkpoints are its adapter."""
    lora = {"rank": 8, "alpha": 16}
    roles = {
        "solver": {"optim": {"lr": 1e-3}, "lora": lora},
        **{r: {"share_model_with": "solver", "optim": {"lr": 1e-3}, "lora": lora} for r in ROLES[1:]},
    }
    job_id = submit(cluster, {**SHARED, "roles": roles})
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", job["reason"]
    assert job["roles"] == ["solver"] and job["steps_done"] == {"solver": 1}
    last = job["latest_metrics"]["solver"]
    for role in ROLES:  # an update per role, each on its own samples
        assert f"{role}/loss" in last and f"{role}/adapter_bytes" in last, sorted(last)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    outs = {}
    for role in ROLES:
        (ckpt,) = sorted((cluster.checkpoint_dir("solver") / job_id / role).glob("step-*"))[-1:]
        assert (ckpt / "adapter_config.json").exists() and not (ckpt / "model.safetensors").exists()
        meta = json.loads((ckpt / "mgrpo.json").read_text())
        assert Path(meta["lora_base"]["path"]).resolve() == Path(warm.path("shared")).resolve()
        with torch.no_grad():
            outs[role] = load(ckpt)[0](input_ids=ids).logits
    assert not torch.allclose(outs["verifier"], outs["corrector"])  # two adapters, not one
    listed = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/checkpoints", headers=H).json()
    assert sorted((c["role"], c["step"], c["checkpoint"]) for c in listed["checkpoints"]) == sorted(
        (r, s, f"{job_id}/{r}/step-{s:06d}") for r in ROLES for s in (0, 1)
    )  # each role's adapter checkpoints, on the solver's volume


def test_kill_9_of_a_random_role_resumes_exactly_once(cluster, store):
    """Pipelined (max_staleness 1): the solver rolls out step s + 1 while every trainer updates on step
    s; after a SIGKILL every step is still trained once and every role's queue adds up."""
    role = random.Random().choice(ROLES)
    job_id = submit(cluster, {**JOB, "steps": 4, "max_staleness": 1})
    deadline = time.monotonic() + 600
    while store.ledger.last_step(job_id, role) < 0:
        assert time.monotonic() < deadline, f"{role} never finished step 0"
        time.sleep(0.1)
    cluster.kill(role)  # SIGKILL mid-job
    cluster.start_role(role)
    cluster.wait_ready(120, (role,))
    job = wait(cluster, job_id)
    assert job["status"] == "succeeded", (role, job["reason"])
    marks = [(e.role, e.step) for e in store.ledger.entries(job_id)]
    assert sorted(marks) == sorted((r, s) for r in ROLES for s in range(4)), (role, marks)  # exactly once
    totals = store.accounts.totals(job_id)
    assert set(totals) == set(ROLES), totals
    for r, t in totals.items():
        assert t["produced"] > 0 and t["produced"] == t["trained"] + t["dropped"] + t["unaligned"], (r, t)
    rows = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    assert any(v["values"].get("solver/staleness_1", 0) > 0 for v in rows if v["role"] == "solver"), rows
