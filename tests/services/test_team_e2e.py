"""End to end, the deep-research team variant: a planner that delegates lookups to a searcher and
comparisons to a comparer, three trainer services as separate OS processes, a real Redis, real HTTP,
real training. Its warm start builds on the default deep-research one (shared through the
repository's `.cache/mgrpo`)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from mgrpo.config import JobConfig
from mgrpo.runtime import warmstart_config
from mgrpo.warmstart import cached_warmstart
from services.launcher import LocalCluster
from shared_store import Store, keys
from shared_store.schemas import PlannerStepStats, decode

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(1800)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"
TOKEN = "test-token"
H = {"Authorization": f"Bearer {TOKEN}"}
ROLES = ("planner", "searcher", "comparer")
K, D = 4, 2
JOB = {"workflow": "deep_research_team", "steps": 2, "prompts_per_step": 5, "rollouts_per_query": K,
       "subagent_slots_per_rollout": D, "partner_timeout_s": 120, "roles": {r: {"optim": {"lr": 1e-3}} for r in ROLES}}  # fmt: skip


@pytest.fixture(scope="module")
def warm():
    return cached_warmstart(warmstart_config(JobConfig.model_validate(JOB)), CACHE, team=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, warm):
    # its own embedded Redis: the deep-research module's planner also consumes the planner dispatch stream
    c = LocalCluster(tmp_path_factory.mktemp("team"), api_token=TOKEN, roles=ROLES,
                     extra_env={"MGRPO_CACHE_DIR": str(CACHE)})  # fmt: skip
    with c:
        yield c


def test_two_kinds_of_sub_agents_each_aligned_to_k_d(cluster, warm):
    r = httpx.post(f"{cluster.url('controller')}/v1/jobs", json=JOB, headers=H, timeout=30)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    deadline = time.monotonic() + 900
    while (job := httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}", timeout=10).json())[
        "status"
    ] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    assert job["status"] == "succeeded", job["reason"]
    assert job["steps_done"] == dict.fromkeys(ROLES, 1)
    store = Store.connect(cluster.redis_url)
    ((_, fields),) = store.client.xrange(keys.stream(job_id, "planner_stats"))  # step 1 (GC trimmed step 0)
    stats = decode(PlannerStepStats, fields[b"data"])
    records = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics").json()["records"]
    for role in ("searcher", "comparer"):
        with_episodes = [q for q in stats.queries if any(ro.episodes.get(role) for ro in q.rollouts)]
        assert with_episodes, f"no rollout delegated to the {role}"
        values = next(m for m in records if m["role"] == role and m["step"] == 1)["values"]
        assert values[f"{role}/samples"] == len(with_episodes) * K * D  # its own K·D per query
    for role in ROLES:  # every role's parameters changed
        ckpt = sorted((cluster.run_dir / "checkpoints" / role / job_id / role).glob("step-*"))[-1]
        before = dict(AutoModelForCausalLM.from_pretrained(str(warm.folder / role)).named_parameters())
        after = dict(AutoModelForCausalLM.from_pretrained(str(ckpt)).named_parameters())
        assert not [n for n, p in after.items() if torch.equal(p, before[n])], role
