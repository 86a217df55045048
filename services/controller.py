"""The controller: the REST job API. It validates a job config, records it, dispatches it to the
trainer services through Redis, and reports status, metrics, events and checkpoints."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, NoReturn, cast

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.responses import StreamingResponse

from mgrpo import datasets
from mgrpo.config import JobConfig
from mgrpo.programs import check_program
from mgrpo.retention import retained
from mgrpo.workflows import JobConfigError, job_spec
from services.api import CheckpointList, DatasetList, DatasetView, JobList, JobView, MetricsList
from services.common import AuthDep, ReadDep, SettingsDep, StoreDep, install_common
from services.settings import Settings
from shared_store import Store, keys
from shared_store.datasets import DatasetNotFoundError
from shared_store.jobs import JobConflictError, JobNotFoundError
from shared_store.schemas import TERMINAL, DatasetInfo, JobRecord, MetricsEvent, decode
from shared_store.streams import publish_event


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    app.state.store = store = Store.connect(
        settings.redis_url,
        wait_s=settings.redis_wait_s,
        job_retention_s=settings.job_retention_s,
        retry_timeouts=False,  # a store that does not answer is a 503 within seconds
    )
    sweeper = asyncio.create_task(_sweep(store, settings.queue_timeout_s))
    yield
    sweeper.cancel()


async def _sweep(store: Store, timeout_s: float) -> None:
    """Fail, every few seconds, the queued jobs whose roles no trainer has served for `timeout_s`."""
    while True:
        await asyncio.sleep(min(5.0, timeout_s / 2))
        with contextlib.suppress(Exception):  # the store away: the next round tries again
            await asyncio.to_thread(fail_unserved, store, timeout_s)


def fail_unserved(store: Store, timeout_s: float) -> list[str]:
    """The newest queued jobs that waited `timeout_s` with a role no trainer serves, failed with the
    missing roles named (they once stayed queued forever, with no reason)."""
    failed, now = [], time.time()
    records, _ = store.jobs.list(limit=200)
    for record in records:
        if record.status != "queued" or now - record.updated_at < timeout_s:
            continue
        missing = store.presence.missing(record.roles or keys.LEGACY_ROLES)
        if not missing:
            continue
        reason = (
            f"no trainer serves role(s) {', '.join(missing)} (none was up in the {timeout_s:.0f} s the job "
            f"waited): start a trainer service for each (`mgrpo serve planner --role <root>`, `mgrpo serve "
            f"subagent --role <callee>`, or a cluster for this workflow), then resume the job"
        )
        with contextlib.suppress(JobConflictError):  # a trainer took it meanwhile
            store.jobs.transition(record.job_id, "failed", reason)
            failed.append(record.job_id)
    return failed


router = APIRouter()


def create_app(settings: Settings) -> FastAPI:
    """The controller service: the REST job API over the store `settings` name."""
    app = FastAPI(
        title="mgrpo controller",
        version="0.1.0",
        lifespan=lifespan,
        description="Submit and follow decoupled M-GRPO training jobs.",
    )
    app.state.settings = settings
    install_common(app, "controller")
    app.include_router(router)
    return app


def job_view(store: Store, record: JobRecord) -> JobView:
    jid = record.job_id
    latest = {
        k.decode(): decode(MetricsEvent, v).values
        for k, v in cast(dict[bytes, bytes], store.client.hgetall(keys.metrics(jid))).items()
    }
    roles = record.roles or list(keys.LEGACY_ROLES)
    versions = {r: v.version for r in roles if (v := store.policies.get(jid, r)) is not None}
    return JobView(
        **record.model_dump(include=set(JobView.model_fields) & set(record.model_fields)),
        steps_done={r: store.ledger.last_step(jid, r) for r in roles},
        policy_versions=versions,
        samples=store.accounts.totals(jid),
        latest_metrics=latest,
    )


@router.post(
    "/v1/datasets",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetView,
    dependencies=[AuthDep],
    tags=["datasets"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/jsonl": {"schema": {"type": "string", "format": "binary"}},
                "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
)
async def upload_dataset(
    request: Request,
    response: Response,
    store: StoreDep,
    settings: SettingsDep,
    name: Annotated[
        str, Query(max_length=128, pattern=r"^[^\x00-\x1f]*$", description="A label for people.")
    ] = "",
) -> DatasetView:
    """Upload a JSONL or Parquet file as the request body (rows of `query`, `answer`, optional `split`,
    `id`, `metadata`). Every row is validated; a bad one is a 422 naming its row and field, and
    nothing is stored. 201 with the new dataset, 200 when the same rows were uploaded before."""
    limit = settings.max_dataset_bytes
    if int(request.headers.get("content-length") or 0) > limit:
        raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, _too_large(limit))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, _too_large(limit))
    try:  # parsing, hashing and storing a large file: off the event loop, so other requests go on
        info, created = await asyncio.to_thread(_ingest, store, bytes(body), name)
    except datasets.DatasetError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    if not created:
        response.status_code = status.HTTP_200_OK
    return DatasetView(**info.model_dump(include=set(DatasetView.model_fields)), created=created)


def _ingest(store: Store, body: bytes, name: str) -> tuple[DatasetInfo, bool]:
    """Validate an upload's rows and store their canonical form under its hash (in a worker thread)."""
    rows = datasets.parse(body)
    blob = datasets.canonical(rows)
    return store.datasets.put(
        datasets.blob_id(blob),
        blob,
        name=name,
        rows=len(rows),
        splits=datasets.splits(rows),
    )


