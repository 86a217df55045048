"""The shape of a workflow declaration: one `Workflow` per workflow holds everything that differs
between workflows, so the rest of the code asks the declaration and never compares names.

A declaration is data. Its roles (one root that drives rollouts, the others called by it) with their
presets and tools; what a job may ask of it (modes, a model shared with the root, a dataset, an agent
program); and its machinery, *named* as `"package.module:attr"` rather than imported: the trainer
job classes (in `planner_trainer`, `subagent_trainer`, above this package), the warm start of its
presets, the router of delegated subtasks and the demo (in `services`). Naming keeps the table cheap
to import (the controller validates jobs against it without torch) and keeps imports running one way;
`Workflow.load` resolves a name where it is used, and `tests/mgrpo/test_workflows.py` resolves every
built-in name. A plugin declares the same table through an entry point (`mgrpo.workflows.table`).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass
from typing import Any

Mode = str  # "co_train" | "main_only" | "single_agent" (mgrpo.config.JobConfig.mode)
_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
MACHINERY = ("root_job", "callee_job", "route", "warmstart", "demo")


@dataclass(frozen=True)
class RoleSpec:
    name: str
    preset: str  # the default model (a tiny preset, warm-started); "" = the job gives model.path
    tools: tuple[str, ...] = ()  # its built-in tools; "delegate": it calls the callee roles
    reward: str = ""  # what the role is rewarded for (documentation, shown by `mgrpo workflows`)
    groups: str = ""  # how its GRPO groups are formed

    @property
    def calls_tools(self) -> bool:
        """Whether the role uses tools of its own (so a job may give it `tools`)."""
        return bool(self.tools) and "delegate" not in self.tools


@dataclass(frozen=True)
class Workflow:
    """One workflow. Machinery fields hold `"package.module:attr"` names (see the module docstring).

    root_job: the root role's trainer job class (`planner_trainer.root.RootJob`'s subclasses).
    callee_job: every callee role's trainer job class (`subagent_trainer.job.CalleeJob`'s).
    route: a function (subtask text → the callee role it goes to); "" = every delegation goes to the
      one callee role.
    warmstart: the `WarmStart` (`mgrpo.workflows.spec`) that builds the roles' preset models; "" =
      none: every role's model is given by path.
    demo: the function behind `mgrpo demo --workflow <name>` (`services.demo.DemoOptions`); "" = none.
    modes: the `mode`s a job may ask for; `single_agent`: the workflow that mode runs instead.
    shares_root_model: a callee role may train with the root's model in the root's trainer
      (`roles.<r>.share_model_with`), its samples scored and trained by the root (MarsRL).
    hosts_callees: a callee role may share the root's base with an adapter of its own
      (`share_model_with` and `lora` on both) and then runs its own callee job inside the root's
      trainer: it serves its episodes there and trains on its intake from Redis as a trainer of its
      own would (deep research's sub-agents: the M-GRPO exchange unchanged).
    takes_dataset: the root's queries may come from a user dataset, scored by the job's `reward`.
    runs_program: the rollout is the job's agent program (`program`), every role a chat model by path.
    """

    name: str
    root: str
    roles: tuple[RoleSpec, ...]
    description: str = ""
    root_job: str = ""
    callee_job: str = ""
    route: str = ""
    warmstart: str = ""
    demo: str = ""
    modes: tuple[Mode, ...] = ("co_train",)
    single_agent: str = ""
    shares_root_model: bool = False
    hosts_callees: bool = False
    takes_dataset: bool = True
    runs_program: bool = False

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles)

    @property
    def callees(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles if r.name != self.root)

    def role(self, name: str) -> RoleSpec:
        for r in self.roles:
            if r.name == name:
                return r
        raise ValueError(
            f"the workflow {self.name!r} has no role {name!r}; its roles are {', '.join(self.role_names)}"
        )

    def cluster_roles(self, *, shared: bool = False) -> tuple[str, ...]:
        """The roles a local cluster runs a trainer service for, root first (`shared`: the callees
        train with the root's model, or on its base, in its service)."""
        if shared and not (self.shares_root_model or self.hosts_callees):
            raise ValueError(
                f"the {self.name} workflow trains each role with a model of its own (no --shared)"
            )
        return (self.root,) if shared else (self.root, *self.callees)

    def callee_for(self, subtask: str) -> str:
        """The callee role a delegated subtask goes to."""
        if not self.route:
            return self.callees[0]
        role: str = self.load("route")(subtask)
        return role

    def load(self, field: str) -> Any:
        """The object a machinery field names (a ValueError saying what is missing when it names none)."""
        if field not in MACHINERY:
            raise ValueError(f"{field!r} is not a machinery field: one of {', '.join(MACHINERY)}")
        ref = getattr(self, field)
        if not ref:
            raise ValueError(f"the {self.name} workflow has no {field}")
        return import_string(ref)

    def variant(self, **changes: Any) -> Workflow:
        """A copy with some fields changed: a plugin's workflow on a built-in's machinery."""
        return dataclasses.replace(self, **changes)

    def problems(self) -> list[str]:
        """What is wrong with this declaration (empty: nothing); a plugin with any is refused."""
        out = []
        if len(set(self.role_names)) != len(self.roles):
            out.append(f"role names must be unique, got {', '.join(self.role_names)}")
        if self.root not in self.role_names:
            out.append(f"the root {self.root!r} is not among its roles ({', '.join(self.role_names)})")
        bad = [r for r in self.role_names if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", r)]
        if bad:
            out.append(f"role names must be lower-case identifiers, got {', '.join(bad)}")
        for field in MACHINERY:
            ref = getattr(self, field)
            if ref and not _REF.match(ref):
                out.append(f"{field} must be 'package.module:attr', got {ref!r}")
        if not self.root_job or (self.callees and not self.callee_job):
            out.append("give root_job (and callee_job when it has callee roles)")
        if "co_train" not in self.modes or not set(self.modes) <= {"co_train", "main_only", "single_agent"}:
            out.append(
                f"modes must include co_train and be among co_train, main_only, single_agent; got {self.modes}"
            )
        if ("single_agent" in self.modes) != bool(self.single_agent):
            out.append("give single_agent (the workflow that mode runs) exactly when modes has single_agent")
        if self.shares_root_model and self.hosts_callees:
            out.append("a callee on the root's model is trained by the root or hosts its own job: not both")
        return out


def import_string(path: str) -> Any:
    """`package.module:Name` → the object."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"{path!r} is not 'package.module:Name'")
    return getattr(importlib.import_module(module), attr)
