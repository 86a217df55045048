"""The typed job config: what `POST /v1/jobs` takes and what `mgrpo train --config file.yaml` reads.

One pydantic model per component, each field documented once, units in names. Bad input raises
pydantic's ValidationError naming the field path (the REST API turns it into a 422).

This module checks what a field can say by itself. What the job's workflow allows (its roles, which
of them call tools, share a model, take a dataset) is checked one layer up, against the workflow
table: `mgrpo.workflows.job_spec(config)` resolves a config into a `JobSpec` or raises a
`JobConfigError` naming the field. The config imports nothing of the workflows, so everything can
import it.
"""

from __future__ import annotations

import string
from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field, field_validator, model_validator

from mgrpo.role_config import (
    BUILTIN_TOOLS,
    LoraSpec,
    ModelSpec,
    OptimConfig,
    RoleConfig,
    StrictModel,
    ToolConfig,
)

__all__ = [  # one role's models live in mgrpo.role_config; the job's config is all here
    "BUILTIN_TOOLS",
    "DEFAULT_JUDGE_PROMPT",
    "TRACKERS",
    "DatasetConfig",
    "JobConfig",
    "LoraSpec",
    "MarsRLConfig",
    "ModelSpec",
    "OptimConfig",
    "ProgramConfig",
    "RewardConfig",
    "RoleConfig",
    "StrictModel",
    "ToolConfig",
    "TrackerConfig",
    "TrackerName",
]


class MarsRLConfig(StrictModel):
    """The MarsRL workflow's rollout (algorithm.md §9); G is `rollouts_per_query`."""

    select_k: int = Field(2, ge=1, le=64, description="Outputs of the previous agent each later agent takes.")
    selection: Literal["adaptive", "balanced", "random"] = Field(
        "adaptive",
        description="Which outputs the next agent takes (adaptive: the verifier prefers wrong solutions, the corrector reports that rightly flagged errors).",
    )
    reward: Literal["agent", "outcome"] = Field(
        "agent",
        description="agent: agent-specific rewards; outcome: every role rewarded by the final outcome (MarsRL's baseline).",
    )
    max_agent_steps: int = Field(5, ge=1, le=5, description="S → V1 → C1 → V2 → C2 at most.")
    n_ops: int = Field(2, ge=1, le=6, description="Operations per arithmetic problem.")
    calculator: bool = Field(
        True,
        description='The verifier reads each written step with a calculator\'s value of it ("12-3=8 (9)") and copies it into its report before each verdict; without it the tiny verifier learns the base rate, not the check (docs/results.md).',
    )


class DatasetConfig(StrictModel):
    """A user dataset the root role's queries come from (deep_research workflows), instead of the
    built-in world's generated questions."""

    source: str = Field(
        pattern=r"^(ds-[0-9a-f]{16}|file://\S{1,1000}|[a-z][a-z0-9+.\-]{1,15}://\S{1,1000})$",
        description="An uploaded dataset's id (`ds-…`, from POST /v1/datasets) or a URI every trainer can read: file:///shared/data.jsonl, or s3://… with fsspec and s3fs installed.",
    )
    train_split: str = Field(
        "train", pattern=r"^[A-Za-z0-9_.\-]{1,64}$", description="The split whose rows are trained on."
    )
    eval_split: str | None = Field(
        "test",
        pattern=r"^[A-Za-z0-9_.\-]{1,64}$",
        description="The held-out split evaluated (greedy) before the first step and after the last; null: no evaluation. A split the dataset lacks is a 422 at submission.",
    )
    eval_queries: int = Field(
        64, ge=1, le=10_000, description="Evaluate at most this many held-out rows (the first ones)."
    )


DEFAULT_JUDGE_PROMPT = (
    "Question: {query}\nReference answer: {reference}\nProposed answer: {answer}\n"
    "Does the proposed answer mean the same as the reference answer? Reply yes or no."
)


