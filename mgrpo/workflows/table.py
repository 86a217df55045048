"""The workflow table: one declaration per built-in workflow, and the installed plugins'.

- `deep_research`: planner → sub-agent (M-GRPO); modes co_train, main_only, single_agent.
- `deep_research_team`: planner → searcher | comparer (two kinds of sub-agents).
- `marsrl`: solver → verifier → corrector (MarsRL), the callees may share the solver's model.
- `single_agent`: one model with every tool (the paper's baseline; deep_research's single_agent mode).
- `openai_agents`: the user's agent program is the rollout; every role is a chat model.

A plugin is an installed package that registers a `Workflow` under the entry point group
`mgrpo.workflows` (`[project.entry-points."mgrpo.workflows"] name = "package.module:WORKFLOW"`); it
declares the same fields, usually as a built-in's `variant` (`examples/lookup_plugin`). Adding a
workflow means one declaration here (or in a plugin) and its tests; nothing else compares names.
"""

from __future__ import annotations

import logging
from functools import cache
from importlib.metadata import entry_points

from mgrpo.workflows.base import RoleSpec, Workflow

ENTRY_POINT_GROUP = "mgrpo.workflows"
log = logging.getLogger("mgrpo.workflows")

PLANNER_JOB = "planner_trainer.job:PlannerJob"
SUBAGENT_JOB = "subagent_trainer.job:SubagentJob"
_SUBAGENT_REWARD = "format, planner outcome, expert judge (algorithm.md §2)"

DEEP_RESEARCH = Workflow(
    "deep_research",
    "planner",
    (
        RoleSpec("planner", "tiny", ("delegate",), "format 0.1 + correct 0.9 (algorithm.md §2)", "the K rollouts of one question"),
        RoleSpec("subagent", "tiny-wide", ("search", "open"), _SUBAGENT_REWARD, "the K·D aligned episodes of one question (algorithm.md §3–4)"),
    ),
    "A planner delegates one-fact subtasks to a tool-using sub-agent (M-GRPO).",
    root_job=PLANNER_JOB,
    callee_job=SUBAGENT_JOB,
    warmstart="mgrpo.workflows.deep_research_warmstart:PAIR",
    demo="services.demo:run_demo",
    modes=("co_train", "main_only", "single_agent"),
    single_agent="single_agent",
    hosts_callees=True,
)  # fmt: skip  # a table: one role per line
SINGLE_AGENT = Workflow(
    "single_agent",
    "planner",
    (RoleSpec("planner", "tiny", ("search", "open"), "format 0.1 + correct 0.9", "the K rollouts of one question"),),
    "One model with every tool (the paper's single-agent baseline).",
    root_job=PLANNER_JOB,
    warmstart="mgrpo.workflows.deep_research_warmstart:SINGLE",
)  # fmt: skip  # a table: one role per line
DEEP_RESEARCH_TEAM = Workflow(
    "deep_research_team",
    "planner",
    (
        RoleSpec("planner", "tiny", ("delegate",), "format 0.1 + correct 0.9 (algorithm.md §2)", "the K rollouts of one question"),
        RoleSpec("searcher", "tiny-wide", ("search", "open"), _SUBAGENT_REWARD, "the K·D aligned lookups of one question"),
        RoleSpec("comparer", "tiny", ("compare",), _SUBAGENT_REWARD, "the K·D aligned comparisons of one question"),
    ),
    "Deep research with two kinds of sub-agents: lookups go to a searcher, comparisons to a comparer.",
    root_job=PLANNER_JOB,
    callee_job=SUBAGENT_JOB,
    route="mgrpo.tasks.deep_research:team_role",
    warmstart="mgrpo.workflows.deep_research_warmstart:TEAM",
    hosts_callees=True,
)  # fmt: skip  # a table: one role per line
MARSRL = Workflow(
    "marsrl",
    "solver",
    (
        RoleSpec("solver", "tiny", (), "1 when its answer is right", "the G solutions of one problem"),
        RoleSpec("verifier", "tiny-wide", (), "1 when its verdict agrees with the reviewed solution's truth", "the G reports on one selected solution"),
        RoleSpec("corrector", "tiny", (), "1 when its revised answer is right", "the G revisions of one selected report"),
    ),
    "MarsRL: solver → verifier → corrector (→ verifier → corrector), agent-specific rewards.",
    root_job="planner_trainer.marsrl:MarsRootJob",
    callee_job="subagent_trainer.job:RoleJob",
    warmstart="mgrpo.workflows.marsrl_warmstart:WARMSTART",
    demo="services.demo_marsrl:run_marsrl_demo",
    shares_root_model=True,
    takes_dataset=False,
)  # fmt: skip  # a table: one role per line
_OUTCOME = "every call of the query's K runs, aligned to D per run"
OPENAI_AGENTS = Workflow(
    "openai_agents",
    "planner",
    (
        RoleSpec("planner", "", (), "the rollout's outcome (the job's reward on the program's answer)", _OUTCOME),
        RoleSpec("searcher", "", (), "the rollout's outcome", _OUTCOME),
        RoleSpec("comparer", "", (), "the rollout's outcome", _OUTCOME),
    ),
    "Your agent program (written against the OpenAI API) is the rollout; each role is a chat model behind its own /v1/chat/completions.",
    root_job="planner_trainer.program:ProgramRootJob",
    callee_job="subagent_trainer.program:ProgramCalleeJob",
    runs_program=True,
)  # fmt: skip  # a table: one role per line

WORKFLOWS: dict[str, Workflow] = {
    w.name: w for w in (DEEP_RESEARCH, DEEP_RESEARCH_TEAM, MARSRL, SINGLE_AGENT, OPENAI_AGENTS)
}


def check_plugin(wf: object, source: str) -> Workflow:
    """A plugin's workflow, or a ValueError saying what to fix."""
    if not isinstance(wf, Workflow):
        raise ValueError(
            f"{source}: the entry point must be a mgrpo.workflows.Workflow, got {type(wf).__name__}"
        )
    if wf.name in WORKFLOWS:
        raise ValueError(f"{source}: the workflow name {wf.name!r} is a built-in's; choose another")
    if wf.single_agent and wf.single_agent not in WORKFLOWS:
        raise ValueError(f"{source}: single_agent names {wf.single_agent!r}, which is no built-in workflow")
    if problems := wf.problems():
        raise ValueError(f"{source}: " + "; ".join(problems))
    return wf


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


def all_workflows() -> dict[str, Workflow]:
    """Every workflow a job can name: the built-ins, then the plugins."""
    return {**WORKFLOWS, **plugins()}
