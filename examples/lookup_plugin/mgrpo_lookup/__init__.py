"""The `lookup` workflow, an example mgrpo plugin: deep research (M-GRPO's planner → sub-agent) on
one-fact questions only, with a calculator among the sub-agent's tools. It runs on the deep_research
engine (warm start, services, step assembly) and brings its own root job class."""

from mgrpo.workflows import RoleSpec, Workflow

WORKFLOW = Workflow(
    "lookup",
    "planner",
    (
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
    "Deep research on one-fact questions (an example plugin).",
    engine="deep_research",
    root_job="mgrpo_lookup.jobs:LookupPlannerJob",
)
