"""The job config resolved against its workflow (`job_spec`): roles as data, the two-role fields
folded into `roles`, and errors that name the field."""

import pytest

from mgrpo.config import JobConfig
from mgrpo.workflows import JobConfigError, job_spec


def spec(**fields):
    return job_spec(JobConfig.model_validate(fields))


def test_roles_follow_the_workflow():
    assert spec().trainer_roles == ("planner", "subagent")
    assert spec(mode="single_agent").trainer_roles == ("planner",)
    assert spec(workflow="deep_research_team").trainer_roles == ("planner", "searcher", "comparer")
    mars = spec(workflow="marsrl")
    assert mars.trainer_roles == ("solver", "verifier", "corrector") and mars.root_roles == ("solver",)
    assert mars.model_of("verifier").preset == "tiny-wide" and mars.optim_of("corrector").lr == 1e-4
    shared = spec(
        workflow="marsrl", roles={r: {"share_model_with": "solver"} for r in ("verifier", "corrector")}
    )
    assert shared.trainer_roles == ("solver",) and shared.root_roles == ("solver", "verifier", "corrector")
    assert shared.callee_trainers == () and mars.callee_trainers == ("verifier", "corrector")
    assert spec(mode="single_agent").callee_trainers == () and spec().callee_trainers == ("subagent",)
    assert shared.hosted_callees == () and shared.ledger_roles == ("solver",)


def test_a_callee_on_the_roots_base_is_hosted_in_its_trainer():
    """deep_research's sub-agent with an adapter of its own on the planner's base: no trainer service
    of its own, trained in a loop of its own (not by the root), its ledger kept until it is done."""
    lora = {"rank": 4}
    hosted = spec(
        roles={"planner": {"lora": lora}, "subagent": {"lora": lora, "share_model_with": "planner"}}
    )
    assert hosted.trainer_roles == ("planner",) and hosted.callee_trainers == ()
    assert hosted.hosted_callees == ("subagent",) and hosted.root_roles == ("planner",)
    assert hosted.ledger_roles == ("planner", "subagent") and hosted.callee_loops == ("subagent",)
    plain = spec()
    assert plain.hosted_callees == () and plain.ledger_roles == plain.trainer_roles == ("planner", "subagent")
    team_roles = {"planner": {"lora": lora}, "comparer": {"lora": lora, "share_model_with": "planner"}}
    with pytest.raises(JobConfigError, match=r"host searcher too .* or give roles.searcher.model.path"):
        spec(workflow="deep_research_team", roles=team_roles)  # its warm start has no searcher of its own
    team_roles["searcher"] = {"model": {"path": "/models/searcher"}}
    team = spec(workflow="deep_research_team", roles=team_roles)  # a hosted comparer, a searcher service
    assert team.trainer_roles == ("planner", "searcher") and team.hosted_callees == ("comparer",)
    assert team.ledger_roles == ("planner", "searcher", "comparer")
    with pytest.raises(JobConfigError, match=r"roles.subagent.lora and roles.planner.lora"):
        spec(roles={"subagent": {"share_model_with": "planner"}})
    with pytest.raises(JobConfigError, match="needs that base frozen"):
        spec(roles={"subagent": {"lora": lora, "share_model_with": "planner"}})


def test_the_two_role_fields_fold_into_roles():
    cfg = JobConfig.model_validate({"planner_optim": {"lr": 1e-3}, "subagent": {"preset": "small"}})
    job = job_spec(cfg)
    assert job.optim_of("planner").lr == 1e-3 and job.model_of("subagent").preset == "small"
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
        ({"workflow": "lookups"}, "workflow"),
        ({"workflow": "marsrl", "dataset": {"source": "file:///x.jsonl"}}, "dataset"),
        ({"workflow": "openai_agents", "program": {"url": "http://p"}}, "roles.planner.model"),
        ({"program": {"url": "http://p"}}, "program"),
        ({"workflow": "marsrl", "roles": {"verifier": {"tools": []}}}, "roles.verifier.tools"),
        ({"workflow": "marsrl", "warmstart_guess_share": 0.3}, "warmstart_guess_share"),
        ({"warmstart_planner_sees_guesses": True}, "warmstart_planner_sees_guesses"),
        (
            {
                "workflow": "deep_research_team",
                "warmstart_guess_share": 0.3,
                "warmstart_planner_sees_guesses": True,
            },
            "warmstart_planner_sees_guesses",
        ),
    ],
)
def test_a_config_its_workflow_does_not_allow_is_an_error_naming_the_field(config, field):
    """The location (what a 422 reports) and the message both name the field."""
    with pytest.raises(JobConfigError) as err:
        job_spec(JobConfig.model_validate(config))
    assert ".".join(err.value.loc) == field and field.split(".")[0] in err.value.msg


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
