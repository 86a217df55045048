"""A job config resolved against its workflow: what the trainers, the services and the CLI read.

`job_spec(config)` checks the config against the workflow table (its roles, which of them call
tools or share the root's model, whether it takes a dataset or an agent program, its modes) and
returns a `JobSpec`, or raises `JobConfigError` with the field's location and what to fix (the REST
API answers it with a 422 at that location). Every rule reads the declaration; none names a workflow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mgrpo.config import (
    BUILTIN_TOOLS,
    JobConfig,
    LoraSpec,
    ModelSpec,
    OptimConfig,
    RewardConfig,
    RoleConfig,
    ToolConfig,
)
from mgrpo.workflows.base import Workflow
from mgrpo.workflows.table import get_workflow

OnStep = Callable[[int, dict[str, float]], None]


class BuildStopped(RuntimeError):
    """A warm-start build given up on because its job ended (cancelled) while it ran."""


def stop_check(stop: threading.Event | None) -> OnStep | None:
    """An `on_step` that ends a build (`BuildStopped`) at the first step after `stop` is set."""
    if stop is None:
        return None

    def check(step: int, _: dict[str, float]) -> None:
        if stop.is_set():
            raise BuildStopped(f"the warm-start build stopped at step {step}: its job ended")

    return check


class JobConfigError(ValueError):
    """A job config its workflow does not allow: `loc` is the field's path, `msg` what to fix."""

    def __init__(self, loc: tuple[str, ...], msg: str) -> None:
        super().__init__(msg)
        self.loc, self.msg = loc, msg


class Built(Protocol):
    """A finished (cached) warm start: its folder, whether it was reused, its held-out metrics."""

    folder: Path
    cached: bool
    metrics: dict[str, Any]


class WarmStart(Protocol):
    """How a workflow's preset models are made: SFT on demonstrations, cached on disk by config key.

    `config(job)`: the warm start a job's presets name (its seed, steps, presets, …); `build(config,
    cache_dir)`: make it or reuse the cached one (`on_step` after each of its `steps(config)` SFT
    steps, `on_eval` after each of its `eval_rollouts(config)` held-out rollouts); `source(job, role,
    cache_dir)`: the folder of the role's starting model (built first if needed; given up on,
    `BuildStopped`, once `stop` is set)."""

    @property
    def title(self) -> str:
        """What its progress display says it is."""
        ...

    def config(self, job: JobSpec) -> Any: ...

    def steps(self, config: Any) -> int: ...

    def eval_rollouts(self, config: Any) -> int: ...

    def build(
        self,
        config: Any,
        cache_dir: Path,
        *,
        on_step: OnStep | None = None,
        on_eval: Callable[[], None] | None = None,
    ) -> Built: ...

    def source(
        self, job: JobSpec, role: str, cache_dir: Path, *, stop: threading.Event | None = None
    ) -> str: ...

    def evaluated_on(self, config: Any, n: int) -> Any:
        """`config` with its held-out evaluation on `n` questions or problems (0 skips it)."""
        ...

    def summary(self, built: Any) -> list[str]:
        """Its held-out results, a line each (`mgrpo warmstart` prints them)."""
        ...


