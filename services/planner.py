"""The planner service: its job worker runs the planner step loop (rollouts with delegation over
HTTP, rewards, statistics to Redis, update); `POST /v1/rollouts` and `POST /v1/generate` use the
current policy of the running job."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request, status

from mgrpo.agents.agents import Delegation, PlannerAgent
from mgrpo.config import JobConfig
from mgrpo.runtime import resolve_device
from planner_trainer.delegate import SubagentClient
from planner_trainer.job import PlannerJob
from services.api import (
    RolloutRequest,
    RolloutResponse,
    RolloutView,
)
from services.common import AuthDep, install_common
from services.generate import add_policy_routes
from services.settings import get_settings
from services.worker import trainer_lifespan
from shared_store import Store


class PlannerRuntime:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.settings = get_settings()
        self.job: PlannerJob | None = None

    def run_job(self, job_id: str, cfg: JobConfig) -> bool:
        s = self.settings
        client = (
            None
            if cfg.mode == "single_agent"
            else SubagentClient(s.subagent_url, s.api_token, timeout_s=cfg.partner_timeout_s)
        )
        job = PlannerJob(
            self.store,
            job_id,
            cfg,
            cache_dir=s.cache_dir,
            checkpoint_dir=s.checkpoint_dir,
            subagent=client,
            device=resolve_device(s.device),
            sglang_url=s.sglang_url,
        )
        self.job = job
        try:
            job.run()
            return True
        finally:
            self.job = None
            job.close()
            if client is not None:
                client.close()


lifespan = trainer_lifespan("planner", PlannerRuntime, threads=256)

app = FastAPI(title="mgrpo planner", version="0.1.0", lifespan=lifespan,
              description="The planner trainer: rollouts with delegation, statistics, updates.")  # fmt: skip
install_common(app, "planner")


def _job(request: Request) -> PlannerJob:
    job: PlannerJob | None = request.app.state.runtime.job
    if job is None:
        raise HTTPException(
            status.HTTP_409_CONFLICT, "the planner service is not running a job; submit one first"
        )
    return job


@app.post("/v1/rollouts", response_model=RolloutResponse, dependencies=[AuthDep], tags=["planner"])
def rollouts(body: RolloutRequest, request: Request) -> RolloutResponse:
    """K rollouts of one question with the current planner policy (delegations are not recorded)."""
    job = _job(request)
    client = job.subagent

    def delegate(subtask: str) -> Delegation:
        return Delegation(subtask, "no sub-agent") if client is None else _probe(job, client, subtask)

    agent = PlannerAgent(job.engine, job.tokenizer, delegate, temperature=body.temperature, limits=job.limits)
    out = []
    for _ in range(body.rollouts):
        r = agent.rollout(body.question)
        out.append(RolloutView(text=str(job.tokenizer.decode(r.transcript.token_ids)), answer=r.transcript.final,
                               format_ok=r.transcript.format_ok,
                               delegations=[{"subtask": d.subtask, "result": d.result} for d in r.delegations]))  # fmt: skip
    return RolloutResponse(rollouts=out, policy_version=job.version)


def _probe(job: PlannerJob, client: SubagentClient, subtask: str) -> Delegation:
    """An off-policy delegation for /v1/rollouts: recorded under a probe step the trainers never read."""
    body = {
        "job_id": job.job_id,
        "step": 999_999,
        "query_id": "probe",
        "rollout": 0,
        "call": 0,
        "subtask": subtask,
    }
    return client.episode(body)


add_policy_routes(app, "planner", lambda request: request.app.state.runtime.job)
