"""Deep research's planner and sub-agent as two LoRA adapters on one frozen base in one trainer
process (`roles.subagent.share_model_with: planner`, `services.hosted`), through the real services:
a cluster that runs only the planner's trainer (no sub-agent service), Redis, the controller.

The planner's process is SIGKILLed once the hosted sub-agent's first step is in the ledger; the
supervisor restarts it and both roles resume from their adapter checkpoints. The job succeeds, every
step of both roles is in the ledger exactly once, each role's queue is accounted, each final
checkpoint is a peft adapter folder on the planner's warm start (unchanged bytes), the two adapters
are their own (different weights), and the sub-agent's updates are its own metrics records."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from mgrpo.config import JobConfig
from mgrpo.lora import weights_sha256
from mgrpo.tasks.deep_research import make_questions
from mgrpo.workflows import DEEP_RESEARCH, job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart, job_task
from services.launcher import LocalCluster
from shared_store import Store
from shared_store.schemas import MetricsEvent
from tests.services.checks import (
    LORA,
    SHORT_JOB,
    final_checkpoint,
    killed_and_finished,
    stream_messages,
    supervised,
)
from tests.services.e2e import TOKEN, H, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"
JOB = {
    **SHORT_JOB,
    "roles": {
        "planner": {"optim": {"lr": 2e-3}, "lora": LORA},
        "subagent": {"optim": {"lr": 2e-3}, "lora": LORA, "share_model_with": "planner"},
    },
}


def test_a_subagent_hosted_on_the_planners_base_trains_and_resumes_after_kill(tmp_path):
    job_cfg = job_spec(JobConfig.model_validate(JOB))
    assert job_cfg.trainer_roles == ("planner",) and job_cfg.hosted_callees == ("subagent",)
    warm = cached_warmstart(job_cfg.warmstart_config(), CACHE, shared=True)  # one model, both roles
    cluster = LocalCluster(
        tmp_path, api_token=TOKEN, roles=("planner",), extra_env={"MGRPO_CACHE_DIR": str(CACHE)}
    )
    with supervised(cluster):
        url, store = cluster.url("controller"), Store.connect(cluster.redis_url)
        r = httpx.post(f"{url}/v1/jobs", json=JOB, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        killed_and_finished(
            cluster, store, job_id, DEEP_RESEARCH.role_names, after="subagent", kill="planner", headers=H
        )  # SIGKILL: the planner and its hosted sub-agent; the supervisor restarts it
        records = httpx.get(f"{url}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
        events = [
            e.message for e in stream_messages(store, job_id, "events", MetricsEvent) if e.kind == "event"
        ]
    for role in DEEP_RESEARCH.role_names:  # both resumed from their own adapter checkpoints, once
        resumed = [e for e in events if e.startswith(f"{role} resumed at step ")]
        assert len(resumed) == 1 and f"{job_id}/{role}/step-" in resumed[0], events

    base = warm.planner_path
    adapters = {}
    for role in DEEP_RESEARCH.role_names:
        ckpt = final_checkpoint(cluster, role, job_id)  # the sub-agent's on the planner's volume
        names = {p.name for p in ckpt.iterdir()}
        assert {
            "adapter_config.json",
            "adapter_model.safetensors",
        } <= names and "model.safetensors" not in names
        meta = json.loads((ckpt / "mgrpo.json").read_text())
        assert Path(meta["lora_base"]["path"]).resolve() == base.resolve(), (role, meta["lora_base"])
        assert meta["lora_base"]["sha256"] == weights_sha256(base)  # the shared base is still the warm start
        adapters[role] = load_file(ckpt / "adapter_model.safetensors")
        steps = [r["step"] for r in records if r["role"] == role and f"{role}/loss" in r["values"]]
        assert steps == list(range(JOB["steps"])) or set(steps) == set(range(JOB["steps"])), (role, steps)
    print(
        {
            r["step"]: {
                k: round(v, 4)
                for k, v in r["values"].items()
                if k.split("/")[-1] in ("grad_norm", "reward_mean", "reward_std", "samples", "loss")
            }
            for r in records
            if r["role"] == "subagent"
        }
    )
    planner, subagent = adapters["planner"], adapters["subagent"]
    assert planner.keys() == subagent.keys()
    differ = [k for k in planner if not torch.equal(planner[k], subagent[k])]
    assert differ, "the hosted sub-agent trained the planner's adapter, not one of its own"
    grads = [r["values"]["subagent/grad_norm"] for r in records if "subagent/grad_norm" in r["values"]]
    assert max(grads) > 0, f"the hosted sub-agent's updates had no gradient: {grads}"
    b = [v for k, v in subagent.items() if "lora_B" in k]  # zero at the start: moved only by its updates
    assert b and all(v.abs().sum() > 0 for v in b), "the hosted sub-agent's adapter never moved"


def test_the_hosted_subagent_rolls_out_on_the_planners_sglang_server(tmp_path):
    """Roles on one base share their rollout servers: the planner's trainer with MGRPO_SGLANG_URL, its
    hosted sub-agent on the same server. The server loads the base once (the planner's start-up) and
    takes each role's adapters under names of its own, and both roles' rollouts name their own. The
    server is a stand-in speaking SGLang's JSON (`mgrpo engine`'s app in a thread), since CI has no GPU
    to run SGLang on."""
    from mgrpo.engines.hf import HFEngine
    from mgrpo.models import load
    from tests.mgrpo.sglang_standin import StandIn

    warm = cached_warmstart(job_spec(JobConfig.model_validate(JOB)).warmstart_config(), CACHE, shared=True)
    model, tokenizer = load(warm.planner_path)
    engine = HFEngine(model, tokenizer, own_weights=True)
    server = StandIn(engine, staging=model)
    with server as sglang:
        cluster = LocalCluster(
            tmp_path,
            api_token=TOKEN,
            roles=("planner",),
            extra_env={"MGRPO_CACHE_DIR": str(CACHE)},
            role_env={"planner": {"MGRPO_SGLANG_URL": sglang}},
        )
        with cluster:
            job = wait(cluster, submit(cluster, JOB))
            assert job["status"] == "succeeded", job["reason"]
    engine.close()
    calls = server.calls
    assert calls["update"] == [str(warm.planner_path)]  # the base, once
    steps = range(1, JOB["steps"] + 1)
    assert sorted(calls["load_lora"]) == sorted(
        f"mgrpo-{r}-v{v}" for r in ("planner", "subagent") for v in steps
    )
    named = {n.rsplit("-v", 1)[0] for batch in calls.get("generate_lora", []) for n in batch}
    assert named == {"mgrpo-planner", "mgrpo-subagent"}, named


def test_the_teams_searcher_and_comparer_hosted_on_the_planners_base(tmp_path):
    """The team variant with both sub-agents hosted (`share_model_with: planner`, a `lora` on each):
    only the planner's service runs, on the `shared_team` warm start (one model SFT'd on the team's
    three roles). Both callees serve delegations and train adapters of their own, each on its own
    K·D aligned slots; the three adapters differ and all rest on the unchanged warm start. Every question
    is a comparison (a file dataset of the world's own), so that the comparer is delegated to: on the
    generated mix, a clean clone's run once had the planner delegate no comparison in either step."""
    k, d, roles = 4, 2, ("planner", "searcher", "comparer")
    world = job_task(JobConfig(workflow="deep_research_team")).world
    comparisons = [
        q for q in make_questions(world, "train", 2, 400, seed=3) if q.kind in ("earlier", "same_country")
    ]
    data = tmp_path / "comparisons.jsonl"
    data.write_text(
        "".join(json.dumps({"query": q.text, "answer": q.answer}) + "\n" for q in comparisons[:20])
    )
    job = {
        **SHORT_JOB,
        "workflow": "deep_research_team",
        "dataset": {"source": f"file://{data}", "eval_split": None},
        "steps": 2,
        "prompts_per_step": 8,
        "rollouts_per_query": k,
        "subagent_slots_per_rollout": d,
        "roles": {
            r: {"optim": {"lr": 1e-4 if r == "planner" else 2e-3}, "lora": LORA}
            | ({} if r == "planner" else {"share_model_with": "planner"})
            for r in roles
        },
    }
    spec = job_spec(JobConfig.model_validate(job))
    assert spec.trainer_roles == ("planner",) and spec.hosted_callees == ("searcher", "comparer")
    warm = cached_warmstart(spec.warmstart_config(), CACHE, team=True, shared=True)
    cluster = LocalCluster(
        tmp_path, api_token=TOKEN, roles=("planner",), extra_env={"MGRPO_CACHE_DIR": str(CACHE)}
    )
    with cluster:
        job_id = submit(cluster, job)
        ended = wait(cluster, job_id, 900)
        assert ended["status"] == "succeeded", ended["reason"]
        url = cluster.url("controller")
        records = httpx.get(f"{url}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
    adapters = {}
    for role in roles:
        ckpt = final_checkpoint(cluster, role, job_id)  # the callees' on the planner's volume
        meta = json.loads((ckpt / "mgrpo.json").read_text())
        assert Path(meta["lora_base"]["path"]).resolve() == warm.planner_path.resolve(), meta["lora_base"]
        assert meta["lora_base"]["sha256"] == weights_sha256(warm.planner_path)
        adapters[role] = load_file(ckpt / "adapter_model.safetensors")
    for role in ("searcher", "comparer"):
        samples = [r["values"][f"{role}/samples"] for r in records if f"{role}/samples" in r["values"]]
        # its own K·D slots per query it got: 1-3 of 5 queries a step for the comparer in runs here, so 8
        assert max(samples) > 0 and all(n % (k * d) == 0 for n in samples), (role, samples)
    for a, b in (("planner", "searcher"), ("planner", "comparer"), ("searcher", "comparer")):
        assert any(not torch.equal(adapters[a][n], adapters[b][n]) for n in adapters[a]), (a, b)