def _too_large(limit: int) -> str:
    return f"the dataset is larger than {limit} bytes (MGRPO_MAX_DATASET_BYTES); split it, or use a file:// or s3:// URI in the job's dataset.source"


@router.get("/v1/datasets", response_model=DatasetList, dependencies=[ReadDep], tags=["datasets"])
def list_datasets(store: StoreDep) -> DatasetList:
    return DatasetList(
        datasets=[
            DatasetView(**d.model_dump(include=set(DatasetView.model_fields))) for d in store.datasets.list()
        ]
    )


@router.get(
    "/v1/datasets/{dataset_id}", response_model=DatasetView, dependencies=[ReadDep], tags=["datasets"]
)
def get_dataset(dataset_id: str, store: StoreDep) -> DatasetView:
    info = store.datasets.info(dataset_id) if _DATASET_ID.match(dataset_id) else None
    if info is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no dataset {dataset_id!r}: GET /v1/datasets lists them"
        )
    return DatasetView(**info.model_dump(include=set(DatasetView.model_fields)))


_DATASET_ID = re.compile(r"^ds-[0-9a-f]{16}$")


def _check_dataset(store: Store, config: JobConfig) -> None:
    """A job's dataset must be there, with the splits it names: a 422 naming the field otherwise."""
    d = config.dataset
    if d is None:
        return
    try:
        rows = datasets.rows_of(d.source, store.datasets.content)
        datasets.check_splits(rows, d.train_split, d.eval_split)
    except DatasetNotFoundError:
        _unprocessable(
            ("dataset", "source"),
            f"no dataset {d.source!r}: upload it with POST /v1/datasets (GET /v1/datasets lists them)",
        )
    except datasets.DatasetError as exc:
        field = (
            "eval_split"
            if "eval_split" in str(exc)
            else "train_split"
            if "train_split" in str(exc)
            else "source"
        )
        _unprocessable(("dataset", field), str(exc))


def _unprocessable(loc: tuple[str | int, ...], msg: str) -> NoReturn:
    raise HTTPException(
        status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": ["body", *loc], "msg": msg, "type": "value_error"}]
    )


def _check_tracking(config: JobConfig, settings: Settings) -> None:
    """A job's tracking server must be one the operator allows (it is where the trainers send data)."""
    for i, tracker in enumerate(config.tracking or []):
        if tracker.tracking_uri is not None and tracker.tracking_uri not in settings.allowed_tracking_uris:
            _unprocessable(
                ("tracking", i, "tracking_uri"),
                f"{tracker.tracking_uri!r} is not a tracking server this cluster allows; the operator lists "
                "them in MGRPO_ALLOWED_TRACKING_URIS (leave tracking_uri out for the cluster's own store)",
            )


@router.post(
    "/v1/jobs",
    status_code=status.HTTP_201_CREATED,
    response_model=JobView,
    dependencies=[AuthDep],
    tags=["jobs"],
)
def create_job(
    config: JobConfig,
    store: StoreDep,
    settings: SettingsDep,
    job_id: Annotated[
        str | None,
        Query(pattern=r"^[A-Za-z0-9_.\-]{1,128}$", description="Idempotency: reuse to get the same job."),
    ] = None,
) -> JobView:
    if job_id is not None:
        try:
            keys.check_id(
                "job id", job_id
            )  # the store's rule: no id of only dots (a folder above the checkpoints)
        except ValueError as exc:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                [{"loc": ["query", "job_id"], "type": "value_error", "msg": str(exc)}],
            ) from None
    try:
        job = job_spec(config)
    except JobConfigError as exc:
        _unprocessable(exc.loc, exc.msg)
    if config.program is not None and config.program.entry_point is not None:
        try:
            check_program(config.program.entry_point, settings.allowed_programs)
        except ValueError as exc:
            _unprocessable(("program", "entry_point"), str(exc))
    _check_tracking(config, settings)
    size = config.steps * config.prompts_per_step * config.rollouts_per_query
    if size > settings.max_job_rollouts:
        _unprocessable(
            ("steps",),
            f"steps × prompts_per_step × rollouts_per_query = {size:,} rollouts, over this "
            f"service's limit of {settings.max_job_rollouts:,} (MGRPO_MAX_JOB_ROLLOUTS)",
        )
    for role in job.flow.role_names:  # the generation budget: every role's context
        context = job.model_of(role).max_context_tokens
        if context > settings.max_context_tokens:
            _unprocessable(
                ("roles", role, "model", "max_context_tokens"),
                f"{context:,} tokens, over this service's "
                f"limit of {settings.max_context_tokens:,} (MGRPO_MAX_CONTEXT_TOKENS)",
            )
    _check_dataset(store, config)
    record, created = store.jobs.create(config.model_dump(mode="json"), job_id, roles=job.trainer_roles)
    if created and (missing := store.presence.missing(job.trainer_roles)):
        message = (
            f"no trainer serves role(s) {', '.join(missing)} yet: the job fails unless one starts within "
            f"{settings.queue_timeout_s:.0f} s (MGRPO_QUEUE_TIMEOUT_S)"
        )
        publish_event(store.client, record.job_id, "controller", message)
    return job_view(store, record)


