"""The built-in workflows: `deep_research` (planner → sub-agent, M-GRPO), `deep_research_team`
(planner → searcher | comparer: two kinds of sub-agents), `marsrl` (solver →
verifier → corrector), `single_agent` (one model with every tool, the baseline)."""

from __future__ import annotations

from mgrpo.workflows.base import RoleSpec, Workflow

DEEP_RESEARCH = Workflow(
    "deep_research", "planner",
    (RoleSpec("planner", "tiny", ("delegate",), "format 0.1 + correct 0.9 (SPEC §3)", "the K rollouts of one question"),
     RoleSpec("subagent", "tiny-wide", ("search", "open"), "format, planner outcome, expert judge (SPEC §3)",
              "the K·D aligned episodes of one question (SPEC §4-5)")),
    "A planner delegates one-fact subtasks to a tool-using sub-agent (M-GRPO).",
)  # fmt: skip
SINGLE_AGENT = Workflow(
    "single_agent", "planner",
    (RoleSpec("planner", "tiny", ("search", "open"), "format 0.1 + correct 0.9", "the K rollouts of one question"),),
    "One model with every tool (the paper's single-agent baseline).",
)  # fmt: skip
MARSRL = Workflow(
    "marsrl", "solver",
    (RoleSpec("solver", "tiny", (), "1 when its answer is right", "the G solutions of one problem"),
     RoleSpec("verifier", "tiny-wide", (), "1 when its verdict agrees with the reviewed solution's truth",
              "the G reports on one selected solution"),
     RoleSpec("corrector", "tiny", (), "1 when its revised answer is right", "the G revisions of one selected report")),
    "MarsRL: solver → verifier → corrector (→ verifier → corrector), agent-specific rewards.",
)  # fmt: skip
DEEP_RESEARCH_TEAM = Workflow(
    "deep_research_team", "planner",
    (RoleSpec("planner", "tiny", ("delegate",), "format 0.1 + correct 0.9 (SPEC §3)", "the K rollouts of one question"),
     RoleSpec("searcher", "tiny-wide", ("search", "open"), "format, planner outcome, expert judge (SPEC §3)",
              "the K·D aligned lookups of one question"),
     RoleSpec("comparer", "tiny", ("compare",), "format, planner outcome, expert judge (SPEC §3)",
              "the K·D aligned comparisons of one question")),
    "Deep research with two kinds of sub-agents: lookups go to a searcher, comparisons to a comparer.",
)  # fmt: skip
WORKFLOWS: dict[str, Workflow] = {
    w.name: w for w in (DEEP_RESEARCH, DEEP_RESEARCH_TEAM, MARSRL, SINGLE_AGENT)
}


def get_workflow(name: str) -> Workflow:
    if name not in WORKFLOWS:
        raise ValueError(f"unknown workflow {name!r}; choose one of {', '.join(WORKFLOWS)}")
    return WORKFLOWS[name]


__all__ = [
    "DEEP_RESEARCH",
    "DEEP_RESEARCH_TEAM",
    "MARSRL",
    "SINGLE_AGENT",
    "WORKFLOWS",
    "RoleSpec",
    "Workflow",
    "get_workflow",
]
