"""What every trainer service serves with its running job's current policy: `POST /v1/generate` (a
prompt), `POST /v1/chat/completions` and `/v1/s/{session}/chat/completions` (OpenAI-compatible, for
agent programs: openai_agents jobs), `GET /v1/policy`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Annotated, Any, Protocol, cast

from fastapi import FastAPI, HTTPException, Path, Request, status
from redis.exceptions import RedisError
from transformers import PreTrainedTokenizerBase

from mgrpo import tracing
from mgrpo.agents.openai_chat import ChatLimits, LimitError, check_limits, parse_session
from mgrpo.engines.base import RolloutEngine, SamplingParams
from services.api import ChatCompletionRequest, GenerateRequest, GenerateResponse, PolicyView
from services.common import AuthDep, BearerDep, ReadDep, SettingsDep, bearer, check_scope
from services.settings import Settings


def check_budget(n_prompt: int, body: GenerateRequest, settings: Settings, max_positions: int | None) -> None:
    """A generation this service takes on beside its job's rollouts (they share the engine): a prompt
    and a token budget within the caps, and within the model's context; otherwise a 422 that says
    which limit (a 20k-character prompt once stalled a running job for 40 s). The chat routes apply
    the same caps (`ChatLimits`)."""
    limits = ChatLimits(settings.max_generate_prompt_tokens, settings.max_generate_new_tokens, max_positions)
    try:
        check_limits(n_prompt, body.max_new_tokens, limits, field="max_new_tokens")
    except LimitError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None


def generate_with(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    body: GenerateRequest,
    version: int,
    settings: Settings,
    max_positions: int | None,
) -> GenerateResponse:
    ids = list(tokenizer.encode(body.prompt, add_special_tokens=False))
    check_budget(len(ids), body, settings, max_positions)
    params = SamplingParams(body.max_new_tokens, body.temperature, body.top_p, seed=body.seed)
    (s,) = engine.generate([ids], params)
    return GenerateResponse(
        text=s.text,
        token_ids=s.token_ids,
        logprobs=s.logprobs,
        finish_reason=s.finish_reason,
        policy_version=version,
    )


class _RoleModel(Protocol):
    engine: RolloutEngine
    tokenizer: PreTrainedTokenizerBase
    model: Any


class _RunningJob(Protocol):
    job_id: str
    model: _RoleModel

    @property
    def version(self) -> int: ...


def add_policy_routes(app: FastAPI, role: str, current: Callable[[Request], _RunningJob | None]) -> None:
    """`POST /v1/generate` and `GET /v1/policy` of a trainer service, on its running job."""

    @app.post("/v1/generate", response_model=GenerateResponse, dependencies=[AuthDep], tags=[role])
    def generate(body: GenerateRequest, request: Request, settings: SettingsDep) -> GenerateResponse:
        job = current(request)
        if job is None:
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                f"the {role} service is not running a job; submit one, or retry shortly",
                headers={"Retry-After": "1"},
            )
        positions = getattr(job.model.model.config, "max_position_embeddings", None)
        return generate_with(job.model.engine, job.model.tokenizer, body, job.version, settings, positions)

    @app.get("/v1/policy", response_model=PolicyView, dependencies=[ReadDep], tags=[role])
    def policy(request: Request) -> PolicyView:
        job = current(request)
        if job is None:
            return PolicyView(role=role, job_id=None, version=0, step=-1, model="none loaded")
        return PolicyView(
            role=role,
            job_id=job.job_id,
            version=job.version,
            step=job.version - 1,
            model=type(job.model.model).__name__,
            device=str(job.model.model.device),
        )

    add_chat_routes(app, role, current)


def _check_request(body: ChatCompletionRequest) -> None:
    """What a chat completion must be before any work: not streamed, every message with a role."""
    if body.stream:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, "stream: streaming is not served; send stream: false"
        )
    if not all(isinstance(m.get("role"), str) for m in body.messages):
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, "messages: every message needs a string 'role'"
        )


def _limits(job: Any, settings: Settings) -> ChatLimits:
    """The generation caps of this service (the settings'), and the running model's context."""
    config = getattr(getattr(getattr(job, "model", None), "model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    return ChatLimits(settings.max_generate_prompt_tokens, settings.max_generate_new_tokens, positions)


def _chat_server(role: str, job: Any, session: str | None, settings: Settings, token: str | None) -> Any:
    """The running job's chat server, once the caller may use it: a session's call (recorded as an
    episode) needs its run's capability as the bearer token (401 without one, 403 with a wrong one);
    any other call the admin scope. 503 while no job runs; 409 when the job serves no chat."""
    parsed = parse_session(session) if session else None
    if parsed is None:
        check_scope("admin", settings, token)
    elif not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "a session's call needs its run's capability as the bearer token (the API key the root gave the program)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if job is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the {role} service is not running a job; retry shortly",
            headers={"Retry-After": "1"},
        )
    serve = getattr(job, "chat_completion", None)
    if serve is None:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"the {role} service serves chat completions while it runs an openai_agents job; this job is not one",
        )
    if parsed is not None:
        step, query_id, rollout = parsed
        job.store.capabilities.check(token, job.job_id, step, query_id, rollout)
    return serve


def _chat_span(request: Request, role: str, job: Any, session: str | None) -> AbstractContextManager[Any]:
    """The `chat` span of a call when tracing is on (nothing otherwise). Its trace: the caller's
    `traceparent` header, else, for a session's call from an agent program's own HTTP client, the run's
    rollout span that the root stored (`shared_store.session_traces`)."""
    if not tracing.enabled():
        return nullcontext()
    parsed = parse_session(session) if session else None
    step, query_id, rollout = parsed if parsed is not None else (None, None, None)
    parent = None
    if "traceparent" in request.headers:
        parent = tracing.extract(request.headers)
    elif parsed is not None:
        try:
            stored = job.store.session_traces.get(job.job_id, session)
        except RedisError:  # a trace is never worth failing the call
            stored = None
        parent = None if stored is None else tracing.extract({"traceparent": stored})
    return tracing.span(
        "chat",
        kind="server",
        parent=parent,
        job_id=job.job_id,
        role=role,
        step=step,
        query_id=query_id,
        rollout=rollout,
    )


def add_chat_routes(app: FastAPI, role: str, current: Callable[[Request], Any]) -> None:
    """The OpenAI-compatible chat completions of a trainer service, on its running job."""

    def chat(
        request: Request,
        session: str | None,
        body: ChatCompletionRequest,
        settings: Settings,
        token: str | None,
    ) -> dict[str, Any]:
        """A session's call (recorded as an episode) needs its rollout's capability as the bearer token
        (the root hands it to the agent program as its API key); any other call the admin scope."""
        job = current(request)
        serve = _chat_server(role, job, session, settings, token)
        _check_request(body)
        limit = body.max_completion_tokens or body.max_tokens
        try:
            limits = _limits(job, settings)
            with _chat_span(request, role, job, session):
                return cast(
                    dict[str, Any], serve(session, {**body.model_dump(), "max_tokens": limit}, limits)
                )
        except LimitError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
        except (ValueError, TypeError) as exc:  # a template that cannot render these messages, …
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT, f"cannot serve this request: {exc}"
            ) from None

    @app.post("/v1/chat/completions", tags=[role])
    def chat_completions(
        body: ChatCompletionRequest, request: Request, settings: SettingsDep, credentials: BearerDep
    ) -> dict[str, Any]:
        """OpenAI-compatible chat completion with the role's current policy (openai_agents jobs); the
        `user` field, when it is a session id, records the call as an episode."""
        return chat(request, body.user, body, settings, bearer(credentials))

    @app.post("/v1/s/{session}/chat/completions", tags=[role])
    def session_chat_completions(
        session: Annotated[str, Path(pattern=r"^\d{1,7}\.[A-Za-z][A-Za-z0-9_]{0,31}\.\d{1,4}$")],
        body: ChatCompletionRequest,
        request: Request,
        settings: SettingsDep,
        credentials: BearerDep,
    ) -> dict[str, Any]:
        """The same under a session's base URL (`<step>.<query>.<rollout>`, what the root hands the
        agent program per run): every call is recorded as an episode of this role."""
        return chat(request, session, body, settings, bearer(credentials))