@dataclass(frozen=True)
class JobSpec:
    """`cfg` as its workflow reads it. `workflow`: the one the job names; `flow`: the one that runs
    (deep_research's single_agent mode runs the single-agent workflow)."""

    cfg: JobConfig
    workflow: Workflow
    flow: Workflow

    @property
    def root(self) -> str:
        return self.flow.root

    def role(self, name: str) -> RoleConfig:
        self.workflow.role(name)  # a clear error for a role the workflow does not have
        return self.cfg.roles.get(name) or RoleConfig()

    def model_of(self, role: str) -> ModelSpec:
        return self.role(role).model or ModelSpec(preset=self.workflow.role(role).preset or None, path=None)

    def optim_of(self, role: str) -> OptimConfig:
        return self.role(role).optim

    def lora_of(self, role: str) -> LoraSpec | None:
        """The adapter the role trains on its frozen model (None: it trains all the weights)."""
        return self.role(role).lora

    def tools_of(self, role: str) -> list[ToolConfig]:
        """The role's tools: its `tools`, or its workflow's built-ins for it (in the flow that runs)."""
        own = self.role(role).tools
        if own is not None:
            return own
        spec = self.flow.role(role) if role in self.flow.role_names else self.workflow.role(role)
        return [ToolConfig(name=n) for n in spec.tools if n in BUILTIN_TOOLS]

    def shares_root(self, role: str) -> bool:
        """Whether the role runs in the root's trainer (with the root's model, or its own adapter on
        the root's base: `own_adapter`) rather than a trainer of its own."""
        return self.role(role).share_model_with is not None

    def own_adapter(self, role: str) -> bool:
        """Whether a role in the root's trainer trains an adapter of its own on the root's frozen base
        (roles on one base), rather than the root's model itself."""
        return self.shares_root(role) and self.lora_of(role) is not None

    @property
    def trainer_roles(self) -> tuple[str, ...]:
        """The roles that run a trainer (own a model), root first."""
        return tuple(r for r in self.flow.role_names if not self.shares_root(r))

    @property
    def callee_trainers(self) -> tuple[str, ...]:
        """The callee roles with a trainer service of their own (every trainer role but the root)."""
        return tuple(r for r in self.trainer_roles if r != self.root)

    @property
    def root_roles(self) -> tuple[str, ...]:
        """The roles whose samples the root trainer trains: the root and every role that shares its
        model (but a hosted callee's, which trains in a job of its own: `hosted_callees`)."""
        return tuple(
            r
            for r in self.flow.role_names
            if r == self.root or (self.shares_root(r) and r not in self.hosted_callees)
        )

    @property
    def hosted_callees(self) -> tuple[str, ...]:
        """The callee roles that run their own callee job inside the root's trainer, with an adapter of
        their own on the root's base (`Workflow.hosts_callees`): no trainer service of their own."""
        if not self.flow.hosts_callees:
            return ()
        return tuple(r for r in self.flow.callees if self.shares_root(r))

    @property
    def ledger_roles(self) -> tuple[str, ...]:
        """The roles that train in a step loop of their own and mark the ledger, root first: every
        trainer role and every hosted callee (a step's records are kept until all of them are done)."""
        return (self.root, *self.callee_loops)

    @property
    def callee_loops(self) -> tuple[str, ...]:
        """The callee roles the root waits for, step by step: those with a trainer of their own and
        those hosted in its trainer."""
        return (*self.callee_trainers, *self.hosted_callees)

    @property
    def trains_callees(self) -> bool:
        """Whether the callee roles train (main_only freezes them)."""
        return self.cfg.mode == "co_train"

    def warm_start(self) -> WarmStart:
        """The warm start of the running flow's presets (a ValueError when it has none)."""
        ws: WarmStart = self.flow.load("warmstart")
        return ws

    def warmstart_config(self) -> Any:
        """The config of the warm start this job's presets name (its cache key's inputs)."""
        return self.warm_start().config(self)

    def uses_presets(self) -> bool:
        return any(self.model_of(r).preset is not None for r in self.flow.role_names)


def job_spec(cfg: JobConfig) -> JobSpec:
    """`cfg` checked against its workflow (module docstring)."""
    try:
        workflow = get_workflow(cfg.workflow)
    except ValueError as exc:
        raise JobConfigError(("workflow",), str(exc)) from None
    if cfg.mode not in workflow.modes:
        raise JobConfigError(
            ("mode",),
            f"mode: the {workflow.name} workflow takes mode {' or '.join(workflow.modes)}, not {cfg.mode}",
        )
    flow = get_workflow(workflow.single_agent) if cfg.mode == "single_agent" else workflow
    spec = JobSpec(cfg, workflow, flow)
    for check in (_roles, _tools, _inputs):
        check(spec)
    return spec


