"""One role's part of the job config (`roles.<role>` in `mgrpo.config.JobConfig`): its model, its
update, its tools, its LoRA adapter, or the role whose model it shares. `mgrpo.config` re-exports every
name here; import them from there."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mgrpo.presets import PRESETS


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN / Infinity: a 422, never trained on


class ModelSpec(StrictModel):
    """One agent's model: a warm-started preset (default) or any HF causal LM folder / name."""

    preset: str | None = Field(
        None, max_length=32, description="Tiny preset to warm-start: 'tiny', 'tiny-wide' or 'small'."
    )
    path: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="Load this HF folder or name with from_pretrained instead.",
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature of rollouts.")
    max_new_tokens_per_turn: int = Field(48, ge=1, le=4096, description="Generation budget of one turn.")
    max_context_tokens: int = Field(512, ge=16, le=65536, description="Context budget of one episode.")
    tool_parser: str = Field(
        "hermes",
        pattern=r"^[a-z][a-z0-9_.\-]{0,31}$",
        description="Chat models (a tokenizer with a chat template): the tool-call format of the model family (hermes: Qwen/Hermes <tool_call>{json}</tool_call>; others via mgrpo.agents.chat.register_tool_parser).",
    )
    keep_thinking: bool = Field(
        False,
        description="Chat models: keep <think>…</think> in the role's answer (it always stays in the trained tokens).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.preset is None) == (self.path is None):
            raise ValueError("give exactly one of 'preset' or 'path'")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(
                f"unknown preset {self.preset!r}; presets: {', '.join(PRESETS)} (or give a 'path')"
            )
        return self


class OptimConfig(StrictModel):
    """The policy update of one role (algorithm.md §5)."""

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
    is_cap: float = Field(
        2.0,
        gt=0,
        le=100,
        description="C of the truncated importance weight min(exp(logp_prox − logp_old), C) on samples from an older policy version (max_staleness > 0).",
    )
    microbatch_tokens: int = Field(
        0,
        ge=0,
        le=16_777_216,
        description="Padded tokens per forward/backward of the update: each minibatch is sorted by length and cut into micro-batches of at most this many (rows × longest row; a longer row alone), their gradients accumulated into the one-batch gradient, so short rows are not padded to the longest and a GPU holds one micro-batch's activations; with pipeline stages (MGRPO_PIPELINE_STAGES) the micro-batches are what the stages overlap on. 0 = the whole minibatch in one forward.",
    )
    shared_prefix: bool = Field(
        True,
        description="Run each prompt shared by several rows of a micro-batch (a group's K rollouts) through the update's forward once, its K/V handed to every row, so only the rows' own tokens are computed per row (mgrpo/shared_prefix.py; the same log-probs and gradient to float tolerance). Taken by a plain Hugging Face model in one process; not with `compile`, W > 1 ranks or the megatron backend, which compute whole rows.",
    )
    compile: bool = Field(
        False,
        description="torch.compile the model's forward for the update (fuses the norm, rotary and SwiGLU elementwise work; the first update compiles for about a minute on 2 CPU cores; rollouts stay eager).",
    )


BUILTIN_TOOLS = ("search", "open", "compare", "calculator")


class ToolConfig(StrictModel):
    """One tool of a role: the model calls it as `<tool_call>name argument</tool_call>` (mgrpo/tools.py)."""

    name: str = Field(
        pattern=r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$",
        description="What the model writes. A built-in's name (search, open, compare, calculator), or your HTTP / MCP tool's name (for MCP: the tool's name on the server).",
    )
    kind: Literal["builtin", "http", "mcp"] = Field(
        "builtin",
        description='builtin; http: POST {"name", "argument"} to url, answer {"result": "…"}; mcp: call the tool on the MCP server at url (streamable HTTP).',
    )
    url: str | None = Field(
        None, pattern=r"^https?://\S{1,2000}$", description="http / mcp: where the tool is."
    )
    timeout_s: float = Field(10.0, gt=0, le=600, description="http / mcp: one call's timeout.")
    retries: int = Field(
        1, ge=0, le=10, description="http / mcp: retries before the call becomes a tool-error turn."
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> ToolConfig:
        if self.kind == "builtin" and self.name not in BUILTIN_TOOLS:
            raise ValueError(
                f"no built-in tool {self.name!r}; built-ins: {', '.join(BUILTIN_TOOLS)} (or give kind http / mcp and a url)"
            )
        if (self.kind == "builtin") == (self.url is not None):
            raise ValueError("give 'url' exactly for kind http or mcp")
        return self


class LoraSpec(StrictModel):
    """A LoRA adapter the role trains on its frozen base model (mgrpo/lora.py, with peft)."""

    rank: int = Field(8, ge=1, le=1024, description="r: the rank of each adapted layer's update B·A.")
    alpha: float = Field(
        16.0, gt=0, le=65536, description="lora_alpha: the update is scaled by alpha / rank."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="lora_dropout on the adapter's input while training.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="The layers adapted: 'all-linear' (every linear layer but the output head), or module names such as [q_proj, v_proj] (a name matches a module whose name ends with it).",
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list) and not (
            0 < len(v) <= 64
            and all(n and len(n) <= 128 and n.replace("_", "").replace(".", "").isalnum() for n in v)
        ):
            raise ValueError("give 1 to 64 module names of letters, digits, '_' and '.', or 'all-linear'")
        return v


class RoleConfig(StrictModel):
    """One role of the job's workflow: its model, its update, or the role whose model it shares."""

    model: ModelSpec | None = Field(
        None, description="The role's model (default: the workflow's preset for it, warm-started)."
    )
    optim: OptimConfig = Field(
        default_factory=OptimConfig,
        description="The role's update: learning rate, PPO clip, minibatches, staleness correction.",
    )
    tools: list[ToolConfig] | None = Field(
        None,
        max_length=32,
        description="The role's tools (tool-using roles: deep_research's subagent, searcher, comparer; the planner in single_agent mode); null: the workflow's built-ins for the role.",
    )
    share_model_with: str | None = Field(
        None,
        description="Train this role in the root role's trainer instead of a trainer service of its own: MarsRL: with the root's model (one policy for every role), or with a `lora` of its own (and one on the root) its own adapter on the root's frozen base; deep_research and deep_research_team: with a `lora` on both, the sub-agent's adapter on the planner's base, its own callee job hosted in the planner's process (roles on one base; the team's searcher and comparer both, or the one not hosted given a `model.path`).",
    )
    lora: LoraSpec | None = Field(
        None,
        description="Train a LoRA adapter (peft) on the role's model, frozen, instead of all its weights: in one process or on fsdp ranks; rollout servers take each checkpoint's adapter folder; checkpoints are peft adapter folders.",
    )
