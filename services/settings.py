"""Service settings from the environment (pydantic-settings): `Settings()` reads them once, where a
service is started (`mgrpo serve`), and the service's factory takes them (`create_app(…, settings)`).

The same names are used by the compose file and the Helm values: `REDIS_URL`, `MGRPO_API_TOKEN`,
`MGRPO_SUBAGENT_URL`, `MGRPO_ROLE`, `MGRPO_ROLE_URLS`, `MGRPO_CHECKPOINT_DIR`, `MGRPO_CACHE_DIR`, `MGRPO_CONSUMER_NAME`, …
"""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mgrpo.config import TrackerName
from mgrpo.parallel.backends import BackendName, backend, pipelining


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MGRPO_", extra="ignore")

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", validation_alias="REDIS_URL", description="The one Redis."
    )
    api_token: str = Field(
        "",
        description="The admin scope's bearer token: jobs, datasets, generation ('' turns auth off, local use only).",
    )
    read_token: str = Field(
        "",
        description="The read scope's bearer token: GETs of jobs, metrics, datasets and policies ('' = none).",
    )
    service_token: str = Field(
        "",
        description="The service scope's bearer token: trainer-to-trainer calls, e.g. POST /v1/episodes ('' = the admin token, single-token mode).",
    )
    open_reads: bool = Field(False, description="Serve the read scope's GETs without a token (local use).")
    subagent_url: str = Field(
        "http://127.0.0.1:8002", description="Where the planner reaches the sub-agent service."
    )
    role: str = Field(
        "",
        pattern=r"^([a-z][a-z0-9_]{0,31})?$",
        description="The workflow role this trainer service serves and trains ('' = the service kind: planner or subagent); e.g. solver, verifier, corrector.",
    )
    role_urls: dict[str, str] = Field(
        default_factory=dict,
        description='Where the root trainer reaches each callee role\'s service, as JSON: {"verifier": "http://…", "corrector": "http://…"} (the sub-agent falls back to MGRPO_SUBAGENT_URL).',
    )
    checkpoint_dir: Path = Field(Path("checkpoints"), description="This service's checkpoint volume.")
    cache_dir: Path = Field(Path(".cache/mgrpo"), description="Warm-start cache.")
    consumer_name: str = Field(
        default_factory=socket.gethostname, description="Stable name of this stream consumer."
    )
    redis_wait_s: float = Field(30.0, description="How long to wait for Redis at start-up.")
    http_timeout_s: float = Field(120.0, description="Timeout of one service-to-service request.")
    run_worker: bool = Field(
        True, description="Take jobs from the dispatch stream (false: an API-only replica)."
    )
    ranks: int = Field(
        1,
        ge=1,
        le=1024,
        description="The ranks this trainer service trains its role on per machine (torchrun, FSDP2; `serve --ranks`); 1 = one process.",
    )
    backend: BackendName = Field(
        "fsdp",
        description="How a role on W > 1 ranks holds its model: fsdp (FSDP2, data parallel) or megatron (megatron-core, tensor parallel over W / MGRPO_PIPELINE_STAGES ranks on each pipeline stage; a Qwen3-MoE model's experts over all W ranks).",
    )
    pipeline_stages: int = Field(
        1,
        ge=1,
        le=1024,
        description="With MGRPO_BACKEND=megatron: the pipeline stages P the model's layers are split over (megatron-core's 1F1B schedule); it must divide W, and P must divide the model's layers.",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=1024,
        description="The machines (pods) the role's ranks span, each running `serve` with MGRPO_RANKS ranks: W = nodes × ranks; node 0 serves.",
    )
    node_rank: int = Field(
        0,
        ge=0,
        description="This machine's index among the role's nodes (0 runs the service, the others train).",
    )
    rendezvous: str = Field(
        "",
        pattern=r"^([A-Za-z0-9.\-]+:\d{1,5})?$",
        description="host:port of node 0, where a role's nodes meet (torchrun's static rendezvous); required when MGRPO_NODES > 1.",
    )
    sglang_url: str = Field(
        "",
        description="The SGLang server this trainer rolls out with, or several comma-separated (its replicas: prompts routed by prefix, else to the least loaded); each must read the checkpoint volume (every new policy is pushed with update_weights_from_disk, unless sglang_sync_host is set); '' = the in-process hf engine.",
    )
    sglang_sync_host: str = Field(
        "",
        pattern=r"^[A-Za-z0-9.\-]*$",
        description="The address the SGLang servers reach this trainer at: every new policy then goes to them by torch.distributed broadcast (NCCL on GPUs; SGLang's update_weights_from_distributed) after each update, not from the checkpoint volume; '' = from disk.",
    )
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|auto|cuda(:\d+)?)$",
        description="Where a trainer keeps its model, rolls out and trains: cpu, cuda, cuda:N, or auto (cuda when torch sees a GPU).",
    )

    allowed_programs: list[str] = Field(
        default_factory=list,
        description='The agent programs (program.entry_point, module:function) jobs may run in the root trainer, as JSON: ["my_pkg.agent:run"]; besides those installed packages declare under the mgrpo.programs entry points. Nothing else a job names is imported.',
    )
    trace_dir: Path | None = Field(
        None,
        description="Write this service's OpenTelemetry spans (rollouts, delegations and the callees' episodes in one trace, rewards, updates) as JSON lines to <dir>/<service>-<pid>.jsonl; unset: no tracing.",
    )
    otlp_endpoint: str = Field(
        "",
        max_length=1000,
        description="Send this service's OpenTelemetry spans to this collector over OTLP/HTTP (e.g. http://otel-collector:4318; spans go to its /v1/traces); '' = not.",
    )
    tracking_dir: Path = Field(
        Path("runs/tracking"),
        description="Where this trainer's experiment trackers write: tensorboard/<job id>/<role> event files and the default MLflow store (mlflow.db); give every trainer of a cluster the same shared folder to see their roles side by side.",
    )
    tracking: list[TrackerName] = Field(
        default_factory=list,
        description='The trackers of a job whose config names none (its `tracking` is null), as JSON: ["tensorboard"].',
    )
    allowed_tracking_uris: list[str] = Field(
        default_factory=list,
        description='The MLflow tracking URIs a job may name (tracking: [{name: mlflow, tracking_uri: …}]), as JSON: ["http://mlflow:5000"]; any other is a 422. The default store in MGRPO_TRACKING_DIR needs no entry.',
    )
    public_url: str = Field(
        "",
        description="This service's URL as other processes reach it (the openai_agents root hands its own role's base URL to the agent program).",
    )
    max_dataset_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="Largest dataset file POST /v1/datasets takes (413 beyond it)."
    )
    max_job_rollouts: int = Field(
        2_000_000,
        ge=1,
        description="Largest job POST /v1/jobs takes: steps × prompts_per_step × rollouts_per_query (422 beyond it).",
    )

    max_context_tokens: int = Field(
        65536,
        ge=16,
        description="Largest context a job's role may have (roles.<role>.model.max_context_tokens; 422 beyond it).",
    )
    max_generate_prompt_tokens: int = Field(
        1024, ge=1, description="Longest prompt POST /v1/generate takes, in tokens (422 beyond it)."
    )
    max_generate_new_tokens: int = Field(
        512, ge=1, description="Most new tokens one POST /v1/generate may ask for (422 beyond it)."
    )
    job_retention_s: float = Field(
        14 * 24 * 3600.0,
        gt=0,
        description="How long a finished job's records stay in Redis (its keys expire then; a resumed job keeps them again).",
    )
    queue_timeout_s: float = Field(
        300.0,
        gt=0,
        description="How long a queued job waits for a trainer of each of its roles (a service that beat within 30 s) before it fails with the missing roles named.",
    )
    shutdown_grace_s: int = Field(
        1, ge=0, description="Seconds a stopping service lets in-flight requests finish after SIGTERM."
    )

    @model_validator(mode="after")
    def _nodes_meet(self) -> Settings:
        if self.nodes > 1 and not self.rendezvous:
            raise ValueError(
                "MGRPO_NODES > 1 needs MGRPO_RENDEZVOUS, node 0's host:port (e.g. planner-0.planner-ranks:29500)"
            )
        spec = backend(self.backend)
        if self.nodes * self.ranks < spec.min_ranks:
            raise ValueError(
                f"MGRPO_BACKEND={self.backend} splits the model over the role's ranks: give it MGRPO_RANKS (or MGRPO_NODES) of {spec.min_ranks} or more; one process trains the HF model itself"
            )
        if self.pipeline_stages > 1 and not spec.pipelines:
            raise ValueError(
                f"MGRPO_PIPELINE_STAGES > 1 needs MGRPO_BACKEND={' or '.join(pipelining())} ({self.backend} splits the batch, not the layers)"
            )
        if (self.nodes * self.ranks) % self.pipeline_stages:
            raise ValueError(
                f"MGRPO_PIPELINE_STAGES {self.pipeline_stages} must divide the role's ranks, MGRPO_NODES × MGRPO_RANKS = {self.nodes * self.ranks}"
            )
        if self.node_rank >= self.nodes:
            raise ValueError(f"MGRPO_NODE_RANK {self.node_rank} is not below MGRPO_NODES {self.nodes}")
        return self

    @property
    def service_credential(self) -> str:
        """The bearer token a trainer sends to another trainer."""
        return self.service_token or self.api_token

    def callee_url(self, role: str) -> str | None:
        return self.role_urls.get(role) or (self.subagent_url if role == "subagent" else None)
