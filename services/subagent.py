"""A callee role's service (deep_research's sub-agent; marsrl's verifier or corrector, each started
with `mgrpo serve subagent --role <name>`): serves the role's episodes (`POST /v1/episodes`) with its
current policy, records each in Redis, and trains on every step's intake in its job worker. Built by
`create_app(role, settings)`."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response, status

from mgrpo import tracing
from mgrpo.config import JobConfig
from mgrpo.parallel.ranks import RankGroup
from mgrpo.workflows import job_spec
from services.api import EpisodeRequest, EpisodeResponse
from services.common import ServiceDep, install_common, running_job
from services.generate import add_policy_routes
from services.settings import Settings
from services.worker import placement_of, trainer_lifespan
from shared_store import Store
from shared_store.capabilities import call_scope
from shared_store.jobs import JobWatch
from subagent_trainer.job import CalleeJob


class CalleeRuntime:
    """The running job of this service (one at a time), as the callee role `role` of its workflow."""

    def __init__(self, store: Store, role: str, settings: Settings, ranks: RankGroup | None = None) -> None:
        self.store, self.role, self.settings, self.ranks = store, role, settings, ranks
        self.job: CalleeJob | None = None

    def run_job(self, job_id: str, cfg: JobConfig) -> bool:
        job = job_spec(cfg)
        if self.role not in job.callee_trainers:
            raise ValueError(
                f"this service trains role {self.role!r}, which the job's {job.flow.name} workflow does not give a trainer of its own"
            )
        cls: type[CalleeJob] = job.workflow.load("callee_job")
        with JobWatch(self.store.jobs, job_id) as watch:
            placement = placement_of(self.settings, self.ranks, stop=watch.ended)
            callee = cls(self.store, job_id, job, self.role, placement=placement)
            self.job = callee
            try:
                callee.run()
                return False  # the root declares success once it sees the last step in every ledger
            finally:
                self.job = None
                callee.close()


JobDep = Annotated[Any, Depends(running_job)]
router = APIRouter()


@router.post("/v1/episodes", response_model=EpisodeResponse, dependencies=[ServiceDep], tags=["sub-agent"])
def run_episode(body: EpisodeRequest, job: JobDep, request: Request, response: Response) -> EpisodeResponse:
    """Run one delegated input with the current policy and record the episode in Redis. The
    `Server-Timing` header reports, in ms, the handler's time (`episode`), its Redis write (`store`) and
    how long the request waited between arriving and the handler starting (`queued`: parsing,
    validation, a thread from the pool). Only for a delegation the job's root made: the service token
    and the rollout's capability, else a 403 and nothing written."""
    t0 = time.perf_counter()
    queued_ms = (t0 - getattr(request.state, "arrived_s", t0)) * 1e3
    if job.job_id != body.job_id:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"this service is running job {job.job_id}, not {body.job_id}; retry shortly",
            headers={"Retry-After": "1"},
        )
    scope = call_scope(body.call, body.subtask)  # the capability opens this one call
    job.store.capabilities.check(body.capability, body.job_id, body.step, body.query_id, body.rollout, scope)
    meta, store_s = job.run_episode(
        body.step,
        body.query_id,
        body.rollout,
        body.call,
        body.subtask,
        kind="server",
        parent=tracing.extract(request.headers),  # the root's delegation: one trace per rollout
    )
    total_ms = (time.perf_counter() - t0) * 1e3
    response.headers["Server-Timing"] = (
        f"episode;dur={total_ms:.3f}, store;dur={store_s * 1e3:.3f}, queued;dur={queued_ms:.3f}"
    )
    return EpisodeResponse(
        episode_id=meta.episode_id,
        result=meta.result,
        format_ok=meta.format_ok,
        expert_score=meta.expert_score,
        policy_version=meta.policy_version,
        n_tokens=meta.n_tokens,
    )


def _current(request: Request) -> Any:
    return request.app.state.runtime.job


def create_app(role: str, settings: Settings, *, ranks: RankGroup | None = None) -> FastAPI:
    """The callee-role trainer service for `role` (e.g. subagent, verifier)."""
    app = FastAPI(
        title=f"mgrpo {role}",
        version="0.1.0",
        lifespan=trainer_lifespan(
            role, lambda store: CalleeRuntime(store, role, settings, ranks), threads=512
        ),
        description="A callee role: its episodes with the current policy, and its trainer.",
    )
    app.state.settings = settings
    install_common(app, role)
    app.include_router(router)
    add_policy_routes(app, role, _current)
    return app
