"""Both trainers on a CUDA GPU (`MGRPO_DEVICE=cuda`), through real processes, Redis and HTTP.

Marked `gpu`: skipped where torch sees no GPU (CI); run on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch

from mgrpo.config import JobConfig
from mgrpo.models import load, token_logprobs
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart
from services.launcher import LocalCluster

pytestmark = [pytest.mark.gpu, pytest.mark.e2e, pytest.mark.timeout(1200)]
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "mgrpo"


def test_engine_and_update_on_cuda(tokenizer_and_model_on_cuda):
    """Rollout log-probs from the engine on the GPU equal teacher-forced ones, and an update runs there."""
    from mgrpo.batching import collate
    from mgrpo.engines.base import SamplingParams
    from mgrpo.engines.hf import HFEngine
    from mgrpo.records import Transcript
    from mgrpo.training import UpdateSettings, ppo_update
    from tests.samples import as_samples

    model, tok = tokenizer_and_model_on_cuda
    prompts = [tok.encode(f"Q: question {i}?\n", add_special_tokens=False) for i in range(16)]
    engine = HFEngine(model, tok)
    try:
        samples = engine.generate(prompts, SamplingParams(max_new_tokens=16, seed=1))
    finally:
        engine.close()
    trs = [
        Transcript(
            p + s.token_ids, [0.0] * len(p) + s.logprobs, [0] * len(p) + [1] * len(s.token_ids), len(p)
        )
        for p, s in zip(prompts, samples, strict=True)
    ]
    b = collate(trs, int(tok.pad_token_id)).to(model.device)
    with torch.no_grad():
        lp = token_logprobs(model, b.input_ids, b.attention_mask)
    assert float(((lp - b.logp_old).abs() * b.loss_mask).max()) < 1e-3
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    m = ppo_update(
        model,
        opt,
        as_samples(trs, [1.0 if i % 2 else -1.0 for i in range(len(trs))])[0],
        UpdateSettings(),
        pad_id=int(tok.pad_token_id),
    )
    assert m["approx_kl"] < 1e-4 and m["grad_norm"] > 0


@pytest.fixture
def tokenizer_and_model_on_cuda():
    warm = cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    model, tok = load(warm.planner_path)
    return model.to("cuda"), tok


def test_co_train_job_with_both_trainers_on_cuda(tmp_path):
    """A 2-step co_train job succeeds with MGRPO_DEVICE=cuda on both trainers; both report cuda."""
    cached_warmstart(job_spec(JobConfig()).warmstart_config(), CACHE)
    env = {"MGRPO_CACHE_DIR": str(CACHE), "MGRPO_DEVICE": "cuda"}
    with LocalCluster(tmp_path, extra_env=env) as cluster:  # its own embedded Redis
        job = {"steps": 2, "prompts_per_step": 4, "rollouts_per_query": 4, "subagent_slots_per_rollout": 2}
        job_id = httpx.post(f"{cluster.url('controller')}/v1/jobs", json=job, timeout=30).json()["job_id"]
        devices = set()
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            for role in ("planner", "subagent"):
                view = httpx.get(f"{cluster.url(role)}/v1/policy", timeout=10).json()
                if view["job_id"] == job_id:
                    devices.add((role, view["device"]))
            status = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}", timeout=10).json()
            if status["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.2)
        assert status["status"] == "succeeded", status
        metrics = httpx.get(f"{cluster.url('controller')}/v1/jobs/{job_id}/metrics", timeout=10).json()[
            "records"
        ]
    assert {("planner", "cuda:0"), ("subagent", "cuda:0")} <= devices, devices
    for m in metrics:
        if m["role"] == "planner" and "planner/grad_norm" in m["values"]:
            print(
                "step", m["step"], {k: round(v, 3) for k, v in m["values"].items() if k.startswith("timing/")}
            )
