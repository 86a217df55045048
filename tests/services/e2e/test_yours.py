"""End to end with what a user brings: an uploaded dataset and an HTTP reward, a chat model given by
path and a judge reward, HTTP tools that fail (the cluster and helpers: `tests/services/e2e/`)."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from mgrpo.agents.chat import ChatFormat, tool_schemas
from mgrpo.config import JobConfig
from mgrpo.models import load
from mgrpo.tasks.deep_research import make_questions
from mgrpo.workflows.deep_research_warmstart import job_task
from shared_store.schemas import PlannerStepStats
from tests.mgrpo.chat_models import TEMPLATES, chat_model_folder
from tests.services.checks import final_checkpoint, params_of, stream_messages
from tests.services.e2e import SMALL, H, submit, wait
from tests.services.loopback import FlakyToolServer, RewardServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(1800)]


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
