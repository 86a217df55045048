"""The job worker of a trainer service: a thread that takes jobs from the dispatch stream (one
stream for all roles, read in a consumer group per role, so the roles of two jobs submitted at once
run them in the same order) and runs its role's jobs one at a time, moving the job's status
(running → succeeded / failed / cancelled).

The dispatch entry is acknowledged only when the job is finished, so a service killed mid-job finds
the entry in its own pending list when it restarts (same `MGRPO_CONSUMER_NAME`) and resumes it. A
trainer on W ranks that loses one (`RankLost`) exits the same way, on purpose: the job is not failed,
the group is restarted (torchrun, `mgrpo local up`, Kubernetes) and resumes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import redis
from fastapi import FastAPI

from mgrpo import tracing
from mgrpo.config import JobConfig
from mgrpo.parallel.ranks import RankGroup, RankLost
from mgrpo.runtime import Placement, resolve_device
from services.settings import Settings
from shared_store import Store, keys
from shared_store.connection import StoreUnavailableError
from shared_store.jobs import JobCancelled, JobConflictError
from shared_store.presence import BEAT_EVERY_S
from shared_store.schemas import TERMINAL, JobDispatch
from shared_store.streams import StreamConsumer

log = logging.getLogger("mgrpo.worker")
STORE_DOWN = (redis.ConnectionError, redis.TimeoutError, StoreUnavailableError)
EXIT_RANK_LOST = 75  # EX_TEMPFAIL: start it again
DISPATCH_IDLE_MS = 6 * 3600 * 1000  # another replica takes over a dispatch only after 6 h of silence


class JobWorker:
    def __init__(
        self, store: Store, role: keys.Role, consumer_name: str, run_job: Callable[[str, JobConfig], bool]
    ) -> None:
        """`run_job(job_id, config)` runs the job to its end; True means this role declares success."""
        self.store, self.role, self.run_job = store, role, run_job
        self.consumer = StreamConsumer(
            store.client, keys.dispatch(), role, consumer_name, JobDispatch, min_idle_ms=DISPATCH_IDLE_MS
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"{role}-worker", daemon=True)
        self.beats = threading.Thread(target=self._beat, name=f"{role}-heartbeat", daemon=True)
        self.name = consumer_name
        self.current: str | None = None

    def start(self) -> None:
        self.thread.start()
        self.beats.start()

    def _beat(self) -> None:
        """Tell the store this role's trainer is up (`shared_store.presence`), until stopped."""
        while True:
            with contextlib.suppress(*STORE_DOWN):
                self.store.presence.beat(self.role, self.name)
            if self.stop.wait(BEAT_EVERY_S):
                return

    @property
    def died(self) -> bool:
        """Started, and its thread has ended."""
        return self.thread.ident is not None and not self.thread.is_alive()

    def _pause(self, delay_s: float, message: str, *args: object) -> float:
        """Log, wait out `delay_s` (a stop cuts it short), return the next, doubled delay (≤ 30 s)."""
        log.warning(message + "; retrying in %.0f s", *args, delay_s)
        self.stop.wait(delay_s)
        return min(delay_s * 2, 30.0)

    def _loop(self) -> None:
        backoff = 0.5
        while not self.stop.is_set():
            try:
                for d in self.consumer.read(
                    count=1, block_ms=500
                ):  # own pending first: resume after a restart
                    if self.role in d.message.roles:  # every role reads every job, in one order
                        self._handle(d.message.job_id)
                    self.consumer.ack(d.entry_id)
                backoff = 0.5
            except STORE_DOWN as exc:  # Redis away past the client's retries: wait for it, never die
                self.consumer.resume_own()  # the entry being handled, if any, is still ours
                backoff = self._pause(backoff, "the %s worker lost the store (%s)", self.role, exc)

    def _handle(self, job_id: str) -> None:
        jobs = self.store.jobs
        record = jobs.get(job_id)
        if record.status in TERMINAL:
            return
        self.current = job_id
        try:
            jobs.transition(job_id, "running")
            if self.run_job(job_id, JobConfig.model_validate(record.config)):
                jobs.transition(job_id, "succeeded")
        except RankLost:
            log.critical(
                "job %s: the %s trainer lost a rank; exiting so that its group restarts and resumes it",
                job_id,
                self.role,
                exc_info=True,
            )
            logging.shutdown()
            os._exit(EXIT_RANK_LOST)
        except JobCancelled:
            self._finish(job_id, "cancelled", f"cancelled; the {self.role} trainer stopped")
        except STORE_DOWN as exc:  # named as the store's fault, not as whatever call it broke
            log.exception("job %s: the %s trainer lost the store", job_id, self.role)
            self._finish(job_id, "failed", f"{self.role} trainer: the store (Redis) did not answer: {exc}")
        except Exception as exc:  # the job fails with a reason; the service lives on
            if self._cancel_requested(job_id):  # it stopped because of the cancel (a build given up on)
                self._finish(job_id, "cancelled", f"cancelled; the {self.role} trainer stopped")
                return
            log.exception("job %s failed in the %s trainer", job_id, self.role)
            self._finish(job_id, "failed", f"{self.role} trainer: {type(exc).__name__}: {exc}")
        finally:
            self.current = None

    def _cancel_requested(self, job_id: str) -> bool:
        try:
            return self.store.jobs.cancel_requested(job_id)
        except STORE_DOWN:
            return False

    def _finish(self, job_id: str, status: str, reason: str) -> None:
        """Record the job's end, waiting out a store outage (the reason is kept for when it returns)."""
        delay = 0.5
        while True:
            try:
                with contextlib.suppress(
                    JobConflictError
                ):  # already finished by the partner or the controller
                    self.store.jobs.transition(job_id, status, reason)  # type: ignore[arg-type]
                return
            except STORE_DOWN as exc:
                if self.stop.is_set():
                    return
                delay = self._pause(delay, "cannot mark job %s %s yet (%s)", job_id, status, exc)


def trainer_lifespan(
    role: keys.Role, make_runtime: Callable[[Store], Any], *, threads: int
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The start-up of a trainer service: connect, make its runtime, widen the thread pool (many
    concurrent requests each block on the engine), and run the job worker unless API-only."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings: Settings = app.state.settings
        tracing.configure(role, settings.trace_dir, settings.otlp_endpoint)
        store = Store.connect(
            settings.redis_url, wait_s=settings.redis_wait_s, job_retention_s=settings.job_retention_s
        )
        app.state.store = store
        app.state.runtime = runtime = make_runtime(store)
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        worker = app.state.worker = JobWorker(store, role, settings.consumer_name, runtime.run_job)
        if settings.run_worker:
            worker.start()
        yield
        worker.stop.set()
        tracing.shutdown()

    return lifespan


def placement_of(
    settings: Settings, ranks: RankGroup | None = None, *, stop: threading.Event | None = None
) -> Placement:
    """Where this service's trainer runs its role: its settings' volumes, device and rollout servers,
    its group of ranks (W > 1), and the job's end (`stop`: a warm-start build gives up on it)."""
    return Placement(
        cache_dir=settings.cache_dir,
        checkpoint_dir=settings.checkpoint_dir,
        device=resolve_device(settings.device),
        sglang_url=settings.sglang_url,
        sglang_sync_host=settings.sglang_sync_host,
        public_url=settings.public_url,
        consumer_name=settings.consumer_name,
        ranks=ranks,
        allowed_programs=tuple(settings.allowed_programs),
        tracking_dir=settings.tracking_dir,
        tracking=tuple(settings.tracking),
        allowed_tracking_uris=tuple(settings.allowed_tracking_uris),
        stop=stop,
    )
