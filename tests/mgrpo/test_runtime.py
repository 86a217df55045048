"""Which warm start a job names: its sub-agent's preset in every workflow and mode."""

import pytest

from mgrpo.config import JobConfig
from mgrpo.workflows import job_spec


@pytest.mark.parametrize(
    "config",
    [
        {"roles": {"subagent": {"model": {"preset": "small"}}}},
        {"mode": "single_agent", "roles": {"subagent": {"model": {"preset": "small"}}}},
        {"workflow": "deep_research_team", "roles": {"searcher": {"model": {"preset": "small"}}}},
    ],
)
def test_the_warm_start_follows_the_sub_agents_preset(config):
    ws = job_spec(JobConfig.model_validate(config)).warmstart_config()
    assert ws.subagent_preset == "small" and ws.planner_preset == "tiny"
    default = job_spec(JobConfig(mode=config.get("mode", "co_train"))).warmstart_config()
    assert default.subagent_preset == "tiny-wide"
