"""A role's trainer on two ranks (torchrun, FSDP2 over gloo on CPU) inside a real cluster: a `co_train`
job with a 2-rank sub-agent (one machine, `--ranks 2`, FSDP2) and a planner spread over two nodes
(`--nodes 2`, two torchruns meeting at node 0 as on two machines) holding its model as a megatron-core
GPTModel split into two pipeline stages (`MGRPO_BACKEND=megatron`, `MGRPO_PIPELINE_STAGES=2`: its
updates through megatron-core's 1F1B schedule; on the CPU through its documented shim; tensor
parallelism is tested in tests/mgrpo/parallel/test_megatron.py) trains through the services, every update's
weights synced back to the rank-0 service's engine; `kill -9` of the sub-agent's rank 1 mid-job
restarts that role (torchrun stops the group, the cluster's supervisor starts it again) and the job
resumes — the sub-agent's ranks from their own optimizer shards (DCP) — and finishes with every step
trained once. And a planner that is a mixture of experts (the dense warm start upcycled to a Qwen3-
MoE: every expert a copy of its MLP, slightly perturbed) trains on 2 megatron ranks, its experts split
between them, through the same services."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import torch

from mgrpo.config import JobConfig
from mgrpo.models import load
from mgrpo.workflows import DEEP_RESEARCH, job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart
from services.launcher import LocalCluster
from shared_store import Store
from tests.services.checks import (
    assert_accounted,
    assert_updated,
    final_checkpoint,
    params_of,
    rank_pid,
    supervised,
    wait_ledger,
)

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(1200)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"
TOKEN = "ranks-token"
H = {"Authorization": f"Bearer {TOKEN}"}
JOB = {
    "steps": 2,
    "prompts_per_step": 4,
    "rollouts_per_query": 4,
    "subagent_slots_per_rollout": 3,
    "partner_timeout_s": 300,
    "roles": {
        "planner": {"optim": {"lr": 1e-3, "microbatch_tokens": 1024}},
        "subagent": {"optim": {"lr": 1e-3}},
    },
}


def test_two_rank_roles_train_and_survive_losing_a_rank(tmp_path, redis_url):
    warm = cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    cluster = LocalCluster(
        tmp_path,
        redis_url=redis_url,
        api_token=TOKEN,
        ranks={"subagent": 2},
        nodes={"planner": 2},
        role_env={"planner": {"MGRPO_BACKEND": "megatron", "MGRPO_PIPELINE_STAGES": "2"}},
        extra_env={"MGRPO_CACHE_DIR": str(CACHE)},
    )
    with supervised(cluster):
        store, url = Store.connect(cluster.redis_url), cluster.url("controller")
        node = httpx.get(f"{cluster.url('planner@1')}/readyz", timeout=5).json()
        assert node == {"status": "ok", "rank": 1, "world": 2}, (
            node
        )  # the planner's second node is in its group
        r = httpx.post(f"{url}/v1/jobs", json=JOB, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        wait_ledger(store, job_id, "subagent", 0)
        os.kill(rank_pid(cluster, "subagent", 1), signal.SIGKILL)
        deadline = time.monotonic() + 900
        while (job := httpx.get(f"{url}/v1/jobs/{job_id}", headers=H, timeout=10).json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, f"stuck after losing a rank: {job}"
            time.sleep(0.5)
        assert job["status"] == "succeeded", job["reason"]
        assert cluster.restarts.get("subagent") == 1, cluster.restarts  # the group, once; nothing else
        assert (
            "training on 2 ranks over 2 node(s), backend megatron over 2 pipeline stages"
            in (tmp_path / "logs" / "planner.log").read_text()
        )
        log = (tmp_path / "logs" / "subagent.log").read_text()
        assert "training on 2 ranks over 1 node(s), backend fsdp" in log
        # torchrun saw rank 1 killed and stopped the group
        assert "(exitcode: -9) local_rank: 1" in log, log[-3000:]
        marks = sorted((e.role, e.step) for e in store.ledger.entries(job_id))
        assert marks == sorted((r, s) for r in DEEP_RESEARCH.role_names for s in range(JOB["steps"])), marks
        assert_accounted(store, job_id, DEEP_RESEARCH.role_names)

        records = httpx.get(f"{url}/v1/jobs/{job_id}/metrics", headers=H, timeout=10).json()["records"]
        for role in DEEP_RESEARCH.role_names:
            sync = [
                r["values"][f"{role}/weight_sync_s"]
                for r in records
                if f"{role}/weight_sync_s" in r["values"]
            ]
            assert sync and all(s > 0 for s in sync), (
                role,
                records,
            )  # the gathered weights reached the engine
        assert cluster.restarts.get("planner@1") is None, cluster.restarts
        trained = final_checkpoint(cluster, "subagent", job_id)
        assert_updated("subagent", warm.subagent_path, trained, records)
        assert_updated("planner", warm.planner_path, final_checkpoint(cluster, "planner", job_id), records)
        # the sub-agent's ranks (fsdp, one machine) wrote their own optimizer shards (DCP), and resumed
        # from them after the kill; the planner's (megatron, two nodes) is gathered, FQN-keyed
        state = torch.load(trained / "trainer_state.pt", weights_only=False)["optimizer"]
        assert state == {"dcp": "optimizer"} and (trained / "optimizer" / ".metadata").exists(), state
        planner = final_checkpoint(cluster, "planner", job_id)
        assert (
            "model.embed_tokens.weight"
            in torch.load(planner / "trainer_state.pt", weights_only=False)["optimizer"]["state"]
        )

        # the same cluster, a job whose sub-agent trains a LoRA adapter on its 2 fsdp ranks
        lora = {**JOB["roles"]["subagent"], "lora": {"rank": 8, "alpha": 16}}
        r = httpx.post(f"{url}/v1/jobs", json={**JOB, "roles": {**JOB["roles"], "subagent": lora}}, headers=H)
        assert r.status_code == 201, r.text
        lora_job = r.json()["job_id"]
        while (job := httpx.get(f"{url}/v1/jobs/{lora_job}", headers=H, timeout=10).json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline + 300, f"the LoRA job is stuck: {job}"
            time.sleep(0.5)
        assert job["status"] == "succeeded", job["reason"]
    adapter = final_checkpoint(cluster, "subagent", lora_job)
    assert (adapter / "adapter_model.safetensors").exists() and not (adapter / "model.safetensors").exists()
    state = torch.load(adapter / "trainer_state.pt", weights_only=False)["optimizer"]
    assert state == {"dcp": "optimizer"}  # the ranks' own shards of the adapter's optimizer state
    x = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        moved = load(adapter)[0](input_ids=x).logits - load(warm.subagent_path)[0](input_ids=x).logits
    assert moved.abs().max() > 1e-4, "the adapter trained on two ranks never moved the policy"


def upcycled(dense_path: str | Path, out: Path, experts: int = 4) -> Path:
    """The dense warm start as a Qwen3-MoE folder (sparse upcycling): its attention, norms and
    embeddings, every expert a copy of its MLP (plus 1e-3 noise, so the router has a gradient from the
    first update), 2 experts per token whose weights sum to 1 — the dense model's function."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig

    dense = AutoModelForCausalLM.from_pretrained(dense_path)
    c = dense.config
    cfg = Qwen3MoeConfig(
        **{
            k: getattr(c, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "max_position_embeddings",
                "tie_word_embeddings",
                "rms_norm_eps",
                "pad_token_id",
                "bos_token_id",
                "eos_token_id",
            )
        },
        moe_intermediate_size=c.intermediate_size,
        num_experts=experts,
        num_experts_per_tok=2,
        norm_topk_prob=True,
    )
    torch.manual_seed(0)
    moe = AutoModelForCausalLM.from_config(cfg)
    weights = dense.state_dict()
    with torch.no_grad():
        for name, t in moe.state_dict().items():
            if name in weights:
                t.copy_(weights[name])
        for layer, d in zip(moe.model.layers, dense.model.layers, strict=True):
            gate_up = torch.cat([d.mlp.gate_proj.weight, d.mlp.up_proj.weight])
            for e in range(experts):
                layer.mlp.experts.gate_up_proj[e].copy_(gate_up + 1e-3 * torch.randn_like(gate_up))
                layer.mlp.experts.down_proj[e].copy_(d.mlp.down_proj.weight)
            layer.mlp.gate.weight.normal_(std=0.5)
    moe.save_pretrained(out)
    AutoTokenizer.from_pretrained(dense_path).save_pretrained(out)
    return out


