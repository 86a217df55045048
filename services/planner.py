"""The root-role service (the planner of deep_research, the solver of marsrl): its job worker runs
the root trainer's step loop (rollouts that call the other roles' services over HTTP, rewards,
statistics or scored batches to Redis, update); `POST /v1/rollouts` (question-answering roots) and
`POST /v1/generate` use the current policy of the running job. Built by `create_app(role, settings)`."""

from __future__ import annotations

import threading
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status

from mgrpo.config import JobConfig
from mgrpo.parallel.ranks import RankGroup
from mgrpo.tasks.deep_research import Question
from mgrpo.workflows import JobSpec, job_spec
from planner_trainer.delegate import CalleeClient
from planner_trainer.job import QuestionRoot
from planner_trainer.queries import PROBE_STEP
from planner_trainer.root import RootJob
from services.api import RolloutRequest, RolloutResponse, RolloutView
from services.common import AuthDep, install_common, running_job
from services.generate import add_policy_routes
from services.hosted import hosted_callees
from services.settings import Settings
from services.worker import placement_of, trainer_lifespan
from shared_store import Store
from shared_store.capabilities import call_scope
from shared_store.jobs import JobWatch


class RootRuntime:
    """The running job of this service (one at a time), as the root role `role` of its workflow."""

    def __init__(self, store: Store, role: str, settings: Settings, ranks: RankGroup | None = None) -> None:
        self.store, self.role, self.settings, self.ranks = store, role, settings, ranks
        self.job: RootJob | None = None

    def run_job(self, job_id: str, cfg: JobConfig) -> bool:
        job = job_spec(cfg)
        if job.root != self.role:
            raise ValueError(
                f"this service serves role {self.role!r}, but the job's root role is {job.root!r}; start it with --role {job.root}"
            )
        self.store.capabilities.issue_secret(job_id)  # signs this job's delegations and sessions
        cls: type[RootJob] = job.workflow.load("root_job")
        with JobWatch(self.store.jobs, job_id) as watch:
            clients = {r: self._client(r, job, job_id, watch.ended) for r in job.callee_trainers}
            try:
                placement = placement_of(self.settings, self.ranks, stop=watch.ended)
                root = cls(self.store, job_id, job, callees=clients, placement=placement)
            except BaseException:
                for c in clients.values():
                    c.close()
                raise
            self.job = root
            try:
                with hosted_callees(self.store, job_id, job, root):
                    root.run()
                return True
            finally:
                self.job = None
                root.close()
                for c in clients.values():
                    c.close()

    def _client(self, role: str, job: JobSpec, job_id: str, ended: threading.Event) -> CalleeClient:
        url = self.settings.callee_url(role)
        if url is None:
            raise ValueError(
                f'no URL for the {role} service: set MGRPO_ROLE_URLS=\'{{"{role}": "http://…"}}\''
            )
        caps = self.store.capabilities
        return CalleeClient(
            url,
            self.settings.service_credential,
            timeout_s=job.cfg.partner_timeout_s,
            role=role,
            ended=ended,
            sign=lambda b: caps.sign(
                b["job_id"], b["step"], b["query_id"], b["rollout"], call_scope(b["call"], b["subtask"])
            ),
        )


JobDep = Annotated[Any, Depends(running_job)]
router = APIRouter()


@router.post("/v1/rollouts", response_model=RolloutResponse, dependencies=[AuthDep], tags=["planner"])
def rollouts(body: RolloutRequest, job: JobDep) -> RolloutResponse:
    """K rollouts of one question with the current root policy (question-answering roots, e.g.
    deep_research's planner; delegations are recorded under a step no trainer reads)."""
    if not isinstance(job, QuestionRoot):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            "/v1/rollouts serves jobs whose root answers questions; this job's does not",
        )
    out, probe = [], f"probe-{uuid.uuid4().hex[:12]}"
    for k in range(body.rollouts):
        r = job.rollout(
            PROBE_STEP, probe, k, Question("probe", body.question, "", 0, "probe"), body.temperature
        )
        out.append(
            RolloutView(
                text=str(job.model.tokenizer.decode(r.transcript.token_ids)),
                answer=r.transcript.final,
                format_ok=r.transcript.format_ok,
                delegations=[{"subtask": d.subtask, "result": d.result} for d in r.delegations],
            )
        )
    return RolloutResponse(rollouts=out, policy_version=job.version)


def _current(request: Request) -> Any:
    return request.app.state.runtime.job


def create_app(role: str, settings: Settings, *, ranks: RankGroup | None = None) -> FastAPI:
    """The root-role trainer service for `role` (e.g. planner, solver)."""
    app = FastAPI(
        title=f"mgrpo {role}",
        version="0.1.0",
        lifespan=trainer_lifespan(role, lambda store: RootRuntime(store, role, settings, ranks), threads=256),
        description="The root-role trainer: rollouts that call the other roles, rewards, updates.",
    )
    app.state.settings = settings
    install_common(app, role)
    app.include_router(router)
    add_policy_routes(app, role, _current)
    return app
