"""Every wire message of the store protocol, as pydantic v2 models, in this one module.

Each message carries `schema_version` and an `idempotency_key` (filled from its identity when not
given); step-scoped messages carry `job_id`, `step` and `policy_version`. `decode()` checks the
version before anything else: an unknown or newer version raises `SchemaVersionError`, a payload
that does not validate raises `PayloadError`; neither is ever half-read.
"""

from __future__ import annotations

import json
import math
import time
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from shared_store.keys import check_role

SCHEMA_VERSION = 1
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
RoleName = Annotated[str, AfterValidator(check_role)]


class SchemaVersionError(ValueError):
    """A message was written by another protocol version than this reader understands."""


class PayloadError(ValueError):
    """A message or episode payload is corrupted or does not match its schema."""


class WireModel(BaseModel):
    """Base of every message: versioned, immutable, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = SCHEMA_VERSION
    idempotency_key: str = ""

    @model_validator(mode="before")
    @classmethod
    def _fill_idempotency_key(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("idempotency_key"):
            data = {**data, "idempotency_key": cls.identity(data)}
        return data

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        """The natural idempotency key of a message (overridden per message type)."""
        return f"{cls.__name__}:{data.get('job_id', '')}:{data.get('step', '')}"


class StepMessage(WireModel):
    job_id: str
    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)


# ---- jobs ---------------------------------------------------------------------------------------
class JobRecord(WireModel):
    """A job as the registry stores it. `config` is the validated job config (opaque to the store)."""

    job_id: str
    status: JobStatus
    config: dict[str, Any]
    created_at: float
    updated_at: float
    reason: str = ""
    cancel_requested: bool = False
    roles: list[RoleName] = Field(default_factory=list)  # the roles that run a trainer, root first

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"job:{data.get('job_id', '')}"


class JobDispatch(WireModel):
    """'Start this job' for the trainer roles it names (one global dispatch stream: every role meets
    the jobs in one order, so two roles never run different jobs waiting on each other)."""

    job_id: str
    roles: list[RoleName] = Field(min_length=1, max_length=64)

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"dispatch:{data.get('job_id', '')}"


class DatasetInfo(WireModel):
    """An uploaded dataset (its rows live beside it, content-addressed by `dataset_id`)."""

    dataset_id: str
    name: str = ""
    rows: int = Field(ge=1)
    splits: dict[str, int]
    bytes: int = Field(ge=0, description="Size of its canonical JSONL.")
    created_at: float

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"dataset:{data.get('dataset_id', '')}"


# ---- per-step statistics --------------------------------------------------------------------------
class RolloutStat(BaseModel):
    # NaN = unscorable (a rejected reward, algorithm.md §4): written as the JSON constant NaN, not null.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")
    rollout: int = Field(ge=0)
    reward: float
    correct: float
    format_ok: bool
    episodes: dict[RoleName, list[str]] = Field(
        default_factory=dict
    )  # callee role → episode ids, in call order


class QueryStats(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")
    query_id: str
    rollouts: list[RolloutStat]
    reward_mean: float
    reward_std: float


class PlannerStepStats(StepMessage):
    """Planner → sub-agent: per-query planner outcomes of one step (the K rollouts of each query)."""

    queries: list[QueryStats]


class ScoredEpisode(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    episode_id: str
    reward: float  # NaN = unscorable


class EpisodeGroup(BaseModel):
    """One GRPO group of a role: episodes that share one input."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    group: str
    episodes: list[ScoredEpisode]


class RoleBatch(StepMessage):
    """Root trainer → a callee role's trainer: that role's episodes of one step, scored and grouped
    (workflows whose root scores every role, e.g. MarsRL)."""

    role: RoleName
    groups: list[EpisodeGroup]

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"RoleBatch:{data.get('job_id', '')}:{data.get('role', '')}:{data.get('step', '')}"


# ---- episodes, policies, metrics, ledger -------------------------------------------------------------
class EpisodeMeta(StepMessage):
    """Metadata of one callee episode (a sub-agent's, a verifier's, …); its arrays travel as bytes beside it (see codec)."""

    episode_id: str
    query_id: str
    rollout: int = Field(ge=0)
    call: int = Field(ge=0)
    n_tokens: int = Field(ge=0)
    checksum: int = 0
    format_ok: bool = True
    expert_score: float | None = None
    finish_reason: str = ""
    subtask: str = ""
    result: str = ""

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"episode:{data.get('job_id', '')}:{data.get('episode_id', '')}"


class RootSampleMeta(StepMessage):
    """One of a root trainer's own samples of a produced step; its arrays travel beside it (codec)."""

    index: int = Field(ge=0)
    role: RoleName
    group: str
    reward: float | None  # None: unscorable (NaN)
    prompt_len: int = Field(ge=0)
    episode_id: str = ""
    n_tokens: int = Field(ge=0)
    checksum: int = 0

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"root_sample:{data.get('job_id', '')}:{data.get('step', '')}:{data.get('index', '')}"


class PolicyVersion(WireModel):
    job_id: str
    role: RoleName
    version: int = Field(ge=0)
    step: int = Field(ge=-1)
    checkpoint: str = ""
    published_at: float = Field(default_factory=time.time)

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"policy:{data.get('job_id', '')}:{data.get('role', '')}:{data.get('version', '')}"


class MetricsEvent(WireModel):
    """A per-step metrics record or a job event (→ controller, SSE, metrics.jsonl). A value that is not
    a finite number (NaN, ±Infinity: e.g. the std of a role's advantages in a step it had no samples)
    is stored and served as null, which every reader accepts; JSON has no NaN."""

    job_id: str
    step: int = Field(ge=-1)
    role: RoleName  # a workflow role, or "controller"
    kind: Literal["metrics", "event"] = "metrics"
    values: dict[str, float | None] = Field(default_factory=dict)
    message: str = ""
    time: float = Field(default_factory=time.time)

    @field_validator("values", mode="before")
    @classmethod
    def _finite_or_null(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()}

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"{data.get('kind', 'metrics')}:{data.get('job_id', '')}:{data.get('role', '')}:{data.get('step', '')}"


class LedgerEntry(WireModel):
    """'Role R applied step S of job J' — written once, when the step's effect is durable."""

    job_id: str
    role: RoleName
    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    consumer: str = ""
    applied_at: float = Field(default_factory=time.time)

    @classmethod
    def identity(cls, data: dict[str, Any]) -> str:
        return f"ledger:{data.get('job_id', '')}:{data.get('role', '')}:{data.get('step', '')}"


# ---- encoding -------------------------------------------------------------------------------------
M = TypeVar("M", bound=WireModel)


def encode(message: WireModel) -> bytes:
    return message.model_dump_json().encode()


def decode(model: type[M], raw: bytes | str) -> M:
    """Parse one message, checking its schema version. Raises SchemaVersionError / PayloadError."""
    try:
        message = model.model_validate_json(raw)  # fast path: one pass in pydantic-core
    except ValidationError:
        message = None
    if (
        message is not None
        and message.schema_version == SCHEMA_VERSION
        and "schema_version" in message.model_fields_set
    ):
        return message
    try:  # slow path: find out why, version first, so a newer message is never half-read
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"{model.__name__}: payload is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise PayloadError(f"{model.__name__}: payload must be a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{model.__name__}: schema_version {version!r} is not supported (this build reads "
            f"{SCHEMA_VERSION}); run every service of a job on the same mgrpo version"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(f"{model.__name__}: {exc}") from exc