@router.get("/v1/jobs", response_model=JobList, dependencies=[ReadDep], tags=["jobs"])
def list_jobs(
    store: StoreDep,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> JobList:
    records, total = store.jobs.list(offset=offset, limit=limit)
    return JobList(jobs=[job_view(store, r) for r in records], total=total, offset=offset, limit=limit)


@router.get("/v1/jobs/{job_id}", response_model=JobView, dependencies=[ReadDep], tags=["jobs"])
def get_job(job_id: str, store: StoreDep) -> JobView:
    return job_view(store, store.jobs.get(_checked(job_id)))


@router.post("/v1/jobs/{job_id}/cancel", response_model=JobView, dependencies=[AuthDep], tags=["jobs"])
def cancel_job(job_id: str, store: StoreDep) -> JobView:
    return job_view(store, store.jobs.request_cancel(_checked(job_id)))


@router.post("/v1/jobs/{job_id}/resume", response_model=JobView, dependencies=[AuthDep], tags=["jobs"])
def resume_job(job_id: str, store: StoreDep) -> JobView:
    """A failed or cancelled job runs on from its last finished step (409 for any other status)."""
    return job_view(store, store.jobs.resume(_checked(job_id)))


@router.get("/v1/jobs/{job_id}/metrics", response_model=MetricsList, dependencies=[ReadDep], tags=["jobs"])
def job_metrics(job_id: str, store: StoreDep) -> MetricsList:
    store.jobs.get(_checked(job_id))
    return MetricsList(job_id=job_id, records=[e for e in _events(store, job_id) if e.kind == "metrics"])


@router.get(
    "/v1/jobs/{job_id}/checkpoints", response_model=CheckpointList, dependencies=[ReadDep], tags=["jobs"]
)
def job_checkpoints(job_id: str, store: StoreDep) -> CheckpointList:
    """Each role's checkpoints on its volume: the records of the steps its trainer keeps (the
    others were garbage-collected; `mgrpo.retention`), the newest record of each step."""
    record = store.jobs.get(_checked(job_id))
    every = int(record.config.get("checkpoint_keep_every_steps", 0) or 0)
    latest = {(c.role, c.step): c for c in store.policies.checkpoints(job_id)}
    steps: dict[str, list[int]] = {}
    for role, step in latest:
        steps.setdefault(role, []).append(step)
    kept = {role: retained(s, keep_every_steps=every) for role, s in steps.items()}
    return CheckpointList(job_id=job_id, checkpoints=[c for (r, s), c in latest.items() if s in kept[r]])


@router.get(
    "/v1/jobs/{job_id}/events", dependencies=[ReadDep], tags=["jobs"], response_class=StreamingResponse
)
async def job_events(job_id: str, store: StoreDep) -> StreamingResponse:
    """Server-sent events: every metrics record and event of the job, then `end` once it finished."""
    store.jobs.get(_checked(job_id))

    async def stream() -> AsyncIterator[str]:
        last = "0"
        while True:
            reply = await asyncio.to_thread(
                store.client.xread, {keys.stream(job_id, "events"): last}, 100, 1000
            )
            for _, entries in cast(list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]], reply or []):
                for entry_id, fields in entries:
                    last = entry_id.decode()
                    event = decode(MetricsEvent, fields[b"data"])
                    yield f"event: {event.kind}\ndata: {event.model_dump_json()}\n\n"
            if not reply and store.jobs.get(job_id).status in TERMINAL:
                yield f"event: end\ndata: {json.dumps({'status': store.jobs.get(job_id).status})}\n\n"
                return

    return StreamingResponse(stream(), media_type="text/event-stream")


def _events(store: Store, job_id: str) -> list[MetricsEvent]:
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], store.client.xrange(keys.stream(job_id, "events")))
    return [decode(MetricsEvent, f[b"data"]) for _, f in entries]


def _checked(job_id: str) -> str:
    try:
        return keys.check_id("job id", job_id)
    except ValueError as exc:
        raise JobNotFoundError(job_id) from exc
