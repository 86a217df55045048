"""The controller: the REST job API. It validates a job config, records it, dispatches it to the
trainer services through Redis, and reports status, metrics, events and checkpoints."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, NoReturn, cast

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.responses import StreamingResponse

from mgrpo import datasets
from mgrpo.config import JobConfig
from mgrpo.workflows import JobConfigError, job_spec
from services.api import CheckpointList, DatasetList, DatasetView, JobList, JobView, MetricsList
from services.common import AuthDep, ReadDep, SettingsDep, StoreDep, install_common
from services.settings import Settings
from shared_store import Store, keys
from shared_store.datasets import DatasetNotFoundError
from shared_store.jobs import JobNotFoundError
from shared_store.schemas import TERMINAL, JobRecord, MetricsEvent, decode


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    app.state.store = Store.connect(settings.redis_url, wait_s=settings.redis_wait_s)
    yield


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
    try:
        rows = await asyncio.to_thread(datasets.parse, bytes(body))
    except datasets.DatasetError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    info, created = store.datasets.put(
        datasets.dataset_id(rows),
        datasets.canonical(rows),
        name=name,
        rows=len(rows),
        splits=datasets.splits(rows),
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return DatasetView(**info.model_dump(include=set(DatasetView.model_fields)), created=created)


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


def _unprocessable(loc: tuple[str, ...], msg: str) -> NoReturn:
    raise HTTPException(
        status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": ["body", *loc], "msg": msg, "type": "value_error"}]
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
    record, _ = store.jobs.create(config.model_dump(mode="json"), job_id, roles=job.trainer_roles)
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
    store.jobs.get(_checked(job_id))
    return CheckpointList(job_id=job_id, checkpoints=store.policies.checkpoints(job_id))


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
