"""`POST /v1/generate` for both trainer services: a prompt with the current policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fastapi import FastAPI, HTTPException, Request, status
from transformers import PreTrainedTokenizerBase

from mgrpo.engines.base import RolloutEngine, SamplingParams
from services.api import GenerateRequest, GenerateResponse, PolicyView
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
