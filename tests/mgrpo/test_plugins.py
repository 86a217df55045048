"""Workflow plugins: an installed package's `mgrpo.workflows` entry point declares a workflow the
same way the built-ins are declared (here as a variant of deep_research), and a job can name it with
no edit of core files; a bad declaration is refused with what to fix. (`tests/services/e2e/test_jobs.py`
trains the example plugin's job through the services.)"""

from __future__ import annotations

import sys

import pytest

from mgrpo.config import JobConfig
from mgrpo.workflows import (
    DEEP_RESEARCH,
    JobConfigError,
    RoleSpec,
    Workflow,
    check_plugin,
    get_workflow,
    job_spec,
    plugins,
)
from tests.plugin_path import plugin_dist


@pytest.fixture
def installed(tmp_path, monkeypatch):
    for p in plugin_dist(tmp_path):
        monkeypatch.syspath_prepend(str(p))
    plugins.cache_clear()
    yield
    plugins.cache_clear()
    for name in [m for m in sys.modules if m.startswith("mgrpo_lookup")]:
        sys.modules.pop(name)


def test_a_plugin_is_a_workflow_a_job_can_name(installed):
    from planner_trainer.job import PlannerJob

    wf = get_workflow("lookup")
    assert wf.root_job == "mgrpo_lookup.jobs:LookupPlannerJob" and issubclass(wf.load("root_job"), PlannerJob)
    assert wf.warmstart == DEEP_RESEARCH.warmstart and not wf.demo  # the machinery of the built-in it varies
    job = job_spec(JobConfig(workflow="lookup"))
    assert job.trainer_roles == ("planner", "subagent")
    assert [t.name for t in job.tools_of("subagent")] == [
        "search",
        "open",
        "calculator",
    ]  # the plugin's tools
    assert job_spec(JobConfig(workflow="lookup", mode="single_agent")).trainer_roles == ("planner",)


def test_without_the_plugin_the_name_is_unknown():
    plugins.cache_clear()
    with pytest.raises(JobConfigError, match=r"unknown workflow 'lookup'.*or install a plugin"):
        job_spec(JobConfig(workflow="lookup"))


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ("not a workflow", "must be a mgrpo.workflows.Workflow"),
        (DEEP_RESEARCH.variant(name="marsrl"), "a built-in's"),
        (DEEP_RESEARCH.variant(name="x", root="writer"), "root 'writer' is not among its roles"),
        (DEEP_RESEARCH.variant(name="x", root_job="planner_trainer.job.PlannerJob"), "root_job must be"),
        (
            Workflow("x", "planner", (RoleSpec("planner", "tiny"), RoleSpec("helper", "tiny"))),
            "give root_job",
        ),
        (DEEP_RESEARCH.variant(name="x", roles=(*DEEP_RESEARCH.roles, RoleSpec("Bad", ""))), "lower-case"),
        (DEEP_RESEARCH.variant(name="x", single_agent=""), "give single_agent"),
        (DEEP_RESEARCH.variant(name="x", modes=("main_only",)), "modes must include co_train"),
    ],
    ids=["type", "name", "root", "ref", "no-job", "role-name", "single-agent", "modes"],
)
def test_bad_plugins_are_refused(declared, says):
    with pytest.raises(ValueError, match=says):
        check_plugin(declared, "plugin x")