class RewardConfig(StrictModel):
    """How the root role's final answer is scored against a row's reference answer (`correct` of R_M)."""

    kind: Literal["exact", "normalized", "numeric", "regex", "math", "http", "judge"] = Field(
        "normalized",
        description="exact: string equality after strip; normalized: lower-case, no punctuation/articles; numeric: equal numbers (relative tolerance); regex: the reference is a regular expression the answer must fully match; math: math-verify equivalence; http: POST batches to `url`; judge: an LLM the job serves grades each answer (`judge_path`).",
    )
    url: str | None = Field(
        None,
        pattern=r"^https?://\S{1,2000}$",
        description='kind http: an endpoint taking {"items": [{"query", "answer", "reference", "metadata"}]} and returning {"rewards": [float in [0, 1]]}, one per item.',
    )
    timeout_s: float = Field(30.0, gt=0, le=600, description="kind http: timeout of one batch request.")
    retries: int = Field(
        2, ge=0, le=10, description="kind http: retries of a failed batch before its rewards count as errors."
    )
    numeric_rel_tol: float = Field(1e-6, ge=0, le=1, description="kind numeric: relative tolerance.")
    judge_path: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="kind judge: an HF causal-LM folder the root role's trainer loads (frozen) to grade answers; the reward is its p(yes) / (p(yes) + p(no)) for the first token of its reply to `judge_prompt`.",
    )
    judge_prompt: str = Field(
        DEFAULT_JUDGE_PROMPT,
        min_length=1,
        max_length=4000,
        description="kind judge: the question put to the judge (as the user turn, with a chat template), with {query}, {reference} and {answer} filled in.",
    )

    @model_validator(mode="after")
    def _url_for_http(self) -> RewardConfig:
        if (self.kind == "http") != (self.url is not None):
            raise ValueError("give 'url' exactly when kind is 'http'")
        if (self.kind == "judge") != (self.judge_path is not None):
            raise ValueError("give 'judge_path' exactly when kind is 'judge'")
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(self.judge_prompt) if f is not None}
        except ValueError as exc:
            raise ValueError(f"judge_prompt: {exc} (write a literal brace as {{{{ or }}}})") from None
        if "answer" not in fields or not fields <= {"query", "reference", "answer"}:
            raise ValueError(
                f"judge_prompt: use {{answer}} and optionally {{query}}, {{reference}}; got fields {sorted(fields)}"
            )
        return self


class ProgramConfig(StrictModel):
    """The user's agent program (workflow `openai_agents`): one run is one rollout of one query."""

    entry_point: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="A Python function `package.module:function(query, base_urls, api_key) -> answer` the cluster's operator allowed (MGRPO_ALLOWED_PROGRAMS, or an installed package's `mgrpo.programs` entry point; anything else is a 422); base_urls maps each role to its OpenAI-compatible base URL for this run.",
    )
    url: str | None = Field(
        None,
        pattern=r"^https?://\S{1,2000}$",
        description='Or an HTTP endpoint: POST {"query", "base_urls", "api_key"} → {"answer": "…"}.',
    )
    timeout_s: float = Field(300.0, gt=0, le=3600, description="One run's time limit (HTTP programs).")
    max_tokens: int = Field(
        256, ge=1, le=8192, description="A completion's token budget when the program sets none."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> ProgramConfig:
        if (self.entry_point is None) == (self.url is None):
            raise ValueError("give exactly one of 'entry_point' or 'url'")
        return self


_LEGACY = {
    "planner": ("planner", "model"),
    "subagent": ("subagent", "model"),
    "planner_optim": ("planner", "optim"),
    "subagent_optim": ("subagent", "optim"),
}


TrackerName = Literal["tensorboard", "mlflow", "wandb"]
TRACKERS: tuple[str, ...] = get_args(TrackerName)


class TrackerConfig(StrictModel):
    """One experiment tracker of a job (`mgrpo.tracking`); in a job's list, a bare name takes the
    defaults: `tracking: [tensorboard, mlflow]`."""

    name: TrackerName = Field(description="The tracker.")
    log_dir: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.\-/]{1,200}$",
        description="tensorboard: the folder under the trainer's tracking dir (MGRPO_TRACKING_DIR) the event files go to, as <log_dir>/<job id>/<role> (default: tensorboard); relative, no '..'.",
    )
    tracking_uri: str | None = Field(
        None,
        max_length=1000,
        description="mlflow: the tracking server or store; one the operator allows (MGRPO_ALLOWED_TRACKING_URIS), else a 422. Default: an SQLite store in the trainer's tracking dir.",
    )
    experiment: str = Field(
        "mgrpo",
        min_length=1,
        max_length=200,
        description="mlflow: the experiment the job's runs (one per role, named <job id>/<role>) go to.",
    )
    project: str = Field(
        "mgrpo",
        pattern=r"^[A-Za-z0-9_.\-]{1,128}$",
        description="wandb: the project the job's runs (one per role, grouped by the job's id) go to; offline unless the trainer's operator set WANDB_MODE=online and a key.",
    )

    @field_validator("log_dir")
    @classmethod
    def _under_the_tracking_dir(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("/") or ".." in v.split("/")):
            raise ValueError(f"log_dir must be a relative folder without '..', got {v!r}")
        return v

    @model_validator(mode="after")
    def _options_of_the_tracker(self) -> TrackerConfig:
        if self.name != "tensorboard" and self.log_dir is not None:
            raise ValueError(f"log_dir is an option of tensorboard, not of {self.name}")
        if self.name != "mlflow" and self.tracking_uri is not None:
            raise ValueError(f"tracking_uri is an option of mlflow, not of {self.name}")
        return self


