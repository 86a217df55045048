"""The sub-agent service: serves delegated episodes (`POST /v1/episodes`) with its current policy,
records each in Redis, and trains on every step's aligned batch in its job worker."""

from __future__ import annotations

import time

from fastapi import FastAPI, HTTPException, Request, Response, status

from mgrpo.config import JobConfig
from mgrpo.runtime import resolve_device
from services.api import EpisodeRequest, EpisodeResponse
from services.common import AuthDep, install_common
from services.generate import add_policy_routes
from services.settings import get_settings
from services.worker import trainer_lifespan
from shared_store import Store, keys
from shared_store.jobs import JobCancelled
from shared_store.schemas import TERMINAL, PlannerStepStats
from shared_store.streams import StreamConsumer, consume_once
from subagent_trainer.job import SubagentJob


class SubagentRuntime:
    """The active job of this service (one at a time) and the loop that trains it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.settings = get_settings()
        self.job: SubagentJob | None = None

    def run_job(self, job_id: str, cfg: JobConfig) -> bool:
        s = self.settings
        job = SubagentJob(self.store, job_id, cfg, cache_dir=s.cache_dir, checkpoint_dir=s.checkpoint_dir,
                          device=resolve_device(s.device), sglang_url=s.sglang_url)  # fmt: skip
        self.job = job
        consumer = StreamConsumer(self.store.client, keys.stream(job_id, "planner_stats"), "subagent", s.consumer_name,
                                  PlannerStepStats, min_idle_ms=30_000)  # fmt: skip
        try:
            last = cfg.steps - 1
            while not self.store.ledger.is_applied(job_id, "subagent", last):
                record = self.store.jobs.get(job_id)
                if record.status in TERMINAL:
                    return False  # the planner finished it (failed / cancelled)
                if record.cancel_requested:
                    raise JobCancelled()
                consume_once(consumer, self.store.ledger, "subagent", job.train_step, count=1, block_ms=200)
            return False  # the planner declares success once it sees the last step in the ledger
        finally:
            self.job = None
            job.close()


lifespan = trainer_lifespan("subagent", SubagentRuntime, threads=512)

app = FastAPI(title="mgrpo sub-agent", version="0.1.0", lifespan=lifespan,
              description="Delegated sub-agent episodes with the current policy; the sub-agent trainer.")  # fmt: skip
install_common(app, "subagent")


def _job(request: Request, job_id: str | None = None) -> SubagentJob:
    job: SubagentJob | None = request.app.state.runtime.job
    if job is None or (job_id is not None and job.job_id != job_id):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"the sub-agent service is not running job {job_id or ''} yet; retry shortly",
        )
    return job


@app.post("/v1/episodes", response_model=EpisodeResponse, dependencies=[AuthDep], tags=["sub-agent"])
def run_episode(body: EpisodeRequest, request: Request, response: Response) -> EpisodeResponse:
    """Run one delegated subtask with the current policy and record the episode in Redis. The
    `Server-Timing` header reports, in ms, the handler's time (`episode`), its Redis write (`store`) and
    how long the request waited between arriving and the handler starting (`queued`: parsing,
    validation, a thread from the pool)."""
    t0 = time.perf_counter()
    queued_ms = (t0 - getattr(request.state, "arrived_s", t0)) * 1e3
    job = _job(request, body.job_id)
    meta, store_s = job.run_episode(body.step, body.query_id, body.rollout, body.call, body.subtask)
    total_ms = (time.perf_counter() - t0) * 1e3
    response.headers["Server-Timing"] = (
        f"episode;dur={total_ms:.3f}, store;dur={store_s * 1e3:.3f}, queued;dur={queued_ms:.3f}"
    )
    return EpisodeResponse(episode_id=meta.episode_id, result=meta.result, format_ok=meta.format_ok,
                           expert_score=meta.expert_score, policy_version=meta.policy_version, n_tokens=meta.n_tokens)  # fmt: skip


add_policy_routes(app, "subagent", lambda request: request.app.state.runtime.job)
