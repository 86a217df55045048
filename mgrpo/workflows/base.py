"""A workflow is data: its roles (one root that drives rollouts, the others called by it) and the
program by which the root's rollout calls them. One module per workflow in this package."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoleSpec:
    name: str
    preset: str  # the default model (a tiny preset, warm-started)
    tools: tuple[str, ...] = ()
    reward: str = ""  # what the role is rewarded for (documentation, shown by `mgrpo workflows`)
    groups: str = ""  # how its GRPO groups are formed


@dataclass(frozen=True)
class Workflow:
    """`engine`: the built-in workflow whose machinery (warm starts, step assembly, services) runs it
    (default: its own name). `root_job`, `callee_job`: "module:Class" of a plugin's own trainer job
    classes (subclasses of the engine's: planner_trainer.job.PlannerJob, subagent_trainer.job.SubagentJob, …);
    empty: the engine's."""

    name: str
    root: str
    roles: tuple[RoleSpec, ...]
    description: str = ""
    engine: str = ""
    root_job: str = ""
    callee_job: str = ""

    @property
    def machinery(self) -> str:
        return self.engine or self.name

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles)

    def role(self, name: str) -> RoleSpec:
        for r in self.roles:
            if r.name == name:
                return r
        raise ValueError(
            f"the workflow {self.name!r} has no role {name!r}; its roles are {', '.join(self.role_names)}"
        )

    @property
    def callees(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles if r.name != self.root)
