"""End to end, `openai_agents`: an agent program written with the plain `openai` client
(examples/openai_agent) is the rollout. Three role services (planner, searcher, comparer), each a
random tiny chat model behind OpenAI-compatible chat completions; the root runs the program per
query and rollout, every call is recorded as an episode of the role that served it, a loopback
reward endpoint scores the answers, and all three models train. Traces are on: each program run is
one trace, its calls' `chat` spans (from every role's process) children of the run's `rollout` span."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
import torch
from openai import AuthenticationError, OpenAI
from transformers import AutoModelForCausalLM

from mgrpo.models import load
from mgrpo.workflows.openai_agents import Call
from services.launcher import LocalCluster
from shared_store import Store
from shared_store.keys import parse_episode_id
from tests.mgrpo.chat_models import TEMPLATES, chat_model_folder
from tests.services.checks import spans_of
from tests.services.loopback import RewardServer
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "agents-token"
H = {"Authorization": f"Bearer {TOKEN}"}
ROLES = ("planner", "searcher", "comparer")


class ShortAnswers(RewardServer):
    """The user's reward: the shorter the answer, the higher, 1 / (1 + characters). Continuous, so
    a random model's sampled answers of one query never all score alike (a 0/1 rule for "at most
    three words" scored every run of a CI job 0: no gradient, no role moved)."""

    def score(self, answer: str, reference: str) -> float:
        return 1.0 / (1.0 + len(answer))


PROGRAM = "examples.openai_agent.agent:run"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MGRPO_ALLOWED_PROGRAMS": json.dumps([PROGRAM]),  # the operator allows the example program
    }
    run_dir = tmp_path_factory.mktemp("agents")
    env["MGRPO_TRACE_DIR"] = str(run_dir / "traces")
    c = LocalCluster(run_dir, api_token=TOKEN, roles=ROLES, extra_env=env)
    with c:
        yield c


def test_an_openai_api_agent_program_trains_every_role(cluster, tmp_path):
    models = {
        r: chat_model_folder(tmp_path / r, TEMPLATES["qwen2.5" if r != "comparer" else "qwen3"], seed=i)
        for i, r in enumerate(ROLES)
    }
    reward = ShortAnswers()
    job = {
        "workflow": "openai_agents",
        "steps": 2,
        "prompts_per_step": 2,
        "rollouts_per_query": 4,
        "subagent_slots_per_rollout": 2,
        "program": {"entry_point": PROGRAM},
        "reward": {"kind": "http", "url": reward.url},
        "roles": {r: {"model": {"path": str(p)}, "optim": {"lr": 1e-3}} for r, p in models.items()},
    }
    job["roles"]["searcher"] |= {
        "lora": {"rank": 4, "alpha": 8}
    }  # served over the OpenAI API as base + adapter
    try:
        r = httpx.post(f"{cluster.url('controller')}/v1/jobs", json=job, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        deadline = time.monotonic() + 600
        while (
            view := httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}", headers=H, timeout=10).json()
        )["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, view
            time.sleep(0.5)
    finally:
        reward.server.shutdown()
    assert view["status"] == "succeeded", view["reason"]
    planner = view["latest_metrics"]["planner"]
    assert (
        planner["planner/program_errors"] == 0 and planner["planner/calls"] == 2 * 2 * 4
    )  # 2 planner calls a run
    # one batch a step of its well-formed answers (a random model may give an empty one: counted, not scored)
    assert len(reward.batches) == 2 and all(1 <= len(b) <= 8 for b in reward.batches), reward.batches
    assert len(reward.batches[-1]) == 8 - planner["planner/empty_answers"], (reward.batches, planner)
    for role in ROLES:  # every role's calls were recorded, trained on, and moved its model
        counts = view["samples"][role]
        assert counts["produced"] > 0 and counts["trained"] > 0, (role, counts)
        ckpt = sorted((cluster.run_dir / "checkpoints" / role / job_id / role).glob("step-*"))[-1]
        before = dict(AutoModelForCausalLM.from_pretrained(str(models[role])).named_parameters())
        after = dict(load(ckpt)[0].named_parameters())  # a LoRA role's adapter folder: merged
        assert any(not torch.equal(p, before[n]) for n, p in after.items()), f"{role} never moved"
        assert (ckpt / "adapter_config.json").exists() == (role == "searcher"), role
    ids = Store.connect(cluster.redis_url).episodes.step_ids(job_id, 1)
    keys = [(e, parse_episode_id(e)) for e in ids]
    calls = [Call.of(e, k.query_id, k.rollout, k.call) for e, k in keys if k is not None]
    assert {c.role for c in calls if c is not None} == set(ROLES)
    runs_are_traces(cluster.run_dir / "traces", job_id, planner["planner/calls"] // 2)


def runs_are_traces(traces: Path, job_id: str, runs_per_step: int) -> None:
    """Each program run of the job is one trace: its `rollout` span (the root's) is the parent of the
    `chat` spans of its calls, served by every role's own process (the program's HTTP client sends
    no trace context: the services read the run's from Redis)."""

    def spans() -> list[dict]:
        return [s for s in spans_of(traces) if s["attributes"].get("mgrpo.job_id") == job_id]

    def every_call_traced() -> bool:
        written = spans()
        runs = sum(1 for s in written if s["name"] == "rollout")
        roles = {s["attributes"]["mgrpo.role"] for s in written if s["name"] == "chat"}
        return runs == 2 * runs_per_step and roles == set(ROLES)

    wait_for(every_call_traced, "every role's chat spans written", 30)
    every = spans()
    rollouts = {s["context"]["span_id"]: s for s in every if s["name"] == "rollout"}
    assert len(rollouts) == 2 * runs_per_step  # one a run, two steps
    assert len({s["context"]["trace_id"] for s in rollouts.values()}) == len(rollouts)  # a trace each
    chats = [s for s in every if s["name"] == "chat"]
    assert all(s["parent_id"] in rollouts for s in chats), "a chat call outside its run's trace"
    for s in chats:
        run = rollouts[s["parent_id"]]
        assert s["context"]["trace_id"] == run["context"]["trace_id"]
        assert s["attributes"]["mgrpo.query_id"] == run["attributes"]["mgrpo.query_id"]
        assert s["attributes"]["mgrpo.rollout"] == run["attributes"]["mgrpo.rollout"]
    by_service = {s["service"] for s in chats}
    assert by_service == {f"mgrpo-{r}" for r in ROLES}, by_service  # every role's own process


def test_chat_completions_are_openai_compatible_and_need_the_token(cluster):
    base = f"{cluster.url('searcher')}/v1"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=base, api_key="wrong", max_retries=0).chat.completions.create(
            model="searcher", messages=[{"role": "user", "content": "hi"}]
        )
    r = httpx.post(
        f"{base}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=10
    )
    assert r.status_code == 401
    r = httpx.post(
        f"{base}/s/0.q0.0/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers=H,
        timeout=10,
    )
    assert r.status_code == 503 and r.headers.get("retry-after"), r.text  # no job running now: retry later
    r = httpx.post(f"{base}/s/not-a-session/chat/completions", json={"messages": []}, headers=H, timeout=10)
    assert r.status_code == 422
