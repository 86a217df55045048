"""The built-in workflows: `deep_research` (planner → sub-agent, M-GRPO), `deep_research_team`
(planner → searcher | comparer: two kinds of sub-agents), `marsrl` (solver →
verifier → corrector), `single_agent` (one model with every tool, the baseline) — and plugins.

A plugin is an installed package that registers a `Workflow` under the entry point group
`mgrpo.workflows` (`[project.entry-points."mgrpo.workflows"] name = "package.module:WORKFLOW"`). It
runs on a built-in's machinery (`engine`: deep_research, deep_research_team or marsrl; its role names
must be that engine's), with its own presets, tools and descriptions, and its own trainer job
classes (`root_job`, `callee_job`) where it changes the step logic. `examples/lookup_plugin` is one.
"""

from __future__ import annotations

import importlib
import logging
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from mgrpo.workflows.base import RoleSpec, Workflow

ENTRY_POINT_GROUP = "mgrpo.workflows"
log = logging.getLogger("mgrpo.workflows")

DEEP_RESEARCH = Workflow(
    "deep_research",
    "planner",
    (
        RoleSpec(
            "planner",
            "tiny",
            ("delegate",),
            "format 0.1 + correct 0.9 (algorithm.md §2)",
            "the K rollouts of one question",
        ),
        RoleSpec(
            "subagent",
            "tiny-wide",
            ("search", "open"),
            "format, planner outcome, expert judge (algorithm.md §2)",
            "the K·D aligned episodes of one question (algorithm.md §3–4)",
        ),
    ),
    "A planner delegates one-fact subtasks to a tool-using sub-agent (M-GRPO).",
)
SINGLE_AGENT = Workflow(
    "single_agent",
    "planner",
    (
        RoleSpec(
            "planner",
            "tiny",
            ("search", "open"),
            "format 0.1 + correct 0.9",
            "the K rollouts of one question",
        ),
    ),
    "One model with every tool (the paper's single-agent baseline).",
)
MARSRL = Workflow(
    "marsrl",
    "solver",
    (
        RoleSpec("solver", "tiny", (), "1 when its answer is right", "the G solutions of one problem"),
        RoleSpec(
            "verifier",
            "tiny-wide",
            (),
            "1 when its verdict agrees with the reviewed solution's truth",
            "the G reports on one selected solution",
        ),
        RoleSpec(
            "corrector",
            "tiny",
            (),
            "1 when its revised answer is right",
            "the G revisions of one selected report",
        ),
    ),
    "MarsRL: solver → verifier → corrector (→ verifier → corrector), agent-specific rewards.",
)
DEEP_RESEARCH_TEAM = Workflow(
    "deep_research_team",
    "planner",
    (
        RoleSpec(
            "planner",
            "tiny",
            ("delegate",),
            "format 0.1 + correct 0.9 (algorithm.md §2)",
            "the K rollouts of one question",
        ),
        RoleSpec(
            "searcher",
            "tiny-wide",
            ("search", "open"),
            "format, planner outcome, expert judge (algorithm.md §2)",
            "the K·D aligned lookups of one question",
        ),
        RoleSpec(
            "comparer",
            "tiny",
            ("compare",),
            "format, planner outcome, expert judge (algorithm.md §2)",
            "the K·D aligned comparisons of one question",
        ),
    ),
    "Deep research with two kinds of sub-agents: lookups go to a searcher, comparisons to a comparer.",
)
OPENAI_AGENTS = Workflow(
    "openai_agents",
    "planner",
    (
        RoleSpec(
            "planner",
            "",
            (),
            "the rollout's outcome (the job's reward on the program's answer)",
            "every call of the query's K runs, aligned to D per run",
        ),
        RoleSpec(
            "searcher",
            "",
            (),
            "the rollout's outcome",
            "every call of the query's K runs, aligned to D per run",
        ),
        RoleSpec(
            "comparer",
            "",
            (),
            "the rollout's outcome",
            "every call of the query's K runs, aligned to D per run",
        ),
    ),
    "Your agent program (written against the OpenAI API) is the rollout; each role is a chat model behind its own /v1/chat/completions.",
)
WORKFLOWS: dict[str, Workflow] = {
    w.name: w for w in (DEEP_RESEARCH, DEEP_RESEARCH_TEAM, MARSRL, SINGLE_AGENT, OPENAI_AGENTS)
}


ENGINES = ("deep_research", "deep_research_team", "marsrl", "openai_agents")


def check_plugin(wf: object, source: str) -> Workflow:
    """A plugin's workflow, or a ValueError saying what to fix."""
    if not isinstance(wf, Workflow):
        raise ValueError(
            f"{source}: the entry point must be a mgrpo.workflows.Workflow, got {type(wf).__name__}"
        )
    if wf.name in WORKFLOWS:
        raise ValueError(f"{source}: the workflow name {wf.name!r} is a built-in's; choose another")
    if wf.engine not in ENGINES:
        raise ValueError(f"{source}: engine must be one of {', '.join(ENGINES)}, got {wf.engine!r}")
    engine = WORKFLOWS[wf.engine]
    if wf.role_names != engine.role_names or wf.root != engine.root:
        raise ValueError(
            f"{source}: a workflow on the {wf.engine} engine has the roles {', '.join(engine.role_names)} "
            f"(root {engine.root}), got {', '.join(wf.role_names)} (root {wf.root})"
        )
    return wf


def import_string(path: str) -> Any:
    """`package.module:Name` → the object (a plugin's job class)."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"{path!r} is not 'package.module:Name'")
    return getattr(importlib.import_module(module), attr)


@cache
def plugins() -> dict[str, Workflow]:
    """The installed plugins' workflows (a bad plugin is logged and skipped, never fatal)."""
    out: dict[str, Workflow] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            wf = check_plugin(ep.load(), f"plugin {ep.name} ({ep.value})")
        except Exception as exc:  # an import error in someone else's package
            log.warning("skipping the mgrpo workflow plugin %s: %s", ep.name, exc)
            continue
        out[wf.name] = wf
    return out


def get_workflow(name: str) -> Workflow:
    wf = WORKFLOWS.get(name) or plugins().get(name)
    if wf is None:
        known = [*WORKFLOWS, *plugins()]
        raise ValueError(f"unknown workflow {name!r}; choose one of {', '.join(known)} (or install a plugin)")
    return wf


__all__ = [
    "DEEP_RESEARCH",
    "DEEP_RESEARCH_TEAM",
    "ENTRY_POINT_GROUP",
    "MARSRL",
    "OPENAI_AGENTS",
    "SINGLE_AGENT",
    "WORKFLOWS",
    "RoleSpec",
    "Workflow",
    "get_workflow",
    "import_string",
    "plugins",
]
