"""A co_train job whose planner and sub-agent both train LoRA adapters, through the real services
(`mgrpo local up`'s cluster with its own supervisor) on the shipped warm start. The sub-agent's trainer
is SIGKILLed once its first step is in the ledger; the supervisor restarts it and it resumes from its
adapter checkpoint. The job succeeds, every step is in each ledger exactly once, each role's final
checkpoint is a peft adapter folder (no full weights) that moved the policy, and the warm start the
adapters sit on is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from mgrpo.config import JobConfig
from mgrpo.lora import weights_sha256
from mgrpo.models import load
from mgrpo.workflows import DEEP_RESEARCH, job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart
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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"
TOKEN = "lora-token"
H = {"Authorization": f"Bearer {TOKEN}"}
JOB = {
    **SHORT_JOB,
    "roles": {
        "planner": {"optim": {"lr": 2e-3}, "lora": LORA},
        "subagent": {"optim": {"lr": 2e-3}, "lora": LORA},
    },
}


def test_lora_roles_train_and_resume_after_kill(tmp_path):
    warm = cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    cluster = LocalCluster(tmp_path, api_token=TOKEN, extra_env={"MGRPO_CACHE_DIR": str(CACHE)})
    with supervised(cluster):
        url, store = cluster.url("controller"), Store.connect(cluster.redis_url)
        r = httpx.post(f"{url}/v1/jobs", json=JOB, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        killed_and_finished(
            cluster, store, job_id, DEEP_RESEARCH.role_names, after="subagent", kill="subagent", headers=H
        )  # SIGKILL; the supervisor restarts it
        records = httpx.get(f"{url}/v1/jobs/{job_id}/metrics", headers=H).json()["records"]
        events = [
            e.message for e in stream_messages(store, job_id, "events", MetricsEvent) if e.kind == "event"
        ]
    resumed = [e for e in events if e.startswith("subagent resumed at step ")]
    assert len(resumed) == 1 and f"{job_id}/subagent/step-" in resumed[0], events
    assert sum("subagent trains a LoRA adapter (rank 8" in e for e in events) == 2, events  # before and after

    ids = [5, 6, 7, 8, 9, 10]
    x = torch.tensor([ids])
    for role in DEEP_RESEARCH.role_names:
        ckpt = final_checkpoint(cluster, role, job_id)
        names = {p.name for p in ckpt.iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors"} <= names, names
        assert "model.safetensors" not in names
        meta = json.loads((ckpt / "mgrpo.json").read_text())
        base = Path(meta["lora_base"]["path"])
        assert base.resolve() == (warm.folder / role).resolve()
        assert meta["lora_base"]["sha256"] == weights_sha256(base)  # the base is still the warm start
        with torch.no_grad():
            trained = load(ckpt)[0](input_ids=x).logits
            start = load(base)[0](input_ids=x).logits
        assert not torch.allclose(trained, start), f"{role}'s adapter never moved the policy"
        sizes = [
            v for r in records if r["role"] == role for k, v in r["values"].items() if "adapter_bytes" in k
        ]
        assert sizes and all(s > 0 for s in sizes), f"{role} reported no adapter_bytes"
