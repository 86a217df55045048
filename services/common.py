"""What every FastAPI app shares: the store dependency, bearer auth, health, Prometheus metrics,
and error handlers that turn known errors into 4xx responses with an actionable message."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, Literal

import redis
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.settings import Settings
from shared_store import Store, keys
from shared_store.capabilities import CapabilityError
from shared_store.connection import StoreUnavailableError, ping_now
from shared_store.jobs import JobConflictError, JobNotFoundError
from shared_store.schemas import MetricsEvent, PayloadError, SchemaVersionError, decode

_bearer = HTTPBearer(auto_error=False)


def app_settings(request: Request) -> Settings:
    """The settings the app was built with (`create_app(…, settings)`)."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(app_settings)]


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


StoreDep = Annotated[Store, Depends(get_store)]


TokenScope = Literal["admin", "read", "service"]


def scopes_of(settings: Settings, token: str | None) -> set[TokenScope]:
    """The scopes a bearer token holds. Admin (`MGRPO_API_TOKEN`): jobs, datasets, generation, and
    read. Read (`MGRPO_READ_TOKEN`): the GETs of jobs, metrics, datasets, policies. Service
    (`MGRPO_SERVICE_TOKEN`, else the admin token): trainer-to-trainer calls, and read. Auth off
    (`MGRPO_API_TOKEN=''`): every scope, with or without a token."""
    if not settings.api_token:
        return {"admin", "read", "service"}
    held: set[TokenScope] = set()

    def match(secret: str) -> bool:
        return bool(secret) and token is not None and secrets.compare_digest(token, secret)

    if match(settings.api_token):
        held |= {"admin", "read"}
    if match(settings.read_token):
        held.add("read")
    if match(settings.service_credential):
        held |= {"service", "read"}
    if settings.open_reads:
        held.add("read")
    return held


WHO: dict[TokenScope, str] = {
    "admin": "the admin token (MGRPO_API_TOKEN)",
    "read": "a read token (MGRPO_READ_TOKEN) or the admin token",
    "service": "the service token (MGRPO_SERVICE_TOKEN): trainers only",
}


def check_scope(scope: TokenScope, settings: Settings, token: str | None) -> None:
    """401 without a known token, 403 with one that lacks `scope`."""
    held = scopes_of(settings, token)
    if scope in held:
        return
    if token is None or not held:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            f"missing or wrong bearer token: send 'Authorization: Bearer <token>' with {WHO[scope]}",
            headers={"WWW-Authenticate": "Bearer"},
        )
    raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {scope} scope: use {WHO[scope]}")


BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def bearer(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


def _require(scope: TokenScope) -> Callable[..., None]:
    def check(settings: SettingsDep, credentials: BearerDep) -> None:
        check_scope(scope, settings, bearer(credentials))

    return check


AuthDep = Depends(_require("admin"))
ReadDep = Depends(_require("read"))
ServiceDep = Depends(_require("service"))


def running_job(request: Request) -> Any:
    """The trainer service's running job; 503 with Retry-After while it runs none (callers retry)."""
    job = getattr(request.app.state.runtime, "job", None)
    if job is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "this service is not running a job yet; submit one to the controller, or retry shortly",
            headers={"Retry-After": "1"},
        )
    return job


class _CountRequests:
    """Counts requests by route and status, and stamps each request's arrival (`request.state.arrived_s`,
    perf_counter seconds; the sub-agent reports the wait until its handler ran as `Server-Timing:
    queued`). Pure ASGI: Starlette's `@app.middleware("http")` runs every request through an extra
    task and memory streams, which the hot `/v1/episodes` path does not need."""

    def __init__(self, app: ASGIApp, counter: Counter, role: str) -> None:
        self.app, self.counter, self.role = app, counter, role

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["arrived_s"] = time.perf_counter()
        code = 500

        async def send_and_note(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            self.counter.labels(self.role, getattr(route, "path", "unmatched"), str(code)).inc()


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
                    gauge.add_metric([job.job_id, name], math.nan if value is None else value)
        yield gauge


def _safe(value: Any, depth: int = 0) -> Any:
    """A value as JSON can hold it, and short: non-finite floats as text, long strings cut."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value if len(value) <= 200 else f"{value[:200]}… ({len(value):,} characters)"
    if isinstance(value, dict) and depth < 4:
        return {str(k)[:100]: _safe(v, depth + 1) for k, v in list(value.items())[:50]}
    if isinstance(value, list | tuple) and depth < 4:
        return [_safe(v, depth + 1) for v in value[:50]]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _safe(repr(value))


def safe_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Validation errors for a 422: where, what and why; the offending input echoed only in short
    (a NaN in the body made FastAPI's own 422 fail to serialise: a 500)."""
    out = []
    for e in errors:
        item = {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        if "input" in e:
            item["input"] = _safe(e["input"])
        out.append(item)
    return out


def install_common(app: FastAPI, role: str) -> None:
    """/healthz, /readyz, /metrics and the error handlers."""
    registry = CollectorRegistry()
    requests = Counter("mgrpo_http_requests", "HTTP requests", ["role", "path", "code"], registry=registry)
    registry.register(_TrainingMetrics(app, role))
    app.state.prom_registry = registry

    app.add_middleware(_CountRequests, counter=requests, role=role)

    def worker_down(request: Request) -> str | None:
        worker = getattr(request.app.state, "worker", None)  # trainers that run a job worker
        if worker is not None and worker.died:
            return f"the {role} job worker stopped; restart the service"
        return None

    @app.get("/healthz", tags=["ops"])
    def healthz(request: Request) -> dict[str, str]:
        """Liveness: the process serves and its job worker (if any) runs."""
        if (down := worker_down(request)) is not None:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, down)
        return {"status": "ok", "role": role}

    @app.get("/readyz", tags=["ops"])
    def readyz(request: Request, store: StoreDep) -> dict[str, str]:
        """Readiness: Redis answers a PING within a second (no retries), and the worker runs."""
        try:
            ping_now(store.client, timeout_s=1.0)
        except StoreUnavailableError as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc), {"Retry-After": "5"}) from exc
        if (down := worker_down(request)) is not None:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, down)
        return {"status": "ready", "role": role}

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse, dependencies=[ReadDep])
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type=CONTENT_TYPE_LATEST)

    _install_error_handlers(app)


def _install_error_handlers(app: FastAPI) -> None:
    """Known errors as 4xx / 503 with a message that says what to do."""

    @app.exception_handler(JobNotFoundError)
    async def not_found(_: Request, exc: JobNotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(JobConflictError)
    async def conflict(_: Request, exc: JobConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(StoreUnavailableError)
    @app.exception_handler(redis.ConnectionError)
    @app.exception_handler(redis.TimeoutError)
    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        """Redis away past the client's retries: a 503 to retry, never a 500."""
        return JSONResponse(
            {"detail": f"the store (Redis) is unreachable: {exc}; retry shortly"},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": safe_errors(exc.errors())}, status_code=422)

    @app.exception_handler(CapabilityError)
    async def forbidden(_: Request, exc: CapabilityError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=403)

    @app.exception_handler(SchemaVersionError)
    @app.exception_handler(PayloadError)
    async def bad_payload(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)
