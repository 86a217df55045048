"""End to end, the deep-research team variant: a planner that delegates lookups to a searcher and
comparisons to a comparer, three trainer services as separate OS processes, a real Redis, real HTTP,
real training. Its warm start builds on the default deep-research one (shared through the
repository's `.cache/mgrpo`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from mgrpo.agents.chat import ChatFormat, tool_schemas
from mgrpo.config import JobConfig
from mgrpo.models import load
from mgrpo.tasks.deep_research import make_questions
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart, job_task
from services.launcher import LocalCluster
from shared_store import Store, keys
from shared_store.schemas import PlannerStepStats, decode
from tests.mgrpo.chat_models import TEMPLATES, chat_model_folder
from tests.services.checks import assert_updated
from tests.services.loopback import FlakyToolServer, RewardServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(1800)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"
TOKEN = "test-token"
H = {"Authorization": f"Bearer {TOKEN}"}
ROLES = ("planner", "searcher", "comparer")
K, D = 4, 2
JOB = {
    "workflow": "deep_research_team",
    "steps": 2,
    "prompts_per_step": 5,
    "rollouts_per_query": K,
    "subagent_slots_per_rollout": D,
    "partner_timeout_s": 120,
    "roles": {r: {"optim": {"lr": 1e-4 if r == "planner" else 1e-3}} for r in ROLES},
}
# the planner at lr 1e-4: the step-1 statistics read below come after its first update, which at 1e-3
# once stopped every delegation to the comparer (a clean clone, 2026-12-03)


@pytest.fixture(scope="module")
def warm():
    return cached_warmstart(job_spec(JobConfig.model_validate(JOB)).warmstart_config(), CACHE, team=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, warm):
    # its own embedded Redis: the deep-research module's planner also consumes the planner dispatch stream
    c = LocalCluster(
        tmp_path_factory.mktemp("team"),
        api_token=TOKEN,
        roles=ROLES,
        extra_env={"MGRPO_CACHE_DIR": str(CACHE)},
    )
    with c:
        yield c


def test_two_kinds_of_sub_agents_each_aligned_to_k_d(cluster, warm):
    r = httpx.post(f"{cluster.url('controller')}/v1/jobs", json=JOB, headers=H, timeout=30)
    assert r.status_code == 201, r.text
    job_id = r.json()["job_id"]
    deadline = time.monotonic() + 900
    while (job := httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}", headers=H, timeout=10).json())[
        "status"
    ] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    assert job["status"] == "succeeded", job["reason"]
    assert job["steps_done"] == dict.fromkeys(ROLES, 1)
    store = Store.connect(cluster.redis_url)
    ((_, fields),) = store.client.xrange(keys.stream(job_id, "planner_stats"))  # step 1 (GC trimmed step 0)
    stats = decode(PlannerStepStats, fields[b"data"])
    records = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    for role in ("searcher", "comparer"):
        with_episodes = [q for q in stats.queries if any(ro.episodes.get(role) for ro in q.rollouts)]
        assert with_episodes, f"no rollout delegated to the {role}"
        values = next(m for m in records if m["role"] == role and m["step"] == 1)["values"]
        assert values[f"{role}/samples"] == len(with_episodes) * K * D  # its own K·D per query
    trained = [
        assert_updated(
            role,
            warm.folder / role,
            sorted((cluster.run_dir / "checkpoints" / role / job_id / role).glob("step-*"))[-1],
            records,
        )
        for role in ROLES
    ]
    assert any(trained), "no role had a gradient in either step"


def test_your_data_tools_and_reward_with_a_chat_model_sub_agent(cluster, warm, tmp_path):
    """Issue 14 end to end: an uploaded dataset, the user's HTTP tools (the warm-started searcher's
    search and open, served by a loopback server) and reward endpoint, and the comparer on a random
    tiny chat model with a Qwen3-style template, given by path. Every role's parameters move; every
    chat episode is recorded with the template's prompt. (Both sub-agents on untrained chat models
    would never reach the comparer: the planner writes a comparison only after lookups that return
    facts. `e2e/test_yours.py` trains a sub-agent on a Qwen2.5-style chat model.)"""
    job = JobConfig.model_validate(JOB)
    world = job_task(job).world
    questions = [("train", q) for q in make_questions(world, "train", 2, 15, seed=3)] + [
        ("test", q) for q in make_questions(world, "heldout", 2, 5, seed=3)
    ]
    rows = "\n".join(json.dumps({"query": q.text, "answer": q.answer, "split": s}) for s, q in questions)
    up = httpx.post(f"{cluster.url('controller')}/v1/datasets", content=rows, headers=H, timeout=30)
    assert up.status_code in (200, 201), up.text
    # The comparer's rewards must differ within a query for it to get a gradient. Two clean clones
    # (2026-12-03) had none: at eos_logit 10 this random model answered every turn of a step with
    # nothing (format errors, reward 0); at 6 every turn with text while no rollout was correct (0.1
    # each). Through the hf engine on this step's subtasks, 60 episodes each, 15-30 % of its turns
    # are empty at 6, 52-55 % at 8, 70-85 % at 10: at 8 a query's 8 episodes are all alike about 1 %
    # of the time. Alignment fills a query's K·D slots from its few comparer episodes (often one or
    # two: the planner compares only after lookups that return facts), so: 10 queries, not 5. And a
    # graded reward: its partial credit for the planner's answers (R_S's planner-outcome part)
    # differs between rollouts where exact match gives 0 to all.
    paths = {"comparer": chat_model_folder(tmp_path / "comparer", TEMPLATES["qwen3"], seed=2, eos_logit=8)}
    tools, reward = FlakyToolServer(job=job, flaky=False), RewardServer(graded=True)
    http_tool = {"kind": "http", "url": tools.url, "timeout_s": 5}
    chat = {"max_new_tokens_per_turn": 48, "max_context_tokens": 1024}
    # One step: its planner is the warm start's, which delegates comparisons; after an update it may
    # not in the last step, whose episodes are the only ones kept (a clean-clone run failed so at 2).
    config = {
        **JOB,
        "steps": 1,
        "prompts_per_step": 10,
        "dataset": {"source": up.json()["dataset_id"], "eval_queries": 5},
        "reward": {"kind": "http", "url": reward.url},
        "roles": {
            "planner": {"optim": {"lr": 1e-4}},
            "searcher": {
                "optim": {"lr": 1e-3},
                "tools": [{"name": "search", **http_tool}, {"name": "open", **http_tool}],
            },
            "comparer": {"model": {"path": str(paths["comparer"]), **chat}, "optim": {"lr": 1e-3}},
        },
    }
    try:
        r = httpx.post(f"{cluster.url('controller')}/v1/jobs", json=config, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        deadline = time.monotonic() + 900
        while (
            view := httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}", headers=H, timeout=10).json()
        )["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, view
            time.sleep(0.5)
    finally:
        tools.server.shutdown()
        reward.server.shutdown()
    assert view["status"] == "succeeded", view["reason"]
    assert reward.batches and tools.calls > 0 and "success_after" in view["latest_metrics"]["eval"]
    starts = {"planner": warm.folder / "planner", "searcher": warm.folder / "searcher", **paths}
    for role in ROLES:
        ckpt = sorted((cluster.run_dir / "checkpoints" / role / job_id / role).glob("step-*"))[-1]
        before = dict(AutoModelForCausalLM.from_pretrained(str(starts[role])).named_parameters())
        after = dict(AutoModelForCausalLM.from_pretrained(str(ckpt)).named_parameters())
        metrics = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", headers=H).json()[
            "records"
        ]
        mine = [m["values"] for m in metrics if m["role"] == role]
        assert any(not torch.equal(p, before[n]) for n, p in after.items()), f"{role} never moved: {mine}"
    store = Store.connect(cluster.redis_url)
    ((_, fields),) = store.client.xrange(keys.stream(job_id, "planner_stats"))  # the one step
    stats = decode(PlannerStepStats, fields[b"data"])
    for role in paths:  # the chat template's prompt (mask 0), then sampled ids (mask 1)
        fmt = ChatFormat(load(paths[role])[1], [])
        ids = [e for q in stats.queries for ro in q.rollouts for e in ro.episodes.get(role, [])]
        assert ids, f"no {role} episode"
        for eid in ids[:5]:
            recorded = store.episodes.get_one(job_id, stats.step, eid)
            assert recorded is not None
            meta, arrays = recorded
            schemas = tool_schemas(
                [(t.name, t.kind) for t in job_spec(JobConfig.model_validate(config)).tools_of(role)]
            )
            prompt = ChatFormat(fmt.tok, schemas).prompt_ids(meta.subtask)
            assert (
                arrays.token_ids[: len(prompt)].tolist() == prompt
                and not arrays.loss_mask[: len(prompt)].any()
            )
            assert (
                arrays.loss_mask[len(prompt) :].all() or meta.finish_reason != "result"
            )  # one turn unless a tool ran
