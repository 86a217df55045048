"""The workflow table: every built-in declaration is sound and its machinery names resolve, and what
the rest of the code asks of it (cluster roles, routing, machinery) comes from the declaration."""

from __future__ import annotations

import pytest

from mgrpo.workflows import DEEP_RESEARCH, DEEP_RESEARCH_TEAM, MARSRL, OPENAI_AGENTS, SINGLE_AGENT, WORKFLOWS
from mgrpo.workflows.base import MACHINERY


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_every_built_in_declaration_is_sound_and_its_names_resolve(name):
    """Each machinery name imports (a typo fails here, not in a job)."""
    wf = WORKFLOWS[name]
    assert not wf.problems(), wf.problems()
    for field in MACHINERY:
        if getattr(wf, field):
            assert wf.load(field) is not None, field


def test_the_table_answers_what_the_services_ask():
    assert DEEP_RESEARCH.cluster_roles() == ("planner", "subagent")
    assert MARSRL.cluster_roles() == ("solver", "verifier", "corrector")
    assert MARSRL.cluster_roles(shared=True) == ("solver",)
    assert DEEP_RESEARCH.cluster_roles(shared=True) == ("planner",)  # the sub-agent hosted on its base
    assert DEEP_RESEARCH_TEAM.cluster_roles(shared=True) == ("planner",)  # searcher and comparer hosted
    with pytest.raises(ValueError, match="model of its own"):
        SINGLE_AGENT.cluster_roles(shared=True)
    assert DEEP_RESEARCH_TEAM.callee_for("born first: A 1971, B 1968") == "comparer"
    assert DEEP_RESEARCH_TEAM.callee_for("birth year of A") == "searcher"
    assert DEEP_RESEARCH.callee_for("born first: A 1971, B 1968") == "subagent"  # the one callee
    assert MARSRL.load("callee_job").__name__ == "RoleJob"
    with pytest.raises(ValueError, match="has no warmstart"):
        OPENAI_AGENTS.load("warmstart")  # its models are given by path
    with pytest.raises(ValueError, match="not a machinery field"):
        MARSRL.load("roles")
