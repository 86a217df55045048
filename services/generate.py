"""What every trainer service serves with its running job's current policy: `POST /v1/generate` (a
prompt), `POST /v1/chat/completions` and `/v1/s/{session}/chat/completions` (OpenAI-compatible, for
agent programs: openai_agents jobs), `GET /v1/policy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol, cast

from fastapi import FastAPI, HTTPException, Path, Request, status
from transformers import PreTrainedTokenizerBase

from mgrpo.agents.openai_chat import parse_session
from mgrpo.engines.base import RolloutEngine, SamplingParams
from services.api import ChatCompletionRequest, GenerateRequest, GenerateResponse, PolicyView
from services.common import AuthDep, BearerDep, ReadDep, SettingsDep, bearer, check_scope
from services.settings import Settings


def check_budget(n_prompt: int, body: GenerateRequest, settings: Settings, max_positions: int | None) -> None:
    """A generation this service takes on beside its job's rollouts (they share the engine): a prompt
    and a token budget within the caps, and within the model's context; otherwise a 422 that says
    which limit (a 20k-character prompt once stalled a running job for 40 s)."""
    limits = [
        ("prompt", n_prompt, settings.max_generate_prompt_tokens, "MGRPO_MAX_GENERATE_PROMPT_TOKENS"),
        (
            "max_new_tokens",
            body.max_new_tokens,
            settings.max_generate_new_tokens,
            "MGRPO_MAX_GENERATE_NEW_TOKENS",
        ),
    ]
    for field, n, cap, env in limits:
        if n > cap:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                f"{field}: {n} tokens, over this service's limit of {cap} ({env})",
            )
    if max_positions is not None and n_prompt + body.max_new_tokens > max_positions:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"prompt ({n_prompt} tokens) + max_new_tokens ({body.max_new_tokens}) exceed the "
            f"model's context of {max_positions} tokens; shorten one",
        )


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
                status.HTTP_409_CONFLICT, f"the {role} service is not running a job; submit one first"
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
        parsed = parse_session(session) if session else None
        if parsed is None:
            check_scope("admin", settings, token)
        job = current(request)
        serve = getattr(job, "chat_completion", None)
        if parsed is not None and serve is not None:
            step, query_id, rollout = parsed
            job.store.capabilities.check(token, job.job_id, step, query_id, rollout)
        if serve is None:
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"the {role} service serves chat completions while it runs an openai_agents job; it runs none",
            )
        if body.stream:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST, "stream: streaming is not served; send stream: false"
            )
        if not all(isinstance(m.get("role"), str) for m in body.messages):
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT, "messages: every message needs a string 'role'"
            )
        limit = body.max_completion_tokens or body.max_tokens
        try:
            return cast(dict[str, Any], serve(session, {**body.model_dump(), "max_tokens": limit}))
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
