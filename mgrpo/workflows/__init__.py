"""The workflows: the table of declarations (`table`), a job resolved against its workflow (`spec`),
and each workflow's step assembly and programs as pure functions (`deep_research`, `marsrl`,
`openai_agents`) with their warm starts (`deep_research_warmstart`, `marsrl_warmstart`)."""

from mgrpo.workflows.base import RoleSpec, Workflow, import_string
from mgrpo.workflows.spec import JobConfigError, JobSpec, WarmStart, job_spec
from mgrpo.workflows.table import (
    DEEP_RESEARCH,
    DEEP_RESEARCH_TEAM,
    ENTRY_POINT_GROUP,
    MARSRL,
    OPENAI_AGENTS,
    SINGLE_AGENT,
    WORKFLOWS,
    all_workflows,
    check_plugin,
    get_workflow,
    plugins,
)

__all__ = [
    "DEEP_RESEARCH",
    "DEEP_RESEARCH_TEAM",
    "ENTRY_POINT_GROUP",
    "MARSRL",
    "OPENAI_AGENTS",
    "SINGLE_AGENT",
    "WORKFLOWS",
    "JobConfigError",
    "JobSpec",
    "RoleSpec",
    "WarmStart",
    "Workflow",
    "all_workflows",
    "check_plugin",
    "get_workflow",
    "import_string",
    "job_spec",
    "plugins",
]
