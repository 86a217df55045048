"""The `lookup` workflow, an example mgrpo plugin: deep research (M-GRPO's planner → sub-agent) on
one-fact questions only, with a calculator among the sub-agent's tools. It is a variant of the
deep_research declaration (its warm start, services and step assembly) with its own roles' tools,
its own root job class, and no demo."""

from mgrpo.workflows import DEEP_RESEARCH, RoleSpec

WORKFLOW = DEEP_RESEARCH.variant(
    name="lookup",
    roles=(
        RoleSpec(
            "planner", "tiny", ("delegate",), "format 0.1 + correct 0.9", "the K rollouts of one question"
        ),
        RoleSpec(
            "subagent",
            "tiny-wide",
            ("search", "open", "calculator"),
            "format, planner outcome, expert judge",
            "the K·D aligned episodes of one question",
        ),
    ),
    description="Deep research on one-fact questions (an example plugin).",
    root_job="mgrpo_lookup.jobs:LookupPlannerJob",
    demo="",
)
