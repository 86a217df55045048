"""The job config: workflows and their roles as data, the two-role fields folded into `roles`, and
errors that name the field."""

import pytest
from pydantic import ValidationError

from mgrpo.config import JobConfig


def test_roles_follow_the_workflow():
    assert JobConfig().trainer_roles == ("planner", "subagent")
    assert JobConfig(mode="single_agent").trainer_roles == ("planner",)
    assert JobConfig(workflow="deep_research_team").trainer_roles == ("planner", "searcher", "comparer")
    mars = JobConfig(workflow="marsrl")
    assert mars.trainer_roles == ("solver", "verifier", "corrector") and mars.root_roles == ("solver",)
    assert mars.model_of("verifier").preset == "tiny-wide" and mars.optim_of("corrector").lr == 1e-4
    shared = JobConfig(
        workflow="marsrl", roles={r: {"share_model_with": "solver"} for r in ("verifier", "corrector")}
    )
    assert shared.trainer_roles == ("solver",) and shared.root_roles == ("solver", "verifier", "corrector")
    assert shared.callee_trainers == () and mars.callee_trainers == ("verifier", "corrector")
    assert JobConfig(mode="single_agent").callee_trainers == () and JobConfig().callee_trainers == (
        "subagent",
    )


def test_the_two_role_fields_fold_into_roles():
    cfg = JobConfig.model_validate({"planner_optim": {"lr": 1e-3}, "subagent": {"preset": "small"}})
    assert cfg.optim_of("planner").lr == 1e-3 and cfg.model_of("subagent").preset == "small"
    assert "planner_optim" not in cfg.model_dump() and set(cfg.roles) == {"planner", "subagent"}


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"workflow": "marsrl", "roles": {"judge": {}}}, "roles.judge"),
        ({"roles": {"verifier": {}}}, "roles.verifier"),
        (
            {"workflow": "marsrl", "roles": {"solver": {"share_model_with": "verifier"}}},
            "roles.solver.share_model_with",
        ),
        (
            {"workflow": "marsrl", "roles": {"verifier": {"share_model_with": "corrector"}}},
            "roles.verifier.share_model_with",
        ),
        ({"roles": {"subagent": {"share_model_with": "planner"}}}, "roles.subagent.share_model_with"),
        ({"workflow": "marsrl", "mode": "main_only"}, "mode"),
    ],
)
def test_a_role_the_workflow_lacks_is_an_error_naming_the_field(config, field):
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        JobConfig.model_validate(config)


def test_the_json_schema_documents_every_field():
    """`mgrpo schema` / the OpenAPI document: every field of the job config and of every nested
    model says what it is."""
    schema = JobConfig.model_json_schema()
    models = {"JobConfig": schema, **schema["$defs"]}
    undocumented = [
        f"{name}.{field}"
        for name, model in models.items()
        for field, prop in model.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert not undocumented
    assert {"DatasetConfig", "RewardConfig", "ToolConfig", "ProgramConfig"} <= set(models)