def test_a_mixture_of_experts_planner_trains_with_its_experts_over_two_ranks(tmp_path, redis_url):
    warm = cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    path = upcycled(warm.planner_path, tmp_path / "planner-moe")
    cluster = LocalCluster(
        tmp_path / "run",
        redis_url=redis_url,
        api_token=TOKEN,
        ranks={"planner": 2},
        role_env={"planner": {"MGRPO_BACKEND": "megatron"}},
        extra_env={"MGRPO_CACHE_DIR": str(CACHE)},
    )
    job = {**JOB, "roles": {"planner": {"model": {"path": str(path)}, "optim": {"lr": 1e-3}}}}
    with supervised(cluster):
        url = cluster.url("controller")
        r = httpx.post(f"{url}/v1/jobs", json=job, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        deadline = time.monotonic() + 600
        while (got := httpx.get(f"{url}/v1/jobs/{job_id}", headers=H, timeout=10).json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, got
            time.sleep(0.5)
        assert got["status"] == "succeeded", got["reason"]
        assert (
            "training on 2 ranks over 1 node(s), backend megatron"
            in (tmp_path / "run" / "logs" / "planner.log").read_text()
        )
        records = httpx.get(f"{url}/v1/jobs/{job_id}/metrics", headers=H, timeout=10).json()["records"]
        assert all(
            r["values"]["planner/weight_sync_s"] > 0
            for r in records
            if "planner/weight_sync_s" in r["values"]
        )
        trained = final_checkpoint(cluster, "planner", job_id)
        assert "Qwen3MoeForCausalLM" in (trained / "config.json").read_text()
        # with a gradient (the upcycled planner succeeds as often as the dense warm start), every weight
        # moved: the router, and every expert — rank 1's two as well as rank 0's (each expert's slice of
        # HF's fused tensors; a stale one would hide inside a tensor that moved)
        if assert_updated("planner", path, trained, records):
            before, after = params_of(path), params_of(trained)
            for name in (n for n in after if n.endswith("experts.gate_up_proj")):
                stale = [e for e in range(4) if torch.equal(after[name][e], before[name][e])]
                assert not stale, f"{name}: experts {stale} never moved"
