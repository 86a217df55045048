"""The root-role service (the planner of deep_research, the solver of marsrl): its job worker runs
the root trainer's step loop (rollouts that call the other roles' services over HTTP, rewards,
statistics or scored batches to Redis, update); `POST /v1/rollouts` (deep_research) and
`POST /v1/generate` use the current policy of the running job."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, status

from mgrpo.config import JobConfig
from mgrpo.runtime import resolve_device
from mgrpo.tasks.deep_research import Question
from mgrpo.workflows import get_workflow, import_string
from planner_trainer.delegate import SubagentClient
from planner_trainer.job import PROBE_STEP, PlannerJob
from planner_trainer.marsrl import MarsRootJob
from planner_trainer.program import ProgramRootJob
from services.api import RolloutRequest, RolloutResponse, RolloutView
from services.common import AuthDep, install_common, running_job
from services.generate import add_policy_routes
from services.settings import get_settings
from services.worker import service_role, trainer_lifespan
from shared_store import Store

ROLE = service_role("planner")
ROOT_JOBS: dict[str, type[PlannerJob] | type[MarsRootJob]] = {
    "marsrl": MarsRootJob,
    "openai_agents": ProgramRootJob,
}


class PlannerRuntime:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.settings = get_settings()
        self.job: PlannerJob | MarsRootJob | None = None

    def run_job(self, job_id: str, cfg: JobConfig) -> bool:
        s, root = self.settings, cfg.flow.root
        if root != ROLE:
            raise ValueError(
                f"this service serves role {ROLE!r}, but the job's root role is {root!r}; start it with --role {root}"
            )
        self.store.capabilities.issue_secret(job_id)  # signs this job's delegations and sessions
        clients = {r: self._client(r, cfg, job_id) for r in cfg.callee_trainers}
        common: dict[str, Any] = dict(
            cache_dir=s.cache_dir,
            checkpoint_dir=s.checkpoint_dir,
            device=resolve_device(s.device),
            sglang_url=s.sglang_url,
            sglang_sync_host=s.sglang_sync_host,
        )
        custom = get_workflow(cfg.workflow).root_job  # a plugin's own root job class
        if cfg.engine == "openai_agents":  # the agent program reaches every role, this one included
            urls = {ROLE: s.public_url, **{r: s.callee_url(r) or "" for r in cfg.callee_trainers}}
            common |= dict(role_urls=urls)
        cls = import_string(custom) if custom else ROOT_JOBS.get(cfg.engine, PlannerJob)
        job: PlannerJob | MarsRootJob = cls(self.store, job_id, cfg, callees=clients, **common)
        self.job = job
        try:
            job.run()
            return True
        finally:
            self.job = None
            job.close()
            for c in clients.values():
                c.close()

    def _client(self, role: str, cfg: JobConfig, job_id: str) -> SubagentClient:
        url = self.settings.callee_url(role)
        if url is None:
            raise ValueError(
                f'no URL for the {role} service: set MGRPO_ROLE_URLS=\'{{"{role}": "http://…"}}\''
            )
        caps = self.store.capabilities
        return SubagentClient(
            url,
            self.settings.service_credential,
            timeout_s=cfg.partner_timeout_s,
            role=role,
            cancelled=lambda: self.store.jobs.cancel_requested(job_id),
            sign=lambda b: caps.sign(b["job_id"], b["step"], b["query_id"], b["rollout"]),
        )


lifespan = trainer_lifespan(ROLE, PlannerRuntime, threads=256)

app = FastAPI(
    title=f"mgrpo {ROLE}",
    version="0.1.0",
    lifespan=lifespan,
    description="The root-role trainer: rollouts that call the other roles, rewards, updates.",
)
install_common(app, ROLE)
JobDep = Annotated[Any, Depends(running_job)]


@app.post("/v1/rollouts", response_model=RolloutResponse, dependencies=[AuthDep], tags=["planner"])
def rollouts(body: RolloutRequest, job: JobDep) -> RolloutResponse:
    """K rollouts of one question with the current planner policy (deep_research; delegations are not recorded)."""
    if not isinstance(job, PlannerJob):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            "/v1/rollouts serves deep_research jobs; this job's workflow has no planner",
        )

    out, probe = [], f"probe-{uuid.uuid4().hex[:12]}"  # its delegations: a probe step no trainer reads
    for k in range(body.rollouts):
        tr, delegations = job.rollout(
            PROBE_STEP, probe, k, Question("probe", body.question, "", 0, "probe"), body.temperature
        )
        out.append(
            RolloutView(
                text=str(job.tokenizer.decode(tr.token_ids)),
                answer=tr.final,
                format_ok=tr.format_ok,
                delegations=[{"subtask": d.subtask, "result": d.result} for d in delegations],
            )
        )
    return RolloutResponse(rollouts=out, policy_version=job.version)


def _current(request: Request) -> Any:
    return request.app.state.runtime.job


add_policy_routes(app, ROLE, _current)