def _roles(spec: JobSpec) -> None:
    wf = spec.workflow
    for name, rc in spec.cfg.roles.items():
        if name not in wf.role_names:
            raise JobConfigError(
                ("roles", name),
                f"roles.{name}: the workflow {wf.name!r} has no role {name!r}; its roles are {', '.join(wf.role_names)}",
            )
        if rc.share_model_with is None:
            continue
        root = spec.cfg.roles.get(rc.share_model_with or "")
        if rc.lora is not None and (root is None or root.lora is None):
            raise JobConfigError(
                ("roles", name, "lora"),
                f"roles.{name}.lora: an adapter of its own on {rc.share_model_with}'s base needs that base "
                f"frozen: give roles.{rc.share_model_with}.lora too, or drop this lora to train with "
                f"{rc.share_model_with}'s model",
            )
        where = ("roles", name, "share_model_with")
        if wf.hosts_callees and rc.lora is None:
            raise JobConfigError(
                where,
                f"roles.{name}.share_model_with: in the {wf.name} workflow a callee shares the root's base "
                f"with an adapter of its own: give roles.{name}.lora and roles.{wf.root}.lora, or drop share_model_with",
            )
        if not (wf.shares_root_model or wf.hosts_callees):
            raise JobConfigError(
                where,
                f"roles.{name}.share_model_with: the {wf.name} workflow trains each role with a model of its own",
            )
        if name == wf.root or rc.share_model_with != wf.root:
            raise JobConfigError(
                where,
                f"roles.{name}.share_model_with: only a callee role can share, and only the root role's model ({wf.root!r})",
            )
    hosted = spec.hosted_callees
    for name in spec.flow.callees if hosted else ():
        if name not in hosted and spec.model_of(name).path is None:  # the warm start is one model
            raise JobConfigError(
                ("roles", name),
                f"roles.{name}: {', '.join(hosted)} train on {wf.root}'s base, whose warm start is one model "
                f"for the hosted roles: host {name} too (share_model_with: {wf.root} and a lora), or give "
                f"roles.{name}.model.path",
            )


def _tools(spec: JobSpec) -> None:
    for name, rc in spec.cfg.roles.items():
        if rc.tools is None:
            continue
        role = spec.flow.role(name) if name in spec.flow.role_names else spec.workflow.role(name)
        if not role.calls_tools:
            users = [f"{r.name}" for r in (*spec.workflow.roles, *spec.flow.roles) if r.calls_tools]
            raise JobConfigError(
                ("roles", name, "tools"),
                f"roles.{name}.tools: the {name} role of {spec.flow.name} does not call tools; the tool-using roles are "
                f"{', '.join(dict.fromkeys(users)) or 'none'}",
            )
        names = [t.name for t in rc.tools]
        if len(set(names)) != len(names):
            raise JobConfigError(
                ("roles", name, "tools"), f"roles.{name}.tools: tool names must be unique, got {names}"
            )


def _inputs(spec: JobSpec) -> None:
    wf, cfg = spec.workflow, spec.cfg
    if wf.runs_program != (cfg.program is not None):
        raise JobConfigError(
            ("program",),
            f"program: give it exactly when the workflow runs an agent program ({wf.name} "
            f"{'does' if wf.runs_program else 'does not'})",
        )
    if wf.runs_program:
        missing = [r for r in wf.role_names if (m := spec.role(r).model) is None or m.path is None]
        if missing:
            raise JobConfigError(
                ("roles", missing[0], "model"),
                f"roles.{missing[0]}.model: the {wf.name} workflow serves chat models: give every role's model.path (a folder with a chat template)",
            )
    if cfg.warmstart_guess_share and not (
        wf.warmstart
        and getattr(wf.load("warmstart").config(spec), "guess_share", None) == cfg.warmstart_guess_share
    ):
        raise JobConfigError(
            ("warmstart_guess_share",),
            f"warmstart_guess_share: the {wf.name} workflow's warm start has no flawed demonstrator (deep_research, deep_research_team and single_agent have); leave it 0",
        )
    if cfg.warmstart_planner_sees_guesses and not (
        cfg.warmstart_guess_share
        and wf.warmstart
        and getattr(wf.load("warmstart").config(spec), "planner_sees_guesses", False)
    ):
        raise JobConfigError(
            ("warmstart_planner_sees_guesses",),
            "warmstart_planner_sees_guesses: set warmstart_guess_share above 0 too (the guesses it sees)"
            if not cfg.warmstart_guess_share
            else f"warmstart_planner_sees_guesses: the {wf.name} workflow's planner learns from no sub-agent demonstrator's guesses (deep_research's does); leave it false",
        )
    if not wf.takes_dataset and (cfg.dataset is not None or cfg.reward != RewardConfig()):
        raise JobConfigError(
            ("dataset",) if cfg.dataset is not None else ("reward",),
            f"dataset, reward: the {wf.name} workflow trains on its built-in problems with its own rewards; datasets and rewards are for the workflows that take them",
        )
