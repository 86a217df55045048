"""What every FastAPI app shares: the store dependency, bearer auth, health, Prometheus metrics,
and error handlers that turn known errors into 4xx responses with an actionable message."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from services.settings import Settings, get_settings
from shared_store import Store
from shared_store.connection import StoreUnavailableError
from shared_store.jobs import JobConflictError, JobNotFoundError
from shared_store.schemas import PayloadError, SchemaVersionError

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


def install_common(app: FastAPI, role: str) -> None:
    """/healthz, /readyz, /metrics and the error handlers."""
    registry = CollectorRegistry()
    requests = Counter("mgrpo_http_requests", "HTTP requests", ["role", "path", "code"], registry=registry)
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
