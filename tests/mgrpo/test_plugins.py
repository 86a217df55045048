"""Workflow plugins: an installed package's `mgrpo.workflows` entry point becomes a workflow a job
can name (its presets and tools are data the config reads); a bad plugin is refused with what to fix."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from mgrpo.config import JobConfig
from mgrpo.workflows import DEEP_RESEARCH, RoleSpec, Workflow, check_plugin, get_workflow, plugins
from tests.plugin_path import plugin_dist


@pytest.fixture
def installed(tmp_path, monkeypatch):
    for p in plugin_dist(tmp_path):
        monkeypatch.syspath_prepend(str(p))
    plugins.cache_clear()
    yield
    plugins.cache_clear()
    sys.modules.pop("mgrpo_lookup", None)


def test_a_plugin_is_a_workflow_a_job_can_name(installed):
    wf = get_workflow("lookup")
    assert wf.machinery == "deep_research" and wf.root_job == "mgrpo_lookup.jobs:LookupPlannerJob"
    job = JobConfig(workflow="lookup")
    assert job.engine == "deep_research" and job.trainer_roles == ("planner", "subagent")
    assert [t.name for t in job.tools_of("subagent")] == [
        "search",
        "open",
        "calculator",
    ]  # the plugin's tools


def test_without_the_plugin_the_name_is_unknown():
    plugins.cache_clear()
    with pytest.raises(ValidationError, match=r"unknown workflow 'lookup'.*or install a plugin"):
        JobConfig(workflow="lookup")


def test_bad_plugins_are_refused():
    roles = DEEP_RESEARCH.roles
    cases = [
        ("not a workflow", "must be a mgrpo.workflows.Workflow"),
        (Workflow("marsrl", "planner", roles, engine="deep_research"), "a built-in's"),
        (Workflow("x", "planner", roles, engine="vllm"), "engine must be one of"),
        (
            Workflow(
                "x",
                "planner",
                (RoleSpec("planner", "tiny"), RoleSpec("writer", "tiny")),
                engine="deep_research",
            ),
            "has the roles planner, subagent",
        ),
    ]
    for wf, says in cases:
        with pytest.raises(ValueError, match=says):
            check_plugin(wf, "plugin x")