class JobConfig(StrictModel):
    """A training job."""

    workflow: str = Field(
        "deep_research",
        max_length=64,
        pattern=r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$",
        examples=["deep_research", "deep_research_team", "marsrl", "openai_agents"],
        description="deep_research: planner → sub-agent (M-GRPO); deep_research_team: planner → searcher | comparer; marsrl: solver → verifier → corrector (MarsRL); or an installed plugin's workflow (entry point group mgrpo.workflows).",
    )
    mode: Literal["co_train", "main_only", "single_agent"] = Field(
        "co_train",
        description="deep_research only. co_train: M-GRPO on both models; main_only: sub-agent frozen; single_agent: one model with all tools.",
    )
    roles: dict[str, RoleConfig] = Field(
        default_factory=dict,
        description="Per role of the workflow (deep_research: planner, subagent; marsrl: solver, verifier, corrector): model, optim, share_model_with. Roles left out get the defaults.",
    )
    marsrl: MarsRLConfig = Field(
        default_factory=MarsRLConfig,
        description="marsrl only: how each later agent's inputs are chosen and rewarded.",
    )
    alignment: Literal["duplicate_drop", "none"] = Field(
        "duplicate_drop", description="Sub-agent trajectory alignment (algorithm.md §3)."
    )
    steps: int = Field(20, ge=1, le=1_000_000, description="Training steps.")
    prompts_per_step: int = Field(8, ge=1, le=4096, description="Queries (problems) per step.")
    rollouts_per_query: int = Field(
        8,
        ge=2,
        le=256,
        description="K: root rollouts per query (the root's group); MarsRL's G, also each later agent's group.",
    )
    subagent_slots_per_rollout: int = Field(
        4, ge=1, le=256, description="D: aligned sub-agent samples per rollout."
    )
    dataset: DatasetConfig | None = Field(
        None,
        description="Train on a user dataset's queries and reference answers (deep_research workflows); null: the built-in world's questions.",
    )
    reward: RewardConfig = Field(
        default_factory=RewardConfig,
        description="How the root's final answer is scored against the row's reference (deep_research workflows): a built-in rule or your HTTP endpoint.",
    )
    program: ProgramConfig | None = Field(
        None, description="workflow openai_agents: the agent program whose runs are the rollouts."
    )
    stage: Literal[1, 2] = Field(
        2, description="Question stage of the built-in task (1 simple, 2 multi-hop)."
    )
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="Job seed: world, warm start, question sampling, alignment draws."
    )
    run_seed: int = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description="Varies the RL run (question order, alignment draws) on the same world and warm start.",
    )
    n_people: int = Field(2000, ge=10, le=1_000_000, description="People in the built-in world.")
    warmstart_steps: int | None = Field(
        None,
        ge=0,
        le=100_000,
        description="SFT steps of the cached warm start (0: untrained presets; default: the workflow's).",
    )
    warmstart_guess_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Deep research: the share of subtasks whose demonstration (the sub-agent's; the single agent's lookups) guesses the fact instead of looking it up (a flawed demonstrator, as real ones are: SFT learns the flaw and plateaus below the task's best; RL can unlearn it). 0: every demonstration looks the fact up.",
    )
    warmstart_planner_sees_guesses: bool = Field(
        False,
        description="Deep research, with warmstart_guess_share: the planner's demonstrations get the sub-agent demonstrator's guesses where it guessed and go on from them to the answer they lead to (the whole pair learns from one flawed demonstrator, as the single agent does). False: the planner's demonstrations see the true facts.",
    )
    checkpoint_keep_every_steps: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Also keep every N-th step's checkpoint (0: only the newest two), e.g. for learning curves.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=16,
        description="Pipelining: how many policy versions a sample may lag the policy it trains (0 = synchronous, as the paper; ≥ 1: rollouts run through updates, each role's engine on its own copy of the weights).",
    )
    stale_samples: Literal["drop", "keep-with-correction"] = Field(
        "keep-with-correction",
        description="What a trainer does with a sample more than max_staleness versions old: drop it (counted), or train on it with the importance-weight correction like every stale sample.",
    )
    partner_timeout_s: float = Field(
        120.0, gt=0, le=86_400, description="Wait this long for the partner before failing the job."
    )
    tracking: list[TrackerConfig] | None = Field(
        None,
        max_length=len(TRACKERS),
        description="Experiment trackers every trainer logs its role's metrics to (tensorboard, mlflow, wandb; the installed extra pip install 'mgrpo[tracking]'), e.g. [tensorboard, mlflow]; null: the cluster's default (MGRPO_TRACKING); []: none.",
    )

    @field_validator("tracking", mode="before")
    @classmethod
    def _tracker_names(cls, v: Any) -> Any:
        """A bare tracker name in the list is that tracker with its defaults."""
        return [{"name": x} if isinstance(x, str) else x for x in v] if isinstance(v, list) else v

    @field_validator("tracking")
    @classmethod
    def _one_of_each(cls, v: list[TrackerConfig] | None) -> list[TrackerConfig] | None:
        names = [t.name for t in v or []]
        if len(set(names)) != len(names):
            raise ValueError(f"each tracker at most once, got {names}")
        return v

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "workflow": "deep_research",
                    "mode": "co_train",
                    "steps": 2,
                    "prompts_per_step": 4,
                    "rollouts_per_query": 4,
                },
                {
                    "workflow": "marsrl",
                    "steps": 2,
                    "prompts_per_step": 4,
                    "rollouts_per_query": 4,
                    "roles": {"verifier": {"optim": {"lr": 2e-4}}},
                },
                {
                    "workflow": "marsrl",
                    "steps": 2,
                    "roles": {
                        "verifier": {"share_model_with": "solver"},
                        "corrector": {"share_model_with": "solver"},
                    },
                },
            ]
        },
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_fields(cls, data: Any) -> Any:
        """`planner`, `subagent`, `planner_optim`, `subagent_optim` (the two-role config) → `roles`."""
        if not isinstance(data, dict) or not set(_LEGACY) & set(data):
            return data
        data, roles = dict(data), {k: dict(v) for k, v in (data.get("roles") or {}).items()}
        for name, (role, field) in _LEGACY.items():
            if name in data:
                roles.setdefault(role, {})[field] = data.pop(name)
        return {**data, "roles": roles}
