"""The typed job config: what `POST /v1/jobs` takes and what `mgrpo train --config file.yaml` reads.

One pydantic model per component, each field documented once, units in names. Bad input raises
pydantic's ValidationError naming the field path (the REST API turns it into a 422).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    """One agent's model: a warm-started preset (default) or any HF causal LM folder / name."""

    preset: str | None = Field(None, description="Tiny preset to warm-start: 'tiny', 'tiny-wide' or 'small'.")
    path: str | None = Field(None, description="Load this HF folder or name with from_pretrained instead.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature of rollouts.")
    max_new_tokens_per_turn: int = Field(48, ge=1, le=4096, description="Generation budget of one turn.")
    max_context_tokens: int = Field(512, ge=16, le=65536, description="Context budget of one episode.")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.preset is None) == (self.path is None):
            raise ValueError("give exactly one of 'preset' or 'path'")
        return self


class OptimConfig(_Strict):
    """The policy update of one role (SPEC §6)."""

    lr: float = Field(
        1e-4,
        gt=0,
        le=1.0,
        description="AdamW learning rate (no weight decay: only the policy gradient moves weights).",
    )
    ppo_epochs: int = Field(1, ge=1, le=16, description="Passes over a step's batch.")
    minibatch_size: int = Field(64, ge=1, le=65536, description="Sequences per optimizer step.")
    clip_low: float = Field(0.2, ge=0, le=1, description="ε_low of the asymmetric clip.")
    clip_high: float = Field(0.28, ge=0, le=10, description="ε_high of the asymmetric clip (clip-higher).")
    loss_agg: Literal["seq-mean-token-mean", "token-mean"] = Field(
        "seq-mean-token-mean", description="Loss aggregation."
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    kl_coef: float = Field(
        0.0,
        ge=0,
        le=10,
        description="β of the k3 KL penalty to the job's starting model (0 = off, as in the paper).",
    )
    compile: bool = Field(
        False,
        description="torch.compile the model's forward for the update (fuses the norm, rotary and SwiGLU elementwise work; the first update compiles for about a minute on 2 CPU cores; rollouts stay eager).",
    )


class JobConfig(_Strict):
    """A training job."""

    mode: Literal["co_train", "main_only", "single_agent"] = Field(
        "co_train",
        description="co_train: M-GRPO on both models; main_only: sub-agent frozen; single_agent: one model with all tools.",
    )
    alignment: Literal["duplicate_drop", "none"] = Field(
        "duplicate_drop", description="Sub-agent trajectory alignment (SPEC §4)."
    )
    steps: int = Field(20, ge=1, le=1_000_000, description="Training steps.")
    prompts_per_step: int = Field(8, ge=1, le=4096, description="Queries per step.")
    rollouts_per_query: int = Field(
        8, ge=2, le=256, description="K: planner rollouts per query (the planner group)."
    )
    subagent_slots_per_rollout: int = Field(
        4, ge=1, le=256, description="D: aligned sub-agent samples per rollout."
    )
    stage: Literal[1, 2] = Field(
        2, description="Question stage of the built-in task (1 simple, 2 multi-hop)."
    )
    seed: int = Field(0, description="Job seed: world, warm start, question sampling, alignment draws.")
    run_seed: int = Field(
        0,
        ge=0,
        description="Varies the RL run (question order, alignment draws) on the same world and warm start.",
    )
    n_people: int = Field(2000, ge=10, le=1_000_000, description="People in the built-in world.")
    warmstart_steps: int = Field(
        350, ge=0, le=100_000, description="SFT steps of the cached warm start (0: untrained presets)."
    )
    planner: ModelSpec = Field(default_factory=lambda: ModelSpec(preset="tiny"))
    subagent: ModelSpec = Field(default_factory=lambda: ModelSpec(preset="tiny-wide"))
    planner_optim: OptimConfig = Field(default_factory=OptimConfig)
    subagent_optim: OptimConfig = Field(default_factory=OptimConfig)
    checkpoint_keep_every_steps: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Also keep every N-th step's checkpoint (0: only the newest two), e.g. for learning curves.",
    )
    max_staleness: int = Field(
        0, ge=0, le=16, description="Policy versions a partner may lag behind (0 = synchronous)."
    )
    partner_timeout_s: float = Field(
        120.0, gt=0, le=86_400, description="Wait this long for the partner before failing the job."
    )

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"mode": "co_train", "steps": 2, "prompts_per_step": 4, "rollouts_per_query": 4}]
        },
    )
