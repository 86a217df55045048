"""What every FastAPI app shares: the store dependency, bearer auth, health, Prometheus metrics,
and error handlers that turn known errors into 4xx responses with an actionable message."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.settings import Settings, get_settings
from shared_store import Store, keys
from shared_store.connection import StoreUnavailableError
from shared_store.jobs import JobConflictError, JobNotFoundError
from shared_store.schemas import MetricsEvent, PayloadError, SchemaVersionError, decode

_bearer = HTTPBearer(auto_error=False)
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


StoreDep = Annotated[Store, Depends(get_store)]


def require_token(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Bearer auth on state-changing endpoints; MGRPO_API_TOKEN='' turns it off (local use only)."""
    if not settings.api_token:
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials, settings.api_token):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or wrong bearer token: send 'Authorization: Bearer $MGRPO_API_TOKEN'",
            headers={"WWW-Authenticate": "Bearer"},
        )


AuthDep = Depends(require_token)


class _TrainingMetrics(Collector):
    """The running job's latest per-step metrics of this role (`planner/reward_mean`, `timing/rollout`,
    …) as gauges `mgrpo_train{job_id, name}`, read from Redis at scrape time."""

    def __init__(self, app: FastAPI, role: str) -> None:
        self.app, self.role = app, role

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runtime = getattr(self.app.state, "runtime", None)
        job = getattr(runtime, "job", None)
        gauge = GaugeMetricFamily(
            "mgrpo_train", "Latest per-step training metric of this role", labels=["job_id", "name"]
        )
        if job is not None:
            raw = self.app.state.store.client.hget(keys.metrics(job.job_id), self.role)
            if raw is not None:
                for name, value in decode(MetricsEvent, raw).values.items():
                    gauge.add_metric([job.job_id, name], value)
        yield gauge


def install_common(app: FastAPI, role: str) -> None:
    """/healthz, /readyz, /metrics and the error handlers."""
    registry = CollectorRegistry()
    requests = Counter("mgrpo_http_requests", "HTTP requests", ["role", "path", "code"], registry=registry)
    registry.register(_TrainingMetrics(app, role))
    app.state.prom_registry = registry

    @app.middleware("http")
    async def count(request: Request, call_next):  # type: ignore[no-untyped-def]
        response = await call_next(request)
        route = request.scope.get("route")
        requests.labels(role, getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, str]:
        return {"status": "ok", "role": role}

    @app.get("/readyz", tags=["ops"])
    def readyz(store: StoreDep) -> dict[str, str]:
        try:
            store.client.ping()
        except Exception as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"Redis not reachable: {exc}") from exc
        return {"status": "ready", "role": role}

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(JobNotFoundError)
    async def not_found(_: Request, exc: JobNotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(JobConflictError)
    async def conflict(_: Request, exc: JobConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(StoreUnavailableError)
    async def unavailable(_: Request, exc: StoreUnavailableError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(SchemaVersionError)
    @app.exception_handler(PayloadError)
    async def bad_payload(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)
