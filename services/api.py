"""REST request/response models of the three services (the OpenAPI documents are built from these)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared_store.schemas import JobStatus, MetricsEvent, PolicyVersion


class JobView(BaseModel):
    job_id: str
    status: JobStatus
    reason: str = ""
    cancel_requested: bool = False
    created_at: float
    updated_at: float
    config: dict[str, Any]
    roles: list[str] = Field(default_factory=list, description="The roles that run a trainer, root first.")
    steps_done: dict[str, int] = Field(
        default_factory=dict, description="Last step each role applied (-1: none)."
    )
    policy_versions: dict[str, int] = Field(default_factory=dict)
    samples: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="Each role's training queue over the job: produced, trained, dropped (stale, `stale_samples: drop`), unaligned.",
    )
    latest_metrics: dict[str, dict[str, float | None]] = Field(default_factory=dict)


class DatasetView(BaseModel):
    dataset_id: str = Field(description="Content-addressed: the same rows give the same id.")
    name: str
    rows: int
    splits: dict[str, int] = Field(description="Rows per split.")
    bytes: int = Field(description="Size of the stored canonical JSONL.")
    created_at: float
    created: bool = Field(False, description="POST only: false when these rows were uploaded before.")


class DatasetList(BaseModel):
    datasets: list[DatasetView]


class JobList(BaseModel):
    jobs: list[JobView]
    total: int
    offset: int
    limit: int


class MetricsList(BaseModel):
    job_id: str
    records: list[MetricsEvent]


class CheckpointList(BaseModel):
    job_id: str
    checkpoints: list[PolicyVersion]


class EpisodeRequest(BaseModel):
    """One delegated subtask of a planner rollout."""

    job_id: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,128}$")
    step: int = Field(ge=0)
    query_id: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    rollout: int = Field(ge=0)
    call: int = Field(ge=0)
    subtask: str = Field(min_length=1, max_length=2000)
    capability: str = Field(
        "",
        max_length=128,
        description="The root trainer's signature of this rollout (`shared_store.capabilities`): without it nothing runs or is recorded (403).",
    )

    model_config = {
        "json_schema_extra": {
            "examples": [
                {
                    "job_id": "job-1",
                    "step": 0,
                    "query_id": "q0",
                    "rollout": 0,
                    "call": 0,
                    "subtask": "birth city of Kir Naibram",
                }
            ]
        }
    }


class EpisodeResponse(BaseModel):
    episode_id: str
    result: str
    format_ok: bool
    expert_score: float | None
    policy_version: int
    n_tokens: int


class GenerateRequest(BaseModel):
    prompt: str = Field(min_length=1, max_length=20_000)
    max_new_tokens: int = Field(48, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**32 - 1, description="Seeds the draw (0 … 2³² − 1).")


class GenerateResponse(BaseModel):
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int


class PolicyView(BaseModel):
    role: str
    job_id: str | None
    version: int
    step: int
    model: str
    device: str = Field("none", description="Where the model lives (cpu, cuda:0, …).")


class RolloutRequest(BaseModel):
    question: str = Field(min_length=1, max_length=2000)
    rollouts: int = Field(1, ge=1, le=64)
    temperature: float = Field(1.0, ge=0.0, le=2.0)


class RolloutView(BaseModel):
    text: str
    answer: str | None
    format_ok: bool
    delegations: list[dict[str, str]]


class RolloutResponse(BaseModel):
    rollouts: list[RolloutView]
    policy_version: int


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat-completions request (the fields mgrpo reads; others, e.g. tool_choice, are accepted
    and ignored). Non-streaming, one choice."""

    model_config = ConfigDict(extra="allow")
    model: str = Field("", max_length=256)
    messages: list[dict[str, Any]] = Field(min_length=1, max_length=512)
    tools: list[dict[str, Any]] | None = Field(None, max_length=64)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    max_tokens: int | None = Field(None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(None, ge=1, le=8192)
    stream: bool = Field(False, description="Must be false: streaming is not served.")
    n: int = Field(1, ge=1, le=1)
    user: str | None = Field(
        None,
        max_length=128,
        description="A session id (`<step>.<query>.<rollout>`) to record the call under.",
    )
