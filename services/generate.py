"""What every trainer service serves with its running job's current policy: `POST /v1/generate` (a
prompt), `POST /v1/chat/completions` and `/v1/s/{session}/chat/completions` (OpenAI-compatible, for
agent programs: openai_agents jobs), `GET /v1/policy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Protocol, cast

from fastapi import FastAPI, HTTPException, Path, Request, status
from transformers import PreTrainedTokenizerBase

from mgrpo.engines.base import RolloutEngine, SamplingParams
from services.api import ChatCompletionRequest, GenerateRequest, GenerateResponse, PolicyView
from services.common import AuthDep


def generate_with(
    engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, body: GenerateRequest, version: int
) -> GenerateResponse:
    ids = list(tokenizer.encode(body.prompt, add_special_tokens=False))
    params = SamplingParams(body.max_new_tokens, body.temperature, body.top_p, seed=body.seed)
    (s,) = engine.generate([ids], params)
    return GenerateResponse(text=s.text, token_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason,
                            policy_version=version)  # fmt: skip


class _RoleModel(Protocol):
    engine: RolloutEngine
    tokenizer: PreTrainedTokenizerBase
    model: Any


class _RunningJob(Protocol):
    job_id: str
    m: _RoleModel

    @property
    def version(self) -> int: ...


def add_policy_routes(app: FastAPI, role: str, current: Callable[[Request], _RunningJob | None]) -> None:
    """`POST /v1/generate` and `GET /v1/policy` of a trainer service, on its running job."""

    @app.post("/v1/generate", response_model=GenerateResponse, dependencies=[AuthDep], tags=[role])
    def generate(body: GenerateRequest, request: Request) -> GenerateResponse:
        job = current(request)
        if job is None:
            raise HTTPException(
                status.HTTP_409_CONFLICT, f"the {role} service is not running a job; submit one first"
            )
        return generate_with(job.m.engine, job.m.tokenizer, body, job.version)

    @app.get("/v1/policy", response_model=PolicyView, tags=[role])
    def policy(request: Request) -> PolicyView:
        job = current(request)
        if job is None:
            return PolicyView(role=role, job_id=None, version=0, step=-1, model="none loaded")
        return PolicyView(
            role=role,
            job_id=job.job_id,
            version=job.version,
            step=job.version - 1,
            model=type(job.m.model).__name__,
            device=str(job.m.model.device),
        )

    add_chat_routes(app, role, current)


def add_chat_routes(app: FastAPI, role: str, current: Callable[[Request], Any]) -> None:
    """The OpenAI-compatible chat completions of a trainer service, on its running job."""

    def chat(request: Request, session: str | None, body: ChatCompletionRequest) -> dict[str, Any]:
        job = current(request)
        serve = getattr(job, "chat_completion", None)
        if serve is None:
            raise HTTPException(status.HTTP_409_CONFLICT, f"the {role} service serves chat completions while it runs an openai_agents job; it runs none")  # fmt: skip
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

    @app.post("/v1/chat/completions", dependencies=[AuthDep], tags=[role])
    def chat_completions(body: ChatCompletionRequest, request: Request) -> dict[str, Any]:
        """OpenAI-compatible chat completion with the role's current policy (openai_agents jobs); the
        `user` field, when it is a session id, records the call as an episode."""
        return chat(request, body.user, body)

    @app.post("/v1/s/{session}/chat/completions", dependencies=[AuthDep], tags=[role])
    def session_chat_completions(
        session: Annotated[str, Path(pattern=r"^\d{1,7}\.[A-Za-z][A-Za-z0-9_]{0,31}\.\d{1,4}$")],
        body: ChatCompletionRequest,
        request: Request,
    ) -> dict[str, Any]:
        """The same under a session's base URL (`<step>.<query>.<rollout>`, what the root hands the
        agent program per run): every call is recorded as an episode of this role."""
        return chat(request, session, body)
